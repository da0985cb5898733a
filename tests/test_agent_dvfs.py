"""The agent's clocks: the policy's plan applied before each round, levels and joules in every
update, clocks and power in telemetry, and the board restored on exit and after a crash."""
import dataclasses

import pytest
import yaml

from streamfl.agent.dvfs import AgentDvfs
from streamfl.dvfs.config import DvfsConfig
from streamfl.dvfs.factory import make_backend, make_meter, sysfs_backend
from streamfl.dvfs.fake.kernel import FakeKernel
from streamfl.dvfs.fake.tree import build_tree
from streamfl.dvfs.guard import SAVED_FILE
from streamfl.dvfs.power.null import NullMeter
from streamfl.config import to_dict
from streamfl.dvfs.profiles import MeasuredDomain, Measurement, load_profile
from streamfl.dvfs.sysfs_io import SysfsFiles
from streamfl.protocol.messages import Hello
from streamfl.protocol.transport.memory import MemoryBroker
from polling import wait_until
from test_agent_daemon import SPEC, FakeCoordinator, Running
from test_dvfs_domains import tree_files


def board_dvfs(tmp_path, board="jetson-orin-nano", variant="jp5"):
    """An AgentDvfs over a fake board tree, with the profile's modeled power."""
    root = tmp_path / "sys"
    build_tree(root, board, variant)
    profile = load_profile(board)
    backend = sysfs_backend(profile, FakeKernel(root), root)
    holder = []
    meter = make_meter(DvfsConfig(meter="modeled"), profile, backend,
                       busy=lambda: bool(holder and holder[0].training))
    dvfs = AgentDvfs(backend, meter, tmp_path / "state", energy_rate_hz=50.0,
                     restore_io=SysfsFiles(root), thermal_zones=profile.thermal_zones, board=board)
    holder.append(dvfs)
    return dvfs, root


def test_powersave_rounds_report_levels_and_energy_and_the_board_is_restored(tmp_path):
    dvfs, root = board_dvfs(tmp_path)
    before = tree_files(root)
    broker = MemoryBroker()
    coord = FakeCoordinator(broker)
    coord.publish_model(1)
    with Running(broker, tmp_path / "state", agent_dvfs=dvfs, dvfs={"policy": "powersave"}) as daemon:
        wait_until(lambda: len(coord.updates) >= 2, what="two updates")
        wait_until(lambda: any(t.clocks_khz for t in coord.telemetry), what="telemetry with clocks")
        assert (tmp_path / "state" / SAVED_FILE).exists()
        assert tree_files(root) != before
    update = coord.updates[-1]
    assert update.clock_levels == {"cpu0": 0, "cpu4": 0, "gpu": 0}
    assert update.energy_j is not None and update.energy_j > 0
    tel = [t for t in coord.telemetry if t.clocks_khz][-1]
    assert tel.clocks_khz["gpu"] == dvfs.backend.domain("gpu").levels_khz[0]
    assert tel.power_w is not None and tel.temperatures_c
    # Per rail from the same reading as the total (the modeled meter's total is their sum).
    assert set(tel.rails_w) == set(dvfs.meter.rails)
    assert sum(tel.rails_w.values()) == pytest.approx(tel.power_w, abs=0.01)
    hello = [m for m in coord.status if isinstance(m, Hello)][0]
    assert hello.dvfs_levels["gpu"] == list(dvfs.backend.domain("gpu").levels_khz)
    assert tree_files(root) == before                   # stopped: every clock is back
    assert not (tmp_path / "state" / SAVED_FILE).exists()
    assert daemon.counters["dvfs_errors"] == 0


@pytest.mark.parametrize("where", ["finish_round", "observe_clocks"])
def test_a_round_that_crashes_leaves_the_board_restored_exactly(tmp_path, where):
    """An unexpected exception in training (or right after it) with the clocks lowered: the
    daemon goes on, and its stop puts every setting back, through 4.9-kernel write rules."""
    root = tmp_path / "sys"
    build_tree(root, "jetson-nano", "jp4")
    io = FakeKernel(root, legacy_limits=True)
    # Minimums above the lowest level: restoring must raise max before min or get EINVAL.
    io.write("devices/system/cpu/cpufreq/policy0/scaling_min_freq", "1036800")
    io.write("class/devfreq/57000000.gpu/min_freq", "460800000")
    profile = load_profile("jetson-nano")
    backend = sysfs_backend(profile, io, root)
    dvfs = AgentDvfs(backend, NullMeter(), tmp_path / "state", restore_io=io, board="jetson-nano")
    before = tree_files(root)
    broker = MemoryBroker()
    coord = FakeCoordinator(broker)
    coord.publish_model(1)
    running = Running(broker, tmp_path / "state", agent_dvfs=dvfs, dvfs={"policy": "powersave"})
    calls = []

    def boom(*args, **kwargs):
        calls.append(where)
        raise RuntimeError("unexpected failure in %s" % where)
    setattr(running.daemon.core, where, boom)
    with running as daemon:
        wait_until(lambda: daemon.counters["round_errors"] >= 1, what="a failed round")
        assert calls and (tmp_path / "state" / SAVED_FILE).exists()
        assert io.read("devices/system/cpu/cpufreq/policy0/scaling_max_freq") == "102000"
        assert tree_files(root) != before
        assert daemon.dvfs.training is False
    assert coord.updates == []
    assert tree_files(root) == before
    assert not (tmp_path / "state" / SAVED_FILE).exists()
    assert daemon.counters["dvfs_errors"] == 0


