"""The README's "A real fleet in four commands", run as written from a clean clone: the commands are
parsed out of README.md itself (so the test fails when the README drifts), then, in a ``git
clone`` of this repository: ``streamfl provision`` on a fleet file of one board (a tiny model, a
free loopback port), the broker on the generated config, the coordinator on the generated YAML,
and the board: the kit is installed by its own install script into a root folder (``--root``,
``--no-enable``; no systemd runs here) from a wheelhouse ``make dist``'s code builds for this
machine (tests/host_wheelhouse.py; torch reached as a system-wide one, as on a Jetson), with pip
cut off from any index, and the installed agent runs. It passes when the coordinator aggregates an
update of the board.

The repository's .venv runs the server side, as the README's ``.venv/bin/`` says. As root,
mosquitto drops to the ``mosquitto`` user, so the clone goes into a folder others may enter.
"""
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

import host_wheelhouse
from host_wheelhouse import house, torch_base  # noqa: F401 (fixtures)

from streamfl.coordinator.metrics import read_metrics
from streamfl.sim.brokers import free_port, wait_port

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
SECTION = "## A real fleet in four commands"

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.skipif(not Path(MOSQUITTO).exists() or not shutil.which("git"),
                                 reason="needs mosquitto and git"),
              pytest.mark.skipif(os.geteuid() != 0, reason="the kit's install script runs as root")]


def readme_commands(text: str) -> Dict[str, List[str]]:
    """The four commands of the README's real-fleet section, by role, as argument lists."""
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start:end if end > 0 else len(text)]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "the section %r has no sh block" % SECTION
    lines = [line.strip() for line in block.group(1).replace("\\\n", " ").splitlines()]
    commands = [shlex.split(line, comments=True) for line in lines if line and not line.startswith("#")]
    roles = {}
    for argv in commands:
        joined = " ".join(argv)
        role = ("provision" if "provision" in argv else "broker" if Path(argv[0]).name == "mosquitto"
                else "coordinator" if argv[0].endswith("streamfl-coordinator")
                else "install" if any(a.endswith("install_board.sh") for a in argv) else None)
        assert role and role not in roles, "unexpected command in the README's section: %s" % joined
        roles[role] = argv
    assert sorted(roles) == ["broker", "coordinator", "install", "provision"], roles
    return roles


def _local(argv: List[str]) -> List[str]:
    """The README's ``.venv/bin/X`` as this repository's venv (the clone has none)."""
    head = argv[0]
    if head.startswith(".venv/bin/"):
        head = str(VENV_BIN / head[len(".venv/bin/"):])
    elif head == "mosquitto":
        head = MOSQUITTO
    return [head] + argv[1:]


