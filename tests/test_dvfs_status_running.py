"""``streamfl-agent dvfs status`` beside a running agent shows what that agent has set (its clock
record, with its pid), never a fresh simulated board's levels as the agent's, and prints power only
from a meter that measures."""
import json
import subprocess
import sys

import pytest

from streamfl.agent import dvfs_cli
from streamfl.agent.dvfs import AgentDvfs
from streamfl.agent.dvfs_state import (STATE_FILE, ClockRecord, DomainRecord, process_alive,
                                       process_start, read_record, this_process, write_record)
from streamfl.dvfs.config import DvfsConfig
from streamfl.dvfs.fake.tree import build_tree
from streamfl.dvfs.profiles import load_profile
from streamfl.errors import StorageError

ORIN = load_profile("jetson-orin-nano")
ORIN_GPU_KHZ = ORIN.domain("gpu").levels_khz


def status(tmp_path, *args):
    """``dvfs status`` in a child process, as an operator runs it beside the agent."""
    out = subprocess.run([sys.executable, "-m", "streamfl.agent", "dvfs", "status"] + list(args),
                         capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    return out.stdout


def dead_pid():
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(30)
    return child.pid


def simulated(tmp_path, policy="powersave"):
    return AgentDvfs.from_config(DvfsConfig(backend="simulated", board="jetson-orin-nano",
                                            policy=policy), tmp_path / "state")


def test_the_agent_records_its_levels_at_start_on_change_and_at_stop(tmp_path):
    dvfs = simulated(tmp_path)
    dvfs.start()
    first = read_record(tmp_path / "state")
    assert first.alive() and first.owner == "agent" and first.policy == "powersave"
    assert first.backend == "simulated" and first.board == "jetson-orin-nano"
    assert first.domains["gpu"] == DomainRecord(len(ORIN_GPU_KHZ) - 1, ORIN_GPU_KHZ[-1],
                                                len(ORIN_GPU_KHZ))
    assert first.meter == "modeled" and first.measured_power is False
    dvfs.apply({"gpu": 0})
    lowered = read_record(tmp_path / "state")
    assert lowered.domains["gpu"].level == 0 and lowered.domains["gpu"].mhz == ORIN_GPU_KHZ[0] / 1000.0
    before = (tmp_path / "state" / STATE_FILE).stat().st_mtime_ns
    dvfs.apply({"gpu": 0})  # no change: no write
    assert (tmp_path / "state" / STATE_FILE).stat().st_mtime_ns == before
    assert dvfs.close()
    last = read_record(tmp_path / "state")
    assert not last.running and not last.alive()
    assert last.domains["gpu"].level == len(ORIN_GPU_KHZ) - 1   # restored at stop


def test_a_dead_or_reused_pid_is_not_the_agent():
    mine = this_process(owner="agent", running=True, backend="simulated", policy="none",
                        mode="cap", board=None, meter="null", measured_power=False)
    assert mine.alive()
    assert not process_alive(dead_pid())
    start = process_start(mine.pid)
    assert start is not None and not process_alive(mine.pid, start + 1)   # same pid, later process
    assert not process_alive(0) and not process_alive(-1)


def test_a_record_that_is_not_one_is_a_clear_error(tmp_path):
    (tmp_path / STATE_FILE).write_text('{"format": 1, "pid": "x"}')
    with pytest.raises(StorageError, match="is not a clock record"):
        read_record(tmp_path)
    assert read_record(tmp_path / "nothing-here") is None


def test_simulated_status_without_an_agent_shows_no_current_level(tmp_path):
    out = status(tmp_path, "--board", "jetson-orin-nano", "--state-dir", str(tmp_path / "state"),
                 "--config", str(_config(tmp_path, backend="simulated")))
    assert "clocks set by an agent: none recorded" in out
    assert "no agent runs them now" in out
    assert "gpu (gpu): %d levels %.0f..%.0f MHz" % (
        len(ORIN_GPU_KHZ), ORIN_GPU_KHZ[0] / 1e3, ORIN_GPU_KHZ[-1] / 1e3) in out
    assert "kHz now" not in out and "(level " not in out      # no fresh board's levels
    assert "power now: no measured power on this board (simulated backend" in out


def test_a_crashed_agents_record_is_not_shown_as_running(tmp_path):
    state = tmp_path / "state"
    write_record(state, ClockRecord(pid=dead_pid(), proc_start=None, owner="agent", running=True,
                                    time_s=1.0e9, backend="simulated", policy="clp-aware",
                                    mode="cap", board="jetson-orin-nano", meter="modeled",
                                    measured_power=False,
                                    domains={"gpu": DomainRecord(0, ORIN_GPU_KHZ[0], 5)}))
    out = status(tmp_path, "--state-dir", str(state),
                 "--config", str(_config(tmp_path, backend="simulated")))
    assert "which is not running (ended without a clean stop" in out
    assert "clocks set by the running" not in out
    assert "lived in that process's memory: they are gone" in out
    assert "no agent runs them now" in out


def test_power_is_printed_only_from_a_meter_that_measures(tmp_path, capsys):
    root = tmp_path / "sys"
    build_tree(root, "jetson-orin-nano", "jp5")
    assert dvfs_cli.main(["status", "--board", "jetson-orin-nano", "--sysfs-root", str(root),
                          "--state-dir", str(tmp_path / "state")]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("power now:"))
    assert "W (ina3221-hwmon meter, measured; rails:" in line and "VDD_IN" in line, line
    # An x86 host without readable RAPL: generic-linux's model, which is not a measurement.
    assert dvfs_cli.main(["status", "--board", "generic-linux", "--sysfs-root",
                          str(tmp_path / "empty"), "--state-dir", str(tmp_path / "state")]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("power now:"))
    assert line.startswith("power now: no measured power on this board"), line
    assert " W " not in line and "10.00" not in line


def test_an_unreadable_record_is_reported_and_status_goes_on(tmp_path, capsys):
    state = tmp_path / "state"
    state.mkdir()
    (state / STATE_FILE).write_text("not json")
    assert dvfs_cli.main(["status", "--board", "raspberry-pi-4", "--sysfs-root",
                          str(tmp_path / "sys"), "--state-dir", str(state)]) == 0
    out = capsys.readouterr().out
    assert "clock record: %s is not a clock record" % (state / STATE_FILE) in out
    assert "board: raspberry-pi-4" in out


def _config(tmp_path, **dvfs):
    path = tmp_path / "agent.yaml"
    path.write_text(json.dumps({"board": "jetson-orin-nano", "dvfs": dvfs}))
    return path


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_status_beside_a_running_simulated_agent_shows_its_levels_and_pid(fleet, tmp_path):
    """A real agent process on the simulated backend lowers its GPU (powersave); status run
    beside it with the same config says that agent set the lowest level, and after it stops, that
    it stopped."""
    run = fleet()
    run.start_coordinator()
    agent = run.start_agent(0, board="jetson-orin-nano",
                            dvfs={"policy": "powersave", "emulate_speed": False})
    state = run.agent_state(0)

    def lowered():
        try:
            record = read_record(state)
        except StorageError:
            return None
        return record if record and record.domains["gpu"].level == 0 else None

    record = run.wait_for(lowered, 120, "the agent to record its lowered GPU")
    assert record.pid == agent.pid and record.alive()
    config = run.root / "agent-01.yaml"
    out = status(tmp_path, "--config", str(config), "--state-dir", str(state))
    assert "clocks set by the running agent pid %d (backend simulated, policy powersave" % agent.pid in out, out
    assert "  gpu %.0f MHz (level 0 of 0..%d)" % (ORIN_GPU_KHZ[0] / 1e3, len(ORIN_GPU_KHZ) - 1) in out, out
    assert "its levels are above" in out and "kHz now" not in out, out
    assert "power now: no measured power on this board" in out, out

    assert agent.terminate() == 0
    out = status(tmp_path, "--config", str(config), "--state-dir", str(state))
    assert "agent pid %d, which is not running (stopped cleanly" % agent.pid in out, out
    assert "clocks set by the running" not in out and "no agent runs them now" in out, out
