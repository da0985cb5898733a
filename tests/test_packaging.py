"""The built wheel installs the folders as ``streamfl.*`` and imports from outside the repository."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_imports_from_outside_the_repo(tmp_path):
    # Build from a copy of the tracked files, as a clean clone would: setuptools' build/ folder in a
    # working tree can hold stale modules that would hide a packaging mistake.
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=str(ROOT), capture_output=True,
                           check=True).stdout.decode().split("\0")
    src = tmp_path / "src"
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(str(ROOT / name), str(src / name))
    wheel_dir = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheel_dir), str(src)], check=True)
    wheels = list(wheel_dir.glob("streamfl-*.whl"))
    assert len(wheels) == 1
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                    str(wheels[0])], check=True)
    code = ("import streamfl, streamfl.agent.cli, streamfl.coordinator.cli, streamfl.protocol.codec, "
            "streamfl.sensors, streamfl.models, streamfl.sim.demo; "
            "import sys; assert streamfl.__file__.startswith(sys.argv[1]), streamfl.__file__")
    # -I: isolated mode, so neither the repo nor the editable install is on the path.
    env_path = str(target)
    proc = subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, %r); %s" % (
        env_path, code), env_path], cwd=str(tmp_path), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    # The top-level folder names must not leak into site-packages as bare packages.
    assert not (target / "agent").exists() and not (target / "models").exists()


def test_agent_side_does_not_import_coordinator():
    for folder in ("agent", "protocol", "sensors", "models"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            assert "streamfl.coordinator" not in text, path
