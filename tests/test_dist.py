"""make dist's target table and the wheelhouse it builds, from a local folder of tiny wheels.

``pip download`` runs for real (``--no-index --find-links`` a folder this test writes, with the
targets' ``--platform``/``--python-version`` arguments), so no package index is needed; the real
downloads of the board targets (``make dist``) are run by hand (docs/deployment.md, section 3).
"""
import hashlib
import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from source_tree import ROOT
from streamfl.deploy import INSTALL_SCRIPT, install_script_text
from streamfl.deploy import dist
from streamfl.deploy.dist import DistError, Target, build_wheelhouse


@pytest.fixture(autouse=True)
def _pip_sees_only_the_test_folder(monkeypatch):
    """This machine's pip configuration (find-links, constraints) stays out of the test."""
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    for name in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT"):
        monkeypatch.delenv(name, raising=False)


def fake_wheel(folder: Path, name: str, version: str, requires=(), tag="py3-none-any") -> Path:
    """A wheel that holds nothing but its metadata: enough for pip to resolve and download it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ("%s-%s-%s.whl" % (name.replace("-", "_"), version, tag))
    info = "%s-%s.dist-info" % (name.replace("-", "_"), version)
    meta = "Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name, version)
    meta += "".join("Requires-Dist: %s\n" % r for r in requires)
    with zipfile.ZipFile(str(path), "w") as zf:
        zf.writestr(info + "/METADATA", meta)
        zf.writestr(info + "/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: %s\n" % tag)
        zf.writestr(info + "/RECORD", "")
    return path


@pytest.fixture
def index(tmp_path):
    """A find-links folder: the agent's stand-in requirements, a CPU and a CUDA torch, pip."""
    links = tmp_path / "links"
    # gamma only below Python 3.9: pip (running 3.11 here) evaluates markers for itself; the
    # wheelhouse of a 3.8 board must still hold it.
    fake_wheel(links, "alpha", "1.0", ['gamma; python_version < "3.9"'])
    fake_wheel(links, "beta", "1.0")
    fake_wheel(links, "gamma", "1.0")
    fake_wheel(links, "delta", "1.0")
    fake_wheel(links, "epsilon", "1.0")
    fake_wheel(links, "zeta", "1.0")
    fake_wheel(links, "nvidia-foo", "1.0")
    fake_wheel(links, "torch", "2.0.0", ['delta; platform_machine == "aarch64"',
                                         'nvidia-foo; platform_machine == "x86_64"'])
    fake_wheel(links, "torch", "3.0.0", ['nvidia-foo; platform_system == "Linux"'])
    fake_wheel(links, "pip", "99.0")
    return links


@pytest.fixture
def streamfl_wheel(tmp_path):
    return fake_wheel(tmp_path / "built", "streamfl", "0.1.0",
                      ["alpha>=1.0", "torch>=1.10", 'beta; extra == "jetson"'])


def _target(name, **kw):
    kw.setdefault("glibc", (2, 31))
    return Target(name, "a test board", kw.pop("python", "3.8"), **kw)


def _args(index):
    return ["--no-index", "--find-links", str(index)]


def test_the_board_targets():
    assert set(dist.TARGETS) == {"rpios-bookworm-aarch64", "debian-bullseye-aarch64", "jetpack6", "jetpack5"}
    by_python = {name: t.python for name, t in dist.TARGETS.items()}
    assert by_python == {"rpios-bookworm-aarch64": "3.11", "debian-bullseye-aarch64": "3.9",
                         "jetpack6": "3.10", "jetpack5": "3.8"}
    for name, target in dist.TARGETS.items():
        jetson = name.startswith("jetpack")
        assert (target.torch is None) == jetson, name  # NVIDIA's torch is left out
        assert ("jetson" in target.extras) == jetson, name
        assert bool(target.torch_support) == jetson, name  # what a dropped-in torch needs
        tags = target.platforms()
        assert tags[0] == "manylinux_%d_%d_aarch64" % target.glibc
        assert tags[-2:] == ["manylinux_2_17_aarch64", "manylinux2014_aarch64"]
        args = target.pip_args()
        assert args[args.index("--python-version") + 1] == target.python
        assert target.marker_environment()["platform_machine"] == "aarch64"
    # PyPI's aarch64 torch is a CUDA build from 2.11 on and 2.10 needs ARMv8.1 (no Pi 4);
    # NVIDIA's JetPack 6 torch wants NumPy 1.
    assert "<2.10" in dist.TARGETS["rpios-bookworm-aarch64"].torch
    assert "numpy<2" in dist.TARGETS["jetpack6"].pins


