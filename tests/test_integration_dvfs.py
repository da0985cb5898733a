"""A real agent process lowering the clocks of a fake board tree: SIGTERM restores them; after
SIGKILL, `streamfl-agent dvfs restore` (the unit's ExecStopPost) and the next start do."""
import signal
import subprocess
import sys

import pytest

from streamfl.dvfs.fake.kernel import FakeKernel
from streamfl.dvfs.fake.tree import build_tree, legacy_limits
from streamfl.dvfs.guard import SAVED_FILE, restore_saved
from test_dvfs_domains import tree_files

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


#: (board, tree variant, lowest CPU level, the domains a restore names): a 5.10 kernel (max wins)
#: and a 4.9 kernel (JetPack 4: crossing min and max is EINVAL).
BOARDS = [("jetson-orin-nano", "jp5", 115200, "cpu0, cpu4, gpu"),
          ("jetson-nano", "jp4", 102000, "cpu0, gpu")]
BOARD_IDS = ["%s-%s" % b[:2] for b in BOARDS]


def _sysfs(tree, policy):
    """The agent's dvfs section for a fake board tree (the demo's config emulates clocks, which
    only the simulated backend may: real clocks slow a round down by themselves); the board
    profile is the agent config's top-level ``board``."""
    return {"backend": "sysfs", "sysfs_root": str(tree), "policy": policy, "emulate_speed": False}


def _start(fleet, tree, policy="powersave", board="jetson-orin-nano"):
    run = fleet()
    run.start_coordinator()
    agent = run.start_agent(0, board=board, dvfs=_sysfs(tree, policy))
    return run, agent


def _throttled(run, tree, before, lowest_khz=115200):
    saved = run.agent_state(0) / SAVED_FILE
    cap_file = tree / "devices/system/cpu/cpufreq/policy0/scaling_max_freq"

    def cap():  # the fake tree's file is rewritten in place: it may read empty mid-write
        text = cap_file.read_text().strip()
        return int(text) if text else None
    run.wait_for(lambda: saved.exists() and tree_files(tree) != before and cap() == lowest_khz, 120,
                 "the agent to cap the CPU of %s at its lowest level (powersave)" % tree)


def _raise_minimums(tree):
    """Originals with each minimum mid-ladder, above the level the agent caps at: putting them
    back must raise max before min, or a 4.9 kernel answers EINVAL (FakeKernel checks it)."""
    io = FakeKernel(tree)
    for directory, listing, attr in (("devices/system/cpu/cpufreq/policy0",
                                      "scaling_available_frequencies", "scaling_min_freq"),
                                     ("class/devfreq/" + _gpu_name(tree), "available_frequencies",
                                      "min_freq")):
        levels = sorted(int(f) for f in io.read(directory + "/" + listing).split())
        io.write(directory + "/" + attr, str(levels[len(levels) // 2]))


def _gpu_name(tree):
    return sorted(p.name for p in (tree / "class/devfreq").iterdir())[0]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_puts_every_clock_back(fleet, tmp_path, sig):
    tree = tmp_path / "sys"
    build_tree(tree, "jetson-orin-nano", "jp5")
    before = tree_files(tree)
    run, agent = _start(fleet, tree)
    _throttled(run, tree, before)
    assert agent.terminate(sig=sig) == 0, agent.tail()
    assert tree_files(tree) == before, agent.tail()
    assert not (run.agent_state(0) / SAVED_FILE).exists()
    assert "clocks restored" in agent.log_text()


@pytest.mark.parametrize("board,variant,lowest,domains", BOARDS, ids=BOARD_IDS)
def test_after_sigkill_the_restore_command_and_the_next_start_restore_exactly(
        fleet, tmp_path, board, variant, lowest, domains):
    tree = tmp_path / "sys"
    build_tree(tree, board, variant)
    _raise_minimums(tree)
    before = tree_files(tree)
    run, agent = _start(fleet, tree, board=board)
    _throttled(run, tree, before, lowest)
    agent.kill()                                    # no handler runs: the board stays throttled
    assert tree_files(tree) != before
    config = run.root / "agent-01.yaml"
    cmd = [sys.executable, "-m", "streamfl.agent", "dvfs", "restore", "--config", str(config),
           "--state-dir", str(run.agent_state(0))]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "restored: %s" % domains in out.stdout
    assert tree_files(tree) == before
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "nothing to restore" in again.stdout

    # Killed again; the save file the agent left, put back through the kernel's rules for this
    # board (plain files accept any write order, a 4.9 kernel does not).
    agent = run.start_agent(0, board=board, dvfs=_sysfs(tree, "powersave"))
    _throttled(run, tree, before, lowest)
    agent.kill()
    io = FakeKernel(tree, legacy_limits=legacy_limits(board, variant))
    assert restore_saved(run.agent_state(0), io) == domains.split(", ")
    assert tree_files(tree) == before

    # Killed once more; this time the next start of the agent puts the clocks back itself.
    agent = run.start_agent(0, board=board, dvfs=_sysfs(tree, "powersave"))
    _throttled(run, tree, before, lowest)
    agent.kill()
    agent = run.start_agent(0, board=board, dvfs=_sysfs(tree, "none"))
    run.wait_for(lambda: "restored the clocks an earlier run" in agent.log_text(), 60,
                 "the restarted agent to restore the clocks")
    assert tree_files(tree) == before
    assert agent.terminate() == 0


def test_status_command_describes_the_board(tmp_path):
    tree = tmp_path / "sys"
    build_tree(tree, "raspberry-pi-4", "")
    out = subprocess.run([sys.executable, "-m", "streamfl.agent", "dvfs", "status", "--board",
                          "raspberry-pi-4", "--sysfs-root", str(tree), "--state-dir",
                          str(tmp_path / "state")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "board: raspberry-pi-4" in out.stdout
    assert "cpu0 (cpu): 10 levels 600000..1500000 kHz" in out.stdout
    # The Pi 4 has no power sensor: no invented figure, its power model is not passed off as one.
    assert "power now: no measured power on this board" in out.stdout
    assert " W " not in out.stdout.split("power now:")[1].splitlines()[0]
    assert "saved original clocks: none" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "streamfl.agent", "dvfs", "status", "--board",
                          "jetson-tx1"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "jetson-tx1" in bad.stderr