def test_policy_none_never_writes_a_clock(tmp_path):
    dvfs, root = board_dvfs(tmp_path, "raspberry-pi-4", "")
    before = tree_files(root)
    broker = MemoryBroker()
    coord = FakeCoordinator(broker)
    coord.publish_model(1)
    with Running(broker, tmp_path / "state", agent_dvfs=dvfs):
        wait_until(lambda: len(coord.updates) >= 2, what="two updates")
        assert tree_files(root) == before and not (tmp_path / "state" / SAVED_FILE).exists()
    assert coord.updates[-1].clock_levels == {"cpu0": 9}


def test_a_refused_write_is_counted_and_training_goes_on(tmp_path):
    dvfs, root = board_dvfs(tmp_path, "raspberry-pi-4", "")
    (root / "devices/system/cpu/cpufreq/policy0/scaling_max_freq").chmod(0o444)   # no tmpfiles rule: EACCES
    broker = MemoryBroker()
    coord = FakeCoordinator(broker)
    coord.publish_model(1)
    with Running(broker, tmp_path / "state", agent_dvfs=dvfs, dvfs={"policy": "powersave"}) as daemon:
        wait_until(lambda: len(coord.updates) >= 2, what="updates despite DVFS errors")
        assert daemon.counters["dvfs_errors"] >= 1


def test_start_restores_what_a_crashed_run_left_behind(tmp_path):
    dvfs, root = board_dvfs(tmp_path, "jetson-nano", "jp4")
    before = tree_files(root)
    dvfs.guard.apply({"cpu0": 0, "gpu": 0})       # a run that then died without restoring
    assert tree_files(root) != before
    again, _ = AgentDvfs(dvfs.backend, dvfs.meter, tmp_path / "state",
                         restore_io=SysfsFiles(root)), None
    again.start()
    try:
        assert tree_files(root) == before
    finally:
        again.close()


@pytest.mark.parametrize("how", ["backend none", "DVFS unavailable"])
def test_the_next_start_restores_whatever_its_own_backend(tmp_path, how):
    """A killed sysfs run's clocks go back even if the agent now starts with DVFS off, or with a
    board whose clocks it cannot read (the CLI then falls back to ``AgentDvfs.disabled``)."""
    dvfs, root = board_dvfs(tmp_path, "jetson-orin-nano", "jp5")
    before = tree_files(root)
    dvfs.guard.apply({"cpu0": 0, "gpu": 0})       # a run that then died without restoring
    if how == "backend none":
        again = AgentDvfs.from_config(DvfsConfig(backend="none", sysfs_root=str(root)),
                                      tmp_path / "state")
    else:
        again = AgentDvfs.disabled(tmp_path / "state", SysfsFiles(root))
    again.start()
    try:
        assert tree_files(root) == before
        assert not (tmp_path / "state" / SAVED_FILE).exists()
        assert again.telemetry()["temperatures_c"] == {}     # not this backend's board to read
    finally:
        again.close()


