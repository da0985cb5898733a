"""``streamfl-agent dvfs probe``: seconds per sample and watts at every level, written as a board
profile with a ``measured`` section, with the clocks put back afterwards and on every error.
(tests/test_probe_profile.py loads such files as profiles.)"""
import itertools
import subprocess
import sys
import time

import pytest
import yaml

from streamfl.agent.config import AgentConfig
from streamfl.agent.dvfs import AgentDvfs
from streamfl.agent.dvfs_probe import PROBE_FILE, load_probe, probe, run_probe
from streamfl.agent.core import DivergedError
from streamfl.config import to_dict
from streamfl.dvfs.base import DvfsError
from streamfl.dvfs.config import DvfsConfig
from streamfl.dvfs.fake.tree import build_tree
from streamfl.dvfs.guard import SAVED_FILE, restore_saved
from streamfl.dvfs.profiles import load_profile
from streamfl.dvfs.sysfs_io import SysfsFiles
from streamfl.errors import ConfigError, StorageError
from streamfl.models import ModelSpec
from streamfl.sensors import SensorConfig
from test_agent_dvfs import board_dvfs
from test_dvfs_domains import tree_files

TINY = ModelSpec(name="mlp", hidden=16)
PI4 = load_profile("raspberry-pi-4")
PI4_LEVELS = list(PI4.domain("cpu0").levels_khz)
ORIN = load_profile("jetson-orin-nano")
ORIN_CAP = "devices/system/cpu/cpufreq/policy4/scaling_max_freq"


def config(**kw):
    kw.setdefault("model", TINY)
    return AgentConfig(device_id="probe-test", **kw)


def simulated(tmp_path, **dvfs_kw):
    dvfs_kw.setdefault("board", "raspberry-pi-4")
    return AgentDvfs.from_config(DvfsConfig(backend="simulated", **dvfs_kw), tmp_path / "state",
                                 clock=time.perf_counter)


def gpu_level(dvfs, seen):
    """A probe clock that notes the GPU's and cpu0's levels each time it is read."""
    def clock():
        seen.append((dvfs.backend.domain("gpu").current_level(),
                     dvfs.backend.domain("cpu0").current_level()))
        return time.perf_counter()
    return clock


def test_simulated_probe_has_every_level_and_restores_the_clocks(tmp_path):
    dvfs = simulated(tmp_path, energy_rate_hz=100.0)
    cpu = dvfs.backend.domain("cpu0")
    cpu.set_level(4)                                    # wherever the clocks were, they go back
    dvfs.start()
    try:
        doc = probe(config(), dvfs, tmp_path / "p.yaml", steps=3, profile=PI4)
    finally:
        dvfs.close()
    assert yaml.safe_load((tmp_path / "p.yaml").read_text()) == doc
    assert doc["name"] == "raspberry-pi-4" and doc["domains"][0]["levels_khz"] == PI4_LEVELS
    measured = doc["measured"]
    assert (measured["format"], measured["backend"], measured["meter"]) == (2, "simulated", "modeled")
    assert measured["arch_id"] == TINY.arch_id and measured["batch_size"] == 32
    assert measured["steps"] == 3 and measured["measured_at"].endswith("+00:00")
    assert measured["idle_w"] == pytest.approx(PI4.power_model.idle_w, abs=1e-3)
    entry = measured["domains"]["cpu0"]
    assert list(measured["domains"]) == ["cpu0"]
    assert len(entry["seconds_per_sample"]) == len(entry["train_w"]) == len(PI4_LEVELS)
    assert all(s > 0 for s in entry["seconds_per_sample"])
    assert all(b > a for a, b in zip(entry["train_w"], entry["train_w"][1:])), entry["train_w"]
    assert PI4.power_model.idle_w < entry["train_w"][0]
    assert entry["train_w"][-1] <= PI4.modeled_w({"cpu0": 9})
    profile = load_probe(tmp_path / "p.yaml")
    assert profile.measured_arch_id == TINY.arch_id
    assert profile.seconds_per_sample == {("cpu0", i): s
                                          for i, s in enumerate(entry["seconds_per_sample"])}
    assert [lv for _, lv in cpu.history] == [9, 4] + list(range(10)) + [4]
    assert cpu.current_level() == 4 and not dvfs.guard.changed


