"""The board install script, run as root into a root folder from a wheelhouse built for this machine.

``make dist`` builds wheelhouses for arm64 boards; here the same code (``streamfl.deploy.dist``)
builds one for this machine (x86-64, this Python) from the wheels of the versions installed here,
found in the field lab's download cache or downloaded once, and ``install_board.sh --root DIR``
installs from it with pip cut off from any index (``--no-index``, and ``PIP_INDEX_URL`` pointing at
a closed loopback port). torch is left out of the wheelhouse, as on a Jetson, and reached as a
system-wide torch is (``--system-site-packages``): the user site of the venv's base interpreter
(``PYTHONUSERBASE``) holds a ``.pth`` naming the field lab's torch layer, links to this
interpreter's torch (field/install.py).
"""
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import host_wheelhouse
from host_wheelhouse import NO_INDEX, house, torch_base  # noqa: F401 (fixtures)
from source_tree import ROOT
from streamfl.deploy import INSTALL_SCRIPT

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="the install script runs as root")]

UNIT_FILES = {"etc/systemd/system/streamfl-agent.service": "streamfl-agent.service",
              "etc/tmpfiles.d/streamfl-sysfs.conf": "streamfl-sysfs.conf",
              "etc/udev/rules.d/70-streamfl-dvfs.rules": "70-streamfl-dvfs.rules",
              "etc/sysusers.d/streamfl.conf": "streamfl.sysusers.conf"}


_clean_env = host_wheelhouse.clean_env


def _kit(folder: Path, root: Path) -> Path:
    folder.mkdir()
    # A kit names its files by their /etc/streamfl/ paths; --check-config opens them, and under
    # --root they lie inside the root folder.
    (folder / "agent.yaml").write_text(
        "device_id: board-07\nmqtt:\n  host: 127.0.0.1\n  port: 8883\n  username: board-07\n"
        "  password_file: {0}/etc/streamfl/mqtt-password\n  tls_ca: {0}/etc/streamfl/ca.crt\n"
        "  tls_cert: {0}/etc/streamfl/board-07.crt\n  tls_key: {0}/etc/streamfl/board-07.key\n".format(root))
    for name, text in (("mqtt-password", "secret\n"), ("ca.crt", "CA\n"), ("board-07.crt", "CERT\n"),
                       ("board-07.key", "KEY\n"), ("coordinator.pub", "ed25519:x\n"),
                       ("README.txt", "how to\n"), (INSTALL_SCRIPT, "#!/bin/sh\n")):
        (folder / name).write_text(text)
    return folder


def _install(house: Path, *args, env=None, user=None, script=None):
    """Run the script (the wheelhouse's own, unless named) on ``house``; as ``user`` (a uid) it
    is read from stdin, which the test's root-only temporary folders leave readable."""
    script = script or house / INSTALL_SCRIPT
    argv = ["sh", str(script), "--wheelhouse", str(house), "--python", sys.executable] + list(args)
    stdin = None
    if user is not None:
        argv = ["setpriv", "--reuid=%d" % user, "--regid=%d" % user, "--clear-groups", "sh", "-s", "--"] + argv[2:]
        stdin = open(str(script))
    try:
        return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=stdin,
                              universal_newlines=True, env=env or _clean_env(PIP_INDEX_URL=NO_INDEX),
                              cwd="/", timeout=240)
    finally:
        if stdin is not None:
            stdin.close()