def test_restore_command_works_when_the_config_is_broken(tmp_path):
    import subprocess
    import sys
    dvfs, root = board_dvfs(tmp_path, "jetson-orin-nano", "jp5")
    before = tree_files(root)
    dvfs.guard.apply({"cpu0": 0, "gpu": 0})
    bad = tmp_path / "agent.yaml"
    bad.write_text("dvfs:\n  polciy: none\n")
    out = subprocess.run([sys.executable, "-m", "streamfl.agent", "dvfs", "restore", "--config",
                          str(bad), "--state-dir", str(tmp_path / "state"), "--sysfs-root", str(root)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "polciy" in out.stdout and "restored: cpu0, cpu4, gpu" in out.stdout   # logs go to stdout
    assert tree_files(root) == before


def test_simulated_backend_from_config_records_levels_over_time(tmp_path):
    t = [0.0]
    cfg = DvfsConfig(backend="simulated", board="raspberry-pi-5", policy="powersave")
    dvfs = AgentDvfs.from_config(cfg, tmp_path / "state", clock=lambda: t[0])
    dvfs.start()
    dvfs.counter.stop()              # virtual time: sample by hand instead of the thread
    try:
        t[0] = 2.0
        assert dvfs.apply({"cpu0": 0}) == {"cpu0": 0}
        dvfs.training = True
        dvfs.counter.sample_once(2.0)
        t[0] = 3.0
        assert dvfs.joules(2.0, 3.0) == pytest.approx(dvfs.meter.total_w(), rel=1e-6)
        assert dvfs.meter.total_w() > load_profile("raspberry-pi-5").power_model.idle_w
    finally:
        dvfs.close()
    assert dvfs.backend.domain("cpu0").history == [(0.0, 9), (2.0, 0), (3.0, 9)]
    assert not (tmp_path / "state" / SAVED_FILE).exists()         # nothing real to save


def test_backend_none_from_config_touches_nothing(tmp_path):
    dvfs = AgentDvfs.from_config(DvfsConfig(backend="none"), tmp_path)
    assert dvfs.views() == () and dvfs.apply({}) == {} and dvfs.joules(0, 1) is None
    assert make_backend(DvfsConfig(backend="none"), None).domains == ()


def test_emulated_clocks_stretch_rounds_by_the_frequency_ratio(tmp_path):
    cfg = DvfsConfig(backend="simulated", board="raspberry-pi-4", emulate_speed=True)
    dvfs = AgentDvfs.from_config(cfg, tmp_path)
    assert dvfs.slowdown() == 1.0                        # starts at the top level
    dvfs.backend.domain("cpu0").set_level(0)
    assert dvfs.slowdown() == pytest.approx(1500000 / 600000.0)
    assert AgentDvfs.from_config(DvfsConfig(backend="simulated", board="raspberry-pi-4"),
                                 tmp_path).slowdown() == 1.0
    with pytest.raises(ValueError):
        DvfsConfig(backend="sysfs", emulate_speed=True)


def probed_profile(board="jetson-orin-nano", domain="gpu", arch_id=SPEC.arch_id, batch_size=8):
    """A ``dvfs probe`` profile of ``board``: seconds per sample falling with every level."""
    profile = load_profile(board)
    n = len(profile.domain(domain).levels_khz)
    seconds = tuple(0.001 * (n + 1 - i) for i in range(n))
    measured = Measurement(backend="simulated", arch_id=arch_id, batch_size=batch_size, steps=3,
                           domains={domain: MeasuredDomain(seconds, (None,) * n)})
    return dataclasses.replace(profile, measured=measured), seconds


def test_a_probe_profile_seeds_the_clp_aware_policy_at_start(tmp_path):
    """``dvfs.profile_path`` names a probe file: each measured level's time reaches the policy
    before the first round, so its climb is judged on measurements from the start."""
    profile, seconds = probed_profile()
    path = tmp_path / "dvfs-probe.yaml"
    path.write_text(yaml.safe_dump(to_dict(profile)))
    cfg = DvfsConfig(backend="simulated", profile_path=str(path), policy="clp-aware")
    dvfs = AgentDvfs.from_config(cfg, tmp_path / "state")
    assert dvfs.probe_timings(SPEC.arch_id, 8) == {("gpu", i): s for i, s in enumerate(seconds)}
    with Running(MemoryBroker(), tmp_path / "state", agent_dvfs=dvfs,
                 dvfs={"policy": "clp-aware"}) as daemon:
        policy = daemon.core.dvfs_policy
        assert [policy.t_avg("gpu", i) for i in range(len(seconds))] == pytest.approx(seconds)
        assert policy.t_avg("cpu0", 0) is None
        # Measured everywhere: after the CLP it climbs while a step saves over 5%, no blind probes.
        plans = [daemon.core.frequency_plan(dvfs.views())["gpu"] for _ in range(3)]
        assert plans == [1, 2, 3]


@pytest.mark.parametrize("change", ["model", "batch size", "levels"])
def test_probe_timings_of_another_model_or_ladder_are_not_used(tmp_path, change):
    profile, _ = probed_profile(arch_id="other-model" if change == "model" else SPEC.arch_id,
                                batch_size=32 if change == "batch size" else 8)
    backend = make_backend(DvfsConfig(backend="simulated"), profile)
    if change == "levels":      # the kernel's table differs from the one the probe stepped
        spec = profile.domain("gpu")
        other = dataclasses.replace(spec, levels_khz=spec.levels_khz[:-1])
        backend = make_backend(DvfsConfig(backend="simulated"), dataclasses.replace(
            profile, domains=tuple(other if d.name == "gpu" else d for d in profile.domains),
            measured=None))
    dvfs = AgentDvfs(backend, make_meter(DvfsConfig(meter="null"), profile, backend,
                                         busy=lambda: False),
                     tmp_path / "state", profile=profile)
    assert dvfs.probe_timings(SPEC.arch_id, 8) == {}
    with Running(MemoryBroker(), tmp_path / "state", agent_dvfs=dvfs,
                 dvfs={"policy": "clp-aware"}) as daemon:
        assert daemon.core.dvfs_policy.t_avg("gpu", 0) is None
