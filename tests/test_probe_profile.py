"""A ``dvfs probe`` file is a board profile: it loads through the profile loader with its checks,
its measured watts drive the modeled meter of a simulated backend, and its timings are exposed."""
import itertools
import time

import pytest
import yaml

from streamfl.agent.config import AgentConfig
from streamfl.agent.dvfs import AgentDvfs
from streamfl.agent.dvfs_probe import load_probe, probe
from streamfl.dvfs.config import DvfsConfig
from streamfl.dvfs.profiles import (PROFILE_NAMES, MeasuredPowerModel, load_profile,
                                    load_profile_file)
from streamfl.errors import ConfigError
from streamfl.models import ModelSpec
from test_agent_dvfs import board_dvfs

TINY = ModelSpec(name="mlp", hidden=16)
PI4 = load_profile("raspberry-pi-4")
ORIN = load_profile("jetson-orin-nano")


def config():
    return AgentConfig(device_id="probe-profile-test", model=TINY)


def ticking():
    """A probe clock on which every timed window lasts 1 s (no counter thread: the meter is read)."""
    ticks = itertools.count()
    return lambda: float(next(ticks))


@pytest.fixture(scope="module")
def pi4_probe(tmp_path_factory):
    """A probe file of a simulated Raspberry Pi 4 (modeled meter), made once for the module."""
    tmp = tmp_path_factory.mktemp("pi4")
    dvfs = AgentDvfs.from_config(DvfsConfig(backend="simulated", board="raspberry-pi-4"),
                                 tmp / "state", clock=time.perf_counter)
    path = tmp / "probe.yaml"
    probe(config(), dvfs, path, steps=1, warmup_steps=0, clock=ticking(), profile=PI4)
    return path


def edited(tmp_path, source, edit, filename="edited.yaml"):
    """A copy of the probe file ``source`` with ``edit`` applied to its parsed YAML."""
    data = yaml.safe_load(source.read_text())
    edit(data)
    path = tmp_path / filename
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def simulated(tmp_path, path, meter=None):
    """The agent's clocks built from ``dvfs.profile_path``, as the agent and the demo build them."""
    return AgentDvfs.from_config(DvfsConfig(backend="simulated", profile_path=str(path),
                                            meter=meter), tmp_path / "state")


def test_the_probe_file_loads_with_the_profile_loader(pi4_probe):
    profile = load_profile_file(pi4_probe)
    assert profile == load_probe(pi4_probe)
    assert profile.name == PI4.name and profile.domains == PI4.domains
    assert profile.power == PI4.power and profile.thermal_zones == PI4.thermal_zones
    measured = profile.measured
    assert (measured.backend, measured.meter, measured.arch_id) == ("simulated", "modeled",
                                                                    TINY.arch_id)
    assert profile.measured_arch_id == TINY.arch_id
    sps = profile.seconds_per_sample
    assert sorted(sps) == [("cpu0", i) for i in range(10)] and all(s > 0 for s in sps.values())
    # The measured watts are the power model now; on a modeled board they are the model's own.
    assert isinstance(profile.power_model, MeasuredPowerModel)
    assert profile.power_model.idle_w == measured.idle_w == PI4.power_model.idle_w
    for level in range(10):
        assert profile.modeled_w({"cpu0": level}) == pytest.approx(
            measured.domains["cpu0"].train_w[level], abs=1e-3)
        assert profile.modeled_w({"cpu0": level}) == pytest.approx(
            PI4.modeled_w({"cpu0": level}), abs=1e-3)


def test_a_simulated_backend_built_from_it_reports_the_measured_watts(tmp_path, pi4_probe):
    # Figures no power model gives (one dips, as a real meter's may), to tell them from the model's.
    train_w = [9.0 + 0.5 * i for i in range(10)]
    train_w[4] = 10.9

    def measure(data):
        data["measured"]["idle_w"] = 3.25
        data["measured"]["domains"]["cpu0"]["train_w"] = train_w
    path = edited(tmp_path, pi4_probe, measure)
    dvfs = simulated(tmp_path, path)
    cpu = dvfs.backend.domain("cpu0")
    assert dvfs.backend.kind == "simulated" and dvfs.meter.kind == "modeled"
    assert dvfs.board == "raspberry-pi-4" and list(cpu.levels_khz) == list(PI4.domain("cpu0").levels_khz)
    assert dvfs.meter.total_w() == pytest.approx(3.25)                # not training: measured idle
    dvfs.training = True
    for level, watts in enumerate(train_w):
        cpu.set_level(level)
        assert dvfs.meter.total_w() == pytest.approx(watts)


def test_without_measured_watts_the_declared_model_stays(tmp_path, pi4_probe):
    def unmeasured(data):
        data["measured"].update(meter="null", idle_w=None)
        data["measured"]["domains"]["cpu0"]["train_w"] = [None] * 10
    profile = load_profile_file(edited(tmp_path, pi4_probe, unmeasured))
    assert profile.power_model == PI4.power_model and len(profile.seconds_per_sample) == 10


def test_a_profile_written_from_a_probe_profile_keeps_the_declared_model(tmp_path, pi4_probe):
    def dips(data):
        data["measured"]["domains"]["cpu0"]["train_w"] = [5.0, 4.0] + [6.0] * 8
    first = load_probe(edited(tmp_path, pi4_probe, dips))
    dvfs = simulated(tmp_path, tmp_path / "edited.yaml")
    doc = probe(config(), dvfs, tmp_path / "again.yaml", steps=1, warmup_steps=0,
                clock=ticking(), profile=first)
    assert doc["power_model"]["watts_per_level"]["cpu0"] == list(PI4.power_model.watts_per_level["cpu0"])
    again = load_probe(tmp_path / "again.yaml")
    # The re-probe measured the first file's watts (its modeled meter reads them back).
    assert again.measured.domains["cpu0"].train_w == (5.0, 4.0) + (6.0,) * 8
    assert again.power_model.watts_per_level["cpu0"][:2] == (
        pytest.approx(5.0 - first.measured.idle_w), pytest.approx(4.0 - first.measured.idle_w))