def test_without_the_counter_the_meter_is_read_and_emulated_clocks_slow_the_steps(tmp_path):
    dvfs = simulated(tmp_path, emulate_speed=True)        # not started: no counter thread
    ticks = itertools.count()                             # every timed window lasts 1 s
    doc = probe(config(), dvfs, tmp_path / "p.yaml", steps=2, warmup_steps=1,
                clock=lambda: float(next(ticks)), profile=PI4)
    entry = doc["measured"]["domains"]["cpu0"]
    assert doc["measured"]["idle_w"] == PI4.power_model.idle_w
    assert entry["train_w"] == [pytest.approx(PI4.modeled_w({"cpu0": i})) for i in range(10)]
    # 2 steps of 32 samples in 1 s at the top; t ~ 1/f below it
    assert entry["seconds_per_sample"] == [pytest.approx(PI4_LEVELS[-1] / f / 64.0, rel=1e-5)
                                           for f in PI4_LEVELS]
    assert dvfs.backend.domain("cpu0").current_level() == 9


def test_a_window_the_counter_cannot_answer_reads_the_meter(tmp_path):
    dvfs = simulated(tmp_path, energy_rate_hz=100.0)
    dvfs.start()
    try:            # a clock on another timeline than the counter's: its window is not in the ring
        doc = probe(config(), dvfs, tmp_path / "p.yaml", steps=1, warmup_steps=1,
                    clock=lambda: time.perf_counter() - 1e6, profile=PI4)
        assert doc["measured"]["domains"]["cpu0"]["train_w"] == [
            pytest.approx(PI4.modeled_w({"cpu0": i})) for i in range(10)]
        assert doc["measured"]["idle_w"] == PI4.power_model.idle_w
        with pytest.raises(ValueError, match="did not advance"):
            probe(config(), dvfs, tmp_path / "p.yaml", steps=1, clock=lambda: 5.0, profile=PI4)
        assert not dvfs.guard.changed and dvfs.backend.domain("cpu0").current_level() == 9
    finally:
        dvfs.close()


def test_a_board_without_a_meter_gets_null_watts_and_odd_channels_get_noise_windows(tmp_path):
    dvfs = simulated(tmp_path, meter="null")
    cfg = config(model=ModelSpec(name="mlp", in_channels=4, hidden=16),
                 sensor=SensorConfig(kind="mqtt", channels=4), batch_size=8)
    doc = probe(cfg, dvfs, tmp_path / "p.yaml", steps=1, warmup_steps=0, profile=PI4)
    measured = doc["measured"]
    assert measured["meter"] == "null" and measured["batch_size"] == 8
    assert measured["idle_w"] is None and measured["domains"]["cpu0"]["train_w"] == [None] * 10
    profile = load_probe(tmp_path / "p.yaml")
    assert profile.measured.domains["cpu0"].train_w == (None,) * 10
    assert profile.power_model == PI4.power_model         # nothing measured: the model stays


def test_sysfs_probe_of_the_gpu_restores_the_tree_exactly(tmp_path):
    dvfs, root = board_dvfs(tmp_path)                    # jetson-orin-nano, JetPack 5 tree
    before = tree_files(root)
    seen = []
    dvfs.start()
    try:
        doc = probe(config(), dvfs, tmp_path / "p.yaml", steps=2, clock=gpu_level(dvfs, seen),
                    profile=ORIN)
    finally:
        dvfs.close()
    assert list(doc["measured"]["domains"]) == ["gpu"]   # clp-aware scales the GPU on this board
    assert [d["levels_khz"] for d in doc["domains"]] == [
        list(d.levels_khz) for d in dvfs.backend.domains]
    assert sorted({g for g, _ in seen}) == [0, 1, 2, 3, 4] and {c for _, c in seen} == {19}
    assert tree_files(root) == before
    assert not (tmp_path / "state" / SAVED_FILE).exists()