def _option(argv: List[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.fixture
def folder(open_folder):
    return open_folder


def _spawn(argv: List[str], cwd: Path, log: Path, env=None) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(argv, cwd=str(cwd), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)


def test_the_readme_real_fleet_commands_run_from_a_clean_clone(folder, house, torch_base):
    clone = folder / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=60)
    commands = readme_commands((clone / "README.md").read_text())
    provision, broker, coordinator, install = (commands[k] for k in
                                               ("provision", "broker", "coordinator", "install"))
    kit_arg = _option(install, "--kit")
    board = Path(kit_arg).name
    out = _option(provision, "--out")
    fleet_file = clone / provision[provision.index("provision") + 1]
    port = free_port("127.0.0.1")
    model = {"name": "mlp", "in_channels": 3, "window_len": 8, "num_classes": 4, "hidden": 16}
    fleet_file.write_text(yaml.safe_dump({
        "fleet": "readme", "broker": {"hosts": ["127.0.0.1"], "port": port, "bind": "127.0.0.1"},
        "boards": [{"id": board, "kind": "raspberry-pi-5"}], "model": model,
        "agent": {"sensor": {"kind": "synthetic", "windows_per_s": 100.0, "window_len": 8,
                             "stride": 4, "channels": 3, "num_classes": 4, "schedule": "all"},
                  "dvfs": {"backend": "none"}, "buffer_capacity": 64, "min_buffer": 16,
                  "round_interval_s": 0.5, "telemetry_interval_s": 1.0,
                  "mqtt": {"reconnect_min_s": 0.2, "reconnect_max_s": 1.0}},
        "coordinator": {"hparams": {"lr": 0.05, "batch_size": 8, "local_steps": 2},
                        "persist_interval_s": 0.2, "monitor": {"port": 0},
                        "mqtt": {"reconnect_min_s": 0.2, "reconnect_max_s": 1.0}}}))
    done = subprocess.run(_local(provision), cwd=str(clone), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    kit = clone / kit_arg
    assert (kit / "agent.yaml").exists(), done.stdout
    procs: Dict[str, subprocess.Popen] = {}
    logs = {name: folder / ("%s.log" % name) for name in ("broker", "coordinator", "agent", "install")}

    def tails() -> str:
        broker_log = clone / out / "broker" / "log" / "mosquitto.log"
        parts = ["---- %s ----\n%s" % (n, p.read_text(errors="replace")[-3000:])
                 for n, p in list(logs.items()) + [("mosquitto.log", broker_log)] if p.exists()]
        return "\n".join(parts)
    try:
        procs["broker"] = _spawn(_local(broker), clone, logs["broker"])
        assert wait_port("127.0.0.1", port, 10), tails()
        procs["coordinator"] = _spawn(_local(coordinator), clone, logs["coordinator"])
        # The board: the kit installed by its own install script, as the README says, into a
        # root folder (no systemd to start it here), from a wheelhouse of this machine
        # (torch reached as a system-wide one, as on a Jetson), pip cut off from any index.
        script = install[install.index("sh") + 1]
        root = folder / "board"
        root.mkdir()
        argv = [a for a in install if a != "sudo"]
        argv[argv.index("--wheelhouse") + 1] = str(house)
        argv += ["--root", str(root), "--no-enable", "--system-site-packages", "--python", sys.executable]
        board_env = host_wheelhouse.clean_env(PIP_INDEX_URL=host_wheelhouse.NO_INDEX,
                                              PYTHONUSERBASE=str(torch_base))
        done = subprocess.run(argv, cwd=str(clone), capture_output=True, text=True, timeout=180,
                              env=board_env)
        logs["install"].write_text(done.stdout + done.stderr)
        assert done.returncode == 0, tails()
        etc = root / "etc" / "streamfl"
        assert (etc / "agent.yaml").read_bytes() == (kit / "agent.yaml").read_bytes(), script
        # agent.yaml names its files by their /etc/streamfl/ paths; inside the root folder they
        # lie under it, so the flags say where
        agent = [str(root / "opt" / "streamfl" / "venv" / "bin" / "streamfl-agent"),
                 "--config", str(etc / "agent.yaml"), "--tls-ca", str(etc / "ca.crt"),
                 "--password-file", str(etc / "mqtt-password")]
        procs["agent"] = _spawn(agent + ["--state-dir", str(folder / "agent-state")], clone,
                                logs["agent"], env=board_env)
        run_dir = clone / _option(coordinator, "--run-dir")
        deadline = time.monotonic() + 45.0
        aggregated: List[dict] = []
        while not aggregated:
            dead = [n for n, p in procs.items() if p.poll() is not None]
            assert not dead and time.monotonic() < deadline, (
                "no update of %s aggregated (exited: %s)\n%s" % (board, dead, tails()))
            time.sleep(0.3)
            aggregated = [m for m in read_metrics(run_dir / "metrics.jsonl", events=("update",))
                          if m.get("outcome") == "aggregated" and m.get("device") == board]
        # the operator's command line that the output's README gives: signed, answered
        line = next(x for x in (clone / out / "README.md").read_text().splitlines()
                    if x.startswith("streamfl operator status "))
        argv = shlex.split(line)
        done = subprocess.run([str(VENV_BIN / "streamfl")] + argv[1:], cwd=str(clone),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and board in done.stdout, done.stdout + done.stderr + tails()
    finally:
        for name in ("agent", "coordinator", "broker"):
            proc = procs.get(name)
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
    assert procs["coordinator"].returncode == 0, tails()
    assert procs["agent"].returncode == 0, tails()
