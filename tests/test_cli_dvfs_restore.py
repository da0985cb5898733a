"""``streamfl-agent dvfs restore`` (the systemd unit's ExecStopPost) puts a killed agent's clocks
back without importing torch: run in a process where ``import torch`` fails."""
import subprocess
import sys

import pytest

from test_agent_dvfs import board_dvfs
from test_dvfs_domains import tree_files

#: Runs ``streamfl-agent`` with torch made unimportable (None in sys.modules refuses the import).
NO_TORCH = ("import sys; sys.modules['torch'] = None; "
            "from streamfl.agent.cli import main; sys.exit(main(sys.argv[1:]))")


def run_without_torch(*args):
    return subprocess.run([sys.executable, "-c", NO_TORCH] + list(args), capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("how", ["flags", "config file", "broken config file"])
def test_restore_runs_without_torch(tmp_path, how):
    dvfs, root = board_dvfs(tmp_path, "jetson-orin-nano", "jp5")
    before = tree_files(root)
    dvfs.guard.apply({"cpu0": 0, "gpu": 0})        # a run that then died without restoring
    assert tree_files(root) != before
    state = tmp_path / "state"
    if how == "flags":
        args = ["--state-dir", str(state), "--sysfs-root", str(root)]
    else:
        path = tmp_path / "agent.yaml"
        path.write_text("state_dir: %s\ndvfs: {sysfs_root: %s}\nmodel: {hidden: 16}\n" % (state, root)
                        if how == "config file" else "local_steps: many\ndvfs: {polciy: none}\n")
        args = ["--config", str(path)]
        if how == "broken config file":
            args += ["--state-dir", str(state), "--sysfs-root", str(root)]
    proc = run_without_torch("dvfs", "restore", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "restored: cpu0, cpu4, gpu" in proc.stdout
    assert tree_files(root) == before
    if how == "broken config file":
        assert "polciy" in proc.stdout                  # the warning says why the file was not used


def test_restore_with_nothing_saved_exits_0_without_torch(tmp_path):
    proc = run_without_torch("dvfs", "restore", "--state-dir", str(tmp_path / "state"),
                             "--sysfs-root", str(tmp_path / "sys"))
    assert proc.returncode == 0, proc.stderr
    assert "nothing to restore" in proc.stdout