def test_named_cpu_domains_are_stepped_together(tmp_path):
    dvfs, root = board_dvfs(tmp_path)
    before = tree_files(root)
    doc = probe(config(), dvfs, tmp_path / "p.yaml", steps=1, warmup_steps=0,
                domains=["cpu0", "cpu4"], min_window_s=0.0, profile=ORIN)
    measured = doc["measured"]["domains"]
    assert list(measured) == ["cpu0", "cpu4"]
    assert measured["cpu0"]["seconds_per_sample"] == measured["cpu4"]["seconds_per_sample"]
    assert len(measured["cpu0"]["train_w"]) == 20
    assert tree_files(root) == before


def test_an_error_in_the_middle_restores_the_clocks(tmp_path):
    dvfs, root = board_dvfs(tmp_path)
    before = tree_files(root)
    calls = []

    def failing_clock():
        calls.append(1)
        if dvfs.backend.domain("gpu").current_level() == 2:
            raise RuntimeError("boom at level 2")
        return time.perf_counter()
    with pytest.raises(RuntimeError, match="boom"):
        probe(config(), dvfs, tmp_path / "p.yaml", steps=1, clock=failing_clock, profile=ORIN)
    assert calls and tree_files(root) == before
    assert not (tmp_path / "state" / SAVED_FILE).exists() and not (tmp_path / "p.yaml").exists()


def test_a_diverging_model_restores_the_clocks(tmp_path):
    dvfs, root = board_dvfs(tmp_path, "raspberry-pi-4", "")
    before = tree_files(root)
    with pytest.raises(DivergedError):
        probe(config(lr=1e30), dvfs, tmp_path / "p.yaml", steps=2, profile=PI4)
    assert tree_files(root) == before and not dvfs.guard.changed


def test_a_refused_write_restores_the_other_domains_and_keeps_the_save(tmp_path):
    dvfs, root = board_dvfs(tmp_path)
    before = tree_files(root)
    (root / ORIN_CAP).chmod(0o444)                       # no tmpfiles rule for cpu4: EACCES
    with pytest.raises(DvfsError):
        probe(config(), dvfs, tmp_path / "p.yaml", domains=["cpu0", "cpu4"], profile=ORIN)
    assert tree_files(root) == before                    # cpu0 went back, cpu4 never moved
    assert (tmp_path / "state" / SAVED_FILE).exists()    # cpu4's restore failed: kept for later
    (root / ORIN_CAP).chmod(0o644)
    assert restore_saved(tmp_path / "state", SysfsFiles(root)) == ["cpu0", "cpu4", "gpu"]
    assert tree_files(root) == before


def test_clocks_that_will_not_go_back_fail_the_probe(tmp_path):
    dvfs, root = board_dvfs(tmp_path)
    before = tree_files(root)
    gpu_max = root / dvfs.backend.domain("gpu").directory / "max_freq"

    def clock():
        if dvfs.backend.domain("gpu").current_level() == 4:
            gpu_max.chmod(0o444)                         # stuck at the top: restore is refused
        return time.perf_counter()
    with pytest.raises(DvfsError, match="dvfs restore"):
        probe(config(), dvfs, tmp_path / "p.yaml", steps=1, clock=clock, profile=ORIN)
    assert (tmp_path / "p.yaml").exists()                # the measurements are kept
    gpu_max.chmod(0o644)
    restore_saved(tmp_path / "state", SysfsFiles(root))
    assert tree_files(root) == before