def test_a_sysfs_probe_of_steps_of_unequal_ladders_loads_and_gives_back_its_watts(tmp_path):
    dvfs, root = board_dvfs(tmp_path)                    # jetson-orin-nano: 20 CPU, 5 GPU levels
    path = tmp_path / "orin.yaml"
    probe(config(), dvfs, path, steps=1, warmup_steps=0, clock=ticking(), domains=["gpu", "cpu0"],
          profile=ORIN)
    profile = load_probe(path)
    measured = profile.measured.domains
    assert profile.measured.backend == "sysfs"
    assert len(measured["gpu"].train_w) == 5 and len(measured["cpu0"].train_w) == 20
    assert measured["gpu"].train_w == measured["cpu0"].train_w[:5]
    # A sysfs backend on the same board and a simulated one anywhere both take the file.
    on_board = AgentDvfs.from_config(DvfsConfig(sysfs_root=str(root), profile_path=str(path),
                                                meter="modeled"), tmp_path / "state2")
    assert [d.name for d in on_board.backend.domains] == ["cpu0", "cpu4", "gpu"]
    sim = simulated(tmp_path, path)
    sim.training = True
    for k in range(20):                                  # the walk: gpu held at its top past 4
        sim.backend.domain("cpu0").set_level(k)
        sim.backend.domain("gpu").set_level(min(k, 4))
        assert sim.meter.total_w() == pytest.approx(measured["cpu0"].train_w[k], abs=1e-3)


def test_shipped_profiles_have_no_measurements():
    for name in PROFILE_NAMES:
        profile = load_profile(name)
        assert profile.measured is None and profile.seconds_per_sample == {}
        assert profile.measured_arch_id is None and not isinstance(profile.power_model,
                                                                   MeasuredPowerModel)


def _set(keys, value):
    def edit(data):
        target = data
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return edit


def _rename(keys, new):
    def edit(data):
        target = data
        for key in keys[:-1]:
            target = target[key]
        target[new] = target.pop(keys[-1])
    return edit


M = ["measured"]
CPU = ["measured", "domains", "cpu0"]
MALFORMED = [
    ("old watts key", _rename(CPU + ["train_w"], "watts"), "watts"),
    ("unknown measured key", _set(M + ["board"], "raspberry-pi-4"), "board"),
    ("unknown top key", _set(["arch_id"], "x"), "arch_id"),
    ("newer format", _set(M + ["format"], 3), "format"),
    ("no arch", _set(M + ["arch_id"], ""), "arch_id"),
    ("no batch", _set(M + ["batch_size"], 0), "batch_size"),
    ("negative idle", _set(M + ["idle_w"], -1.0), "idle_w"),
    ("idle a string", _set(M + ["idle_w"], "low"), "idle_w"),
    ("no domains", _set(M + ["domains"], {}), "domains"),
    ("no such domain", _rename(CPU, "gpu"), "measured.domains.gpu"),
    ("too few levels", _set(CPU, {"seconds_per_sample": [0.1], "train_w": [1.0]}),
     "measured.domains.cpu0"),
    ("lengths differ", _set(CPU + ["train_w"], [1.0] * 9), "train_w"),
    ("zero time", _set(CPU + ["seconds_per_sample", 3], 0.0), "seconds_per_sample"),
    ("time a string", _set(CPU + ["seconds_per_sample", 3], "fast"), "seconds_per_sample"),
    ("some watts missing", _set(CPU + ["train_w", 3], None), "train_w"),
    ("negative watts", _set(CPU + ["train_w", 3], -2.0), "train_w"),
    ("unknown domain key", _set(CPU + ["levels_khz"], [1, 2]), "levels_khz"),
    ("the board part too", _set(["domains", 0, "levels_khz"], [2, 1]), "levels_khz"),
]


@pytest.mark.parametrize("label,edit,key", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_probe_file_names_the_file_and_key(tmp_path, pi4_probe, label, edit, key):
    path = edited(tmp_path, pi4_probe, edit)
    for load in (load_profile_file, load_probe, lambda p: simulated(tmp_path, p)):
        with pytest.raises(ConfigError) as err:
            load(path)
        assert str(path) in str(err.value) and key in str(err.value), str(err.value)


def test_domains_probed_together_must_agree(tmp_path):
    dvfs, _ = board_dvfs(tmp_path)
    path = tmp_path / "orin.yaml"
    probe(config(), dvfs, path, steps=1, warmup_steps=0, clock=ticking(), domains=["cpu0", "cpu4"],
          profile=ORIN)
    bad = edited(tmp_path, path, _set(["measured", "domains", "cpu4", "train_w", 0], 99.0))
    with pytest.raises(ConfigError, match="measured.*domains.cpu4.*same figures") as err:
        load_profile_file(bad)
    assert str(bad) in str(err.value)


def test_a_probe_file_of_the_old_format_says_to_probe_again(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("format: 1\nboard: raspberry-pi-4\narch_id: x\ndomains: {}\n")
    with pytest.raises(ConfigError, match="unknown key 'format'.*probe' again") as err:
        simulated(tmp_path, path)
    assert str(path) in str(err.value)