def test_list_prints_the_table(capsys):
    assert dist.main(["--list"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert [t["target"] for t in table] == list(dist.TARGETS)
    assert {t["target"]: t["torch_included"] for t in table}["jetpack5"] is False


def test_unknown_target_is_exit_2(capsys):
    assert dist.main(["--targets", "jetpack4", "--out", "/nonexistent"]) == 2
    assert "unknown target 'jetpack4'" in capsys.readouterr().err


def test_wheelhouse_with_torch(tmp_path, index, streamfl_wheel):
    target = _target("board-a", torch="torch>=1.10,<3")
    house = build_wheelhouse(target, streamfl_wheel, tmp_path / "out", _args(index))
    assert house == tmp_path / "out" / "board-a"
    names = sorted(p.name for p in house.iterdir() if not p.name.startswith("."))
    assert names == sorted(["alpha-1.0-py3-none-any.whl", "gamma-1.0-py3-none-any.whl",
                            "torch-2.0.0-py3-none-any.whl", "delta-1.0-py3-none-any.whl",
                            "pip-99.0-py3-none-any.whl", streamfl_wheel.name, INSTALL_SCRIPT,
                            "target.json"])
    info = json.loads((house / "target.json").read_text())
    assert info["target"] == "board-a" and info["python"] == "3.8" and info["machine"] == "aarch64"
    assert info["torch_included"] is True and info["torch_wheel"] == "torch-2.0.0-py3-none-any.whl"
    assert info["wheel"] == streamfl_wheel.name and info["pip_wheel"] == "pip-99.0-py3-none-any.whl"
    assert info["platforms"][0] == "manylinux_2_31_aarch64" and info["version"] == "0.1.0"
    listed = {f["name"]: f for f in info["files"]}
    assert set(listed) == set(names) - {"target.json"}
    for name, entry in listed.items():
        data = (house / name).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest() and entry["bytes"] == len(data)
    assert (house / INSTALL_SCRIPT).read_text() == install_script_text()
    assert (house / INSTALL_SCRIPT).stat().st_mode & 0o111


def test_wheelhouse_without_torch_keeps_a_dropped_in_wheel(tmp_path, index, streamfl_wheel, monkeypatch):
    target = _target("board-b", python="3.10", extras=("jetson",), torch_support=("epsilon",))
    out = tmp_path / "out"
    house = build_wheelhouse(target, streamfl_wheel, out, _args(index))
    names = {p.name for p in house.glob("*.whl")}
    assert names == {"alpha-1.0-py3-none-any.whl", "beta-1.0-py3-none-any.whl",
                     "epsilon-1.0-py3-none-any.whl", "pip-99.0-py3-none-any.whl", streamfl_wheel.name}
    info = json.loads((house / "target.json").read_text())
    assert info["torch_included"] is False and info["torch_wheel"] is None
    assert info["extras"] == ["jetson"]

    # NVIDIA's wheel, put there by the user.
    nvidia = fake_wheel(house, "torch", "2.1.0a0+41361538.nv23.06", tag="cp38-cp38-linux_aarch64")
    # The same inputs again: nothing is downloaded.
    def no_pip(*args, **kwargs):
        raise AssertionError("pip download ran for a cached wheelhouse")
    with monkeypatch.context() as m:
        m.setattr(dist, "_pip_download", no_pip)
        build_wheelhouse(target, streamfl_wheel, out, _args(index))
    assert nvidia.exists()
    # Other inputs: downloaded again, the dropped-in wheel kept but not listed as the build's.
    target = _target("board-b", python="3.10", extras=("jetson",), torch_support=("epsilon", "zeta"))
    build_wheelhouse(target, streamfl_wheel, out, _args(index))
    assert nvidia.exists() and (house / "zeta-1.0-py3-none-any.whl").exists()
    listed = [f["name"] for f in json.loads((house / "target.json").read_text())["files"]]
    assert nvidia.name not in listed and "zeta-1.0-py3-none-any.whl" in listed


def test_a_cuda_torch_is_refused(tmp_path, index, streamfl_wheel):
    target = _target("board-c", torch="torch>=3")
    with pytest.raises(DistError, match="torch-3.0.0-py3-none-any.whl for board-c is a CUDA build"):
        build_wheelhouse(target, streamfl_wheel, tmp_path / "out", _args(index))


def test_missing_requirements_evaluates_markers_for_the_board(tmp_path):
    folder = tmp_path / "h"
    fake_wheel(folder, "alpha", "1.0", ['gamma; python_version < "3.9"', "beta>=2"])
    fake_wheel(folder, "beta", "1.5")
    old = _target("old", python="3.8")
    new = _target("new", python="3.11")
    assert dist.missing_requirements(old, folder, ["alpha"]) == ["gamma", "beta>=2"]
    assert dist.missing_requirements(new, folder, ["alpha"]) == ["beta>=2"]


def test_install_script_is_package_data():
    text = (ROOT / "streamfl" / "deploy" / INSTALL_SCRIPT).read_text()
    assert install_script_text() == text and text.startswith("#!/bin/sh\n")


def test_install_script_passes_shellcheck():
    """A board's sh runs the script: shellcheck in sh mode. Skipped without shellcheck, except
    under CI (``CI=true``), where ``.ci/run`` installs it and its absence fails."""
    if shutil.which("shellcheck") is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("shellcheck is missing under CI: .ci/run installs it (apt-get install shellcheck)")
        pytest.skip("shellcheck not installed (apt install shellcheck)")
    proc = subprocess.run(["shellcheck", "-s", "sh", str(ROOT / "streamfl" / "deploy" / INSTALL_SCRIPT)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    assert proc.returncode == 0, proc.stdout