def test_bad_arguments(tmp_path):
    dvfs = simulated(tmp_path)
    for kw in ({"steps": 0}, {"steps": True}, {"warmup_steps": -1}, {"domains": ["gpu"]}):
        with pytest.raises(ConfigError):
            probe(config(), dvfs, tmp_path / "p.yaml", profile=PI4, **kw)
    with pytest.raises(DvfsError, match="no frequency domain"):
        probe(config(), AgentDvfs.disabled(), tmp_path / "p.yaml", profile=PI4)
    orin, _ = board_dvfs(tmp_path / "orin")
    with pytest.raises(ConfigError, match="has no domain cpu4, gpu"):   # not the profile of dvfs
        probe(config(), orin, tmp_path / "p.yaml", profile=PI4)
    assert not orin.guard.changed and not (tmp_path / "p.yaml").exists()
    with pytest.raises(ConfigError, match="backend"):
        run_probe(config(dvfs=DvfsConfig(backend="none")), tmp_path)
    assert dvfs.guard.changed is False


def test_an_unwritable_profile_is_a_storage_error_after_the_clocks_are_back(tmp_path):
    dvfs = simulated(tmp_path)
    (tmp_path / "file").write_text("")
    with pytest.raises(StorageError, match="probe profile"):
        probe(config(), dvfs, tmp_path / "file" / "p.yaml", steps=1, warmup_steps=0, profile=PI4)
    assert dvfs.backend.domain("cpu0").current_level() == 9 and not dvfs.guard.changed


@pytest.mark.parametrize("text, why", [
    (None, "cannot read"),
    ("[1, 2]\n", "mapping"),
    ("format: 1\nboard: raspberry-pi-4\ndomains: {}\n", "format 1"),   # the old probe file
    (yaml.safe_dump(to_dict(PI4)), "missing key 'measured'"),             # a plain profile
])
def test_load_probe_refuses_what_is_not_a_probe_profile(tmp_path, text, why):
    path = tmp_path / "p.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError, match=why) as err:
        load_probe(path)
    assert str(path) in str(err.value)


def _cli(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "streamfl.agent", "dvfs", "probe"] + list(args),
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=120)


def test_cli_probe_end_to_end_and_config_errors_exit_2(tmp_path):
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(yaml.safe_dump({
        "device_id": "probe-cli", "state_dir": str(tmp_path / "state"),
        "model": {"name": "mlp", "hidden": 16},
        "dvfs": {"backend": "simulated", "board": "raspberry-pi-5", "energy_rate_hz": 100.0}}))
    done = _cli(tmp_path, "--config", str(cfg), "--steps", "2")
    assert done.returncode == 0, done.stderr
    profile = load_probe(tmp_path / "state" / PROBE_FILE)
    assert profile.name == "raspberry-pi-5" and list(profile.measured.domains) == ["cpu0"]
    assert "ms/sample" in done.stdout and "wrote" in done.stdout
    assert "INFO streamfl.agent.core" not in done.stdout    # the probe's rounds are not logged
    table = [line.split() for line in done.stdout.splitlines() if line.startswith("cpu0 ")]
    assert [int(row[2]) for row in table] == list(profile.domain("cpu0").levels_khz)

    bad = _cli(tmp_path, "--config", str(cfg), "--domain", "gpu", "--out", str(tmp_path / "x.yaml"))
    assert bad.returncode == 2 and "no DVFS domain 'gpu'" in bad.stderr
    assert not (tmp_path / "x.yaml").exists()


def test_cli_action_over_a_sysfs_tree_steps_only_the_gpu(tmp_path, capsys):
    root = tmp_path / "sys"
    build_tree(root, "jetson-orin-nano", "jp5")
    before = tree_files(root)
    cfg = config(dvfs=DvfsConfig(sysfs_root=str(root), board="jetson-orin-nano", energy_rate_hz=100.0))
    assert run_probe(cfg, tmp_path / "state", steps=1, domains=["gpu"]) == 0    # real SysfsFiles
    profile = load_probe(tmp_path / "state" / PROBE_FILE)
    assert list(profile.measured.domains) == ["gpu"] and profile.measured.meter == "ina3221-hwmon"
    assert len([line for line in capsys.readouterr().out.splitlines() if line.startswith("gpu ")]) == 5
    assert tree_files(root) == before and not (tmp_path / "state" / SAVED_FILE).exists()