def _owner_mode(path: Path):
    st = path.stat()
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def test_install_into_a_root_then_again(tmp_path, house, torch_base):
    root = tmp_path / "root"
    root.mkdir()
    kit = _kit(tmp_path / "kit", root)
    env = _clean_env(PIP_INDEX_URL=NO_INDEX, PYTHONUSERBASE=str(torch_base))
    done = _install(house, "--root", str(root), "--kit", str(kit), "--system-site-packages", "--no-enable", env=env)
    assert done.returncode == 0, done.stdout
    assert "created system user and group streamfl" in done.stdout
    assert "from the system's packages" in done.stdout  # torch, as on a Jetson

    user = [ln.split(":") for ln in (root / "etc/passwd").read_text().splitlines() if ln.startswith("streamfl:")]
    assert len(user) == 1 and user[0][5] == "/var/lib/streamfl-agent", user
    uid, gid = int(user[0][2]), int(user[0][3])
    assert _owner_mode(root / "var/lib/streamfl-agent") == (uid, gid, 0o750)
    assert _owner_mode(root / "etc/streamfl") == (0, gid, 0o750)
    modes = {p.name: _owner_mode(p) for p in (root / "etc/streamfl").iterdir()}
    assert modes == {"agent.yaml": (0, gid, 0o640), "mqtt-password": (0, gid, 0o640),
                     "board-07.key": (0, gid, 0o640), "ca.crt": (0, gid, 0o644),
                     "board-07.crt": (0, gid, 0o644), "coordinator.pub": (0, gid, 0o644)}
    for dest, name in UNIT_FILES.items():
        assert (root / dest).read_bytes() == (ROOT / "systemd" / name).read_bytes(), dest
        assert _owner_mode(root / dest)[2] == 0o644
    # The unit's ExecStart is the link, which leads (inside the root) into the venv.
    unit = (root / "etc/systemd/system/streamfl-agent.service").read_text()
    exec_start = [ln.split("=", 1)[1].split()[0] for ln in unit.splitlines() if ln.startswith("ExecStart=")]
    assert exec_start == ["/usr/local/bin/streamfl-agent"]
    target = os.readlink(str(root / "usr/local/bin/streamfl-agent"))
    assert target == "/opt/streamfl/venv/bin/streamfl-agent" and (root / target.lstrip("/")).is_file()

    venv = root / "opt/streamfl/venv"
    where = subprocess.run([str(venv / "bin/python"), "-c", "import streamfl, torch; print(streamfl.__file__)"],
                           stdout=subprocess.PIPE, universal_newlines=True, env=env, cwd=str(tmp_path), check=True)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout  # the wheel, not the checkout
    check = subprocess.run([str(venv / "bin/streamfl-agent"), "--check-config", "--config",
                            str(root / "etc/streamfl/agent.yaml")], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, universal_newlines=True, env=env, cwd=str(tmp_path))
    assert check.returncode == 0 and "device_id: board-07" in check.stdout, check.stdout

    # Again, without the kit and with enabling: an upgrade that keeps the configuration and state.
    (root / "etc/streamfl/local.yaml").write_text("mine\n")
    (root / "var/lib/streamfl-agent/checkpoint.safetensors").write_text("state\n")
    again = _install(house, "--root", str(root), "--system-site-packages", env=env)
    assert again.returncode == 0, again.stdout
    assert "upgrading in place" in again.stdout and "user streamfl exists" in again.stdout
    assert (root / "etc/streamfl/local.yaml").read_text() == "mine\n"
    assert (root / "var/lib/streamfl-agent/checkpoint.safetensors").read_text() == "state\n"
    assert (root / "etc/streamfl/agent.yaml").read_text() == (kit / "agent.yaml").read_text()
    assert _owner_mode(root / "var/lib/streamfl-agent") == (uid, gid, 0o750)
    if shutil.which("systemctl"):
        wants = root / "etc/systemd/system/multi-user.target.wants/streamfl-agent.service"
        assert os.readlink(str(wants)) == "/etc/systemd/system/streamfl-agent.service", again.stdout
    else:
        assert "skipped enabling: no systemctl" in again.stdout


def test_a_jetson_wheelhouse_without_torch_says_where_torch_comes_from(tmp_path, house):
    root = tmp_path / "root"
    root.mkdir()
    done = _install(house, "--root", str(root), "--no-enable")  # no torch wheel, no system torch
    assert done.returncode == 2, done.stdout
    assert "leaves torch out" in done.stdout and "--system-site-packages" in done.stdout, done.stdout


def _copy_of(house: Path, dest: Path) -> Path:
    dest.mkdir()
    for f in house.iterdir():
        os.symlink(str(f), str(dest / f.name))
    return dest


def test_clear_errors(tmp_path, house):
    root = tmp_path / "root"
    root.mkdir()
    missing = _install(tmp_path / "nowhere", "--root", str(root), script=house / INSTALL_SCRIPT)
    assert missing.returncode == 2 and "no wheelhouse at" in missing.stdout, missing.stdout
    assert not (root / "opt").exists()

    other = _copy_of(house, tmp_path / "py37")
    info = json.loads((house / "target.json").read_text())
    (other / "target.json").unlink()
    (other / "target.json").write_text(json.dumps(dict(info, python="3.7")))
    wrong = _install(other, "--root", str(root))
    assert wrong.returncode == 2 and "is for Python 3.7" in wrong.stdout, wrong.stdout

    damaged = _copy_of(house, tmp_path / "damaged")
    name = next(f["name"] for f in info["files"] if f["name"].startswith("numpy-"))
    (damaged / name).unlink()
    (damaged / name).write_bytes(b"cut short")
    bad = _install(damaged, "--root", str(root))
    assert bad.returncode == 2 and "%s in the wheelhouse is damaged" % name in bad.stdout, bad.stdout
    assert not (root / "opt").exists()

    if shutil.which("setpriv"):
        nobody = _install(house, "--root", str(root), user=65534)
        assert nobody.returncode == 2 and "run it as root" in nobody.stdout, nobody.stdout
