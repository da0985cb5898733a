"""The simulator's device model and event queue: seeded draws repeat, timings follow FedTeddi eq. 4
and the clock ladder (or a probe's measured walk), watts are the profile's weighted by what a round
uses (or a probe's measured ones), the Shannon rate falls with distance, and availability follows
the scenario's windows."""
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from streamfl.config import build
from streamfl.dvfs.factory import watts_for
from streamfl.dvfs.profiles import load_profile
from streamfl.dvfs.utilization import training_utilization
from streamfl.errors import ConfigError
from streamfl.sim.device import (DEFAULT_SECONDS_PER_SAMPLE_S, DeviceModel, DeviceSpec,
                                 make_devices)
from streamfl.sim.events import Event, EventQueue

PI4 = load_profile("raspberry-pi-4")
ORIN = load_profile("jetson-orin-nano")
AGX = load_profile("jetson-agx-orin")
BOARDS = Path(__file__).resolve().parents[1] / "configs" / "boards"


def device(seed=0, profile=PI4, **kw):
    return DeviceModel(DeviceSpec(board=profile.name, **kw), profile, seed)


# --- event queue -----------------------------------------------------------------------------

def test_events_pop_in_time_order_and_ties_in_push_order():
    q = EventQueue()
    assert q.now_s == 0.0 and len(q) == 0 and q.peek_time() is None
    q.push(2.0, "b", {"unhashable": []})
    q.push(1.0, "a")
    q.push(2.0, "c", {"unhashable": []})  # same time as "b": payloads are never compared
    q.push(0.0, "z")
    assert len(q) == 4 and q.peek_time() == 0.0
    kinds = []
    while q:
        event = q.pop()
        assert isinstance(event, Event) and q.now_s == event.time_s
        kinds.append(event.kind)
    assert kinds == ["z", "a", "b", "c"]
    assert q.now_s == 2.0
    with pytest.raises(IndexError):
        q.pop()


def test_events_refuse_the_past_but_accept_now():
    q = EventQueue()
    q.push(5.0, "x")
    q.pop()
    q.push(5.0, "now")
    with pytest.raises(ValueError, match="past"):
        q.push(4.999, "late")
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError):
            q.push(bad, "bad")
    assert [q.pop().seq for _ in range(len(q))] == [1]


def test_reserved_sequence_numbers_pop_as_if_pushed_when_reserved():
    q = EventQueue()
    first = q.reserve(2)  # a round whose pushes come later
    q.push(3.0, "later-pushed-first")
    assert q.peek().kind == "later-pushed-first"
    q.push(3.0, "update", seq=first)
    q.push(1.0, "next-round", seq=first + 1)
    assert q.peek() == Event(1.0, first + 1, "next-round", None)
    assert [q.pop().kind for _ in range(len(q))] == ["next-round", "update", "later-pushed-first"]
    assert q.peek() is None


# --- determinism -----------------------------------------------------------------------------

def draws(devices):
    return [(d.compute_s(32, {}), d.participates(), d.shadowing_db) for d in devices]


def test_same_seed_same_draws_and_devices_are_independent():
    specs = [DeviceSpec(participation=0.5, noise_scale=1.0, shadowing_std_db=8.0,
                        channel="shannon")] * 3
    a, b = draws(make_devices(specs, 7)), draws(make_devices(specs, 7))
    assert a == b
    assert draws(make_devices(specs, 8)) != a
    assert len({x[0] for x in a}) == 3  # each device its own stream
    # Adding a device leaves the others' draws as they were.
    assert draws(make_devices(specs + [DeviceSpec(board="jetson-nano")], 7))[:3] == a


# --- compute time ----------------------------------------------------------------------------

@pytest.mark.parametrize("noise_scale", [0.05, 1.0])
def test_compute_mean_matches_expected_and_never_beats_the_shift(noise_scale):
    dev = device(seconds_per_sample_s=1e-3, speed=2.0, noise_scale=noise_scale)
    levels = {"cpu0": 3}
    n = 50
    times = np.array([dev.compute_s(n, levels) for _ in range(20000)])
    expected = n * dev.expected_seconds_per_sample(levels)
    assert times.mean() == pytest.approx(expected, rel=0.02)
    shift = n * dev.min_seconds_per_sample(levels)
    assert shift == pytest.approx(expected / (1 + noise_scale))
    assert times.min() >= shift
    # FedTeddi eq. 4: the part above the shift is exponential, its mean noise_scale * shift.
    assert (times - shift).mean() == pytest.approx(noise_scale * shift, rel=0.03)
    assert dev.compute_s(0, levels) == 0.0
    assert device(noise_scale=0.0).compute_s(10, {}) == 10 * DEFAULT_SECONDS_PER_SAMPLE_S["cpu"]


def test_top_level_timing_is_spec_times_speed_and_defaults_by_kind():
    assert device(seconds_per_sample_s=2e-3, speed=5).expected_seconds_per_sample({}) == \
        pytest.approx(1e-2)
    assert device().expected_seconds_per_sample({}) == DEFAULT_SECONDS_PER_SAMPLE_S["cpu"]
    assert device(profile=ORIN).expected_seconds_per_sample({}) == \
        DEFAULT_SECONDS_PER_SAMPLE_S["gpu"]


def test_lower_level_is_slower_by_the_frequency_ratio():
    pi = device(seconds_per_sample_s=1e-3)
    assert pi.expected_seconds_per_sample({"cpu0": 0}) == pytest.approx(1e-3 * 1500000 / 600000)
    orin = device(profile=ORIN, seconds_per_sample_s=1e-3)
    assert orin.scaled_domains == ("gpu",)
    assert orin.expected_seconds_per_sample({"gpu": 0}) == pytest.approx(1e-3 * 624750 / 306000)
    # On a GPU board the CPU clusters do not set the pace (AdaCLP s4.2.2).
    assert orin.expected_seconds_per_sample({"cpu0": 0, "cpu4": 0}) == pytest.approx(1e-3)
    ladder = [pi.expected_seconds_per_sample({"cpu0": i}) for i in range(10)]
    assert ladder == sorted(ladder, reverse=True)


def test_bad_levels_are_refused():
    pi = device()
    with pytest.raises(ValueError, match="no domain 'gpu'"):
        pi.expected_seconds_per_sample({"gpu": 0})
    with pytest.raises(ValueError, match="outside 0..9"):
        pi.train_w({"cpu0": 10})
    with pytest.raises(ValueError):
        pi.compute_s(-1, {})
    with pytest.raises(ValueError):
        pi.upload_s(-5)


# --- measured timings ------------------------------------------------------------------------

def probe_file(tmp_path, board, domains, idle_w=2.5):
    """``board``'s shipped YAML with a ``measured`` section (what ``dvfs probe`` writes)."""
    data = yaml.safe_load((BOARDS / (board + ".yaml")).read_text(encoding="utf-8"))
    data["measured"] = {
        "format": 2, "backend": "sysfs", "meter": "ina3221-hwmon", "arch_id": "mlp-test",
        "batch_size": 32, "steps": 5, "measured_at": "2025-01-01T00:00:00+00:00",
        "idle_w": idle_w, "domains": domains}
    path = tmp_path / ("%s-probe.yaml" % board)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_measured_timings_are_used_and_scaled_by_speed(tmp_path):
    sps = [0.01 - 0.0005 * i for i in range(10)]
    watts = [3.0 + 0.4 * i for i in range(10)]
    path = probe_file(tmp_path, "raspberry-pi-4",
                      {"cpu0": {"seconds_per_sample": sps, "train_w": watts}})
    plain, slow, rescaled = make_devices([
        DeviceSpec(profile_path=str(path)),
        DeviceSpec(profile_path=str(path), speed=3.0),
        DeviceSpec(profile_path=str(path), seconds_per_sample_s=1e-3)], seed=1)
    for i in range(10):
        assert plain.expected_seconds_per_sample({"cpu0": i}) == pytest.approx(sps[i])
        assert slow.expected_seconds_per_sample({"cpu0": i}) == pytest.approx(3 * sps[i])
        # A scenario timing for another model keeps the measured shape, not the absolute figure.
        assert rescaled.expected_seconds_per_sample({"cpu0": i}) == \
            pytest.approx(1e-3 * sps[i] / sps[-1])
        # The probe's watts are the power model now.
        assert plain.train_w({"cpu0": i}) == pytest.approx(watts[i], abs=1e-3)
    assert plain.idle_w == 2.5


def test_measured_lockstep_walk_maps_levels_to_its_steps(tmp_path):
    walk = [0.02 / (1 + 0.1 * k) for k in range(20)]
    path = probe_file(tmp_path, "jetson-orin-nano", {
        "cpu0": {"seconds_per_sample": walk, "train_w": [None] * 20},
        "gpu": {"seconds_per_sample": walk[:5], "train_w": [None] * 5}}, idle_w=None)
    (orin,) = make_devices([DeviceSpec(profile_path=str(path))], seed=0)
    assert orin.expected_seconds_per_sample({}) == pytest.approx(walk[-1])
    assert orin.expected_seconds_per_sample({"gpu": 2}) == pytest.approx(walk[2])
    assert orin.expected_seconds_per_sample({"cpu0": 10}) == pytest.approx(walk[10])
    # Off the walk the lower step is the bottleneck.
    assert orin.expected_seconds_per_sample({"cpu0": 10, "gpu": 2}) == pytest.approx(walk[2])
    # No measured watts: the declared power model stays, weighted as for a modeled board.
    top = device(profile=ORIN).top_levels
    assert orin.train_w({}) == pytest.approx(ORIN.utilized_w(top, training_utilization(ORIN)))


def test_measured_watts_on_a_gpu_board_are_billed_as_measured(tmp_path):
    """The probe measured the whole board while training: no utilization share applies, even
    though its watts sit on a CPU domain (the longest ladder of the lockstep walk)."""
    walk = [0.02 / (1 + 0.1 * k) for k in range(20)]
    watts = [6.0 + 0.3 * k for k in range(20)]
    path = probe_file(tmp_path, "jetson-orin-nano", {
        "cpu0": {"seconds_per_sample": walk, "train_w": watts},
        "gpu": {"seconds_per_sample": walk[:5], "train_w": watts[:5]}}, idle_w=4.0)
    (orin,) = make_devices([DeviceSpec(profile_path=str(path))], seed=0)
    assert set(orin.utilization.values()) == {1.0}
    for k in (0, 7, 19):
        assert orin.train_w({"cpu0": k}) == pytest.approx(watts[k], abs=1e-3)


# --- power -----------------------------------------------------------------------------------

def test_watts_are_the_profile_power_model_weighted_by_utilization():
    orin = device(profile=ORIN)
    model = ORIN.power_model
    assert orin.idle_w == model.idle_w
    # GPU board: the GPU in full, one core of each CPU cluster (cpu0 has 4 cores, cpu4 2).
    assert orin.utilization == {"cpu0": 0.25, "cpu4": 0.5, "gpu": 1.0}
    levels = {"cpu0": 3, "gpu": 1}
    watts = model.watts_per_level
    expected = (model.idle_w + watts["cpu0"][3] / 4 + watts["gpu"][1]
                + watts["cpu4"][-1] / 2)  # left out: at its top, uncapped
    assert orin.train_w(levels) == pytest.approx(expected)
    # Every domain at full load: the modeled meter's sum, the old bound.
    full = model.idle_w + watts["cpu0"][3] + watts["gpu"][1] + watts["cpu4"][-1]
    assert orin.full_load_w(levels) == pytest.approx(full) == pytest.approx(ORIN.modeled_w(
        dict(orin.top_levels, **levels)))
    # The same figures the modeled meter gets (factory.make_meter interpolates with watts_for),
    # times the round's share of the domain.
    top = {d.name: len(d.levels_khz) - 1 for d in ORIN.domains}
    for dom in ORIN.domains:
        meter_watts = watts_for(dom.levels_khz, dom.levels_khz, watts[dom.name])
        for i, w in enumerate(meter_watts):
            extra = (orin.train_w(dict(top, **{dom.name: i}))
                     - orin.train_w(dict(top, **{dom.name: 0})))
            assert extra == pytest.approx((w - meter_watts[0]) * orin.utilization[dom.name],
                                          abs=1e-3)


def test_cpu_only_boards_are_billed_every_core():
    for profile in (PI4, load_profile("raspberry-pi-5")):
        pi = device(profile=profile)
        assert pi.utilization == {"cpu0": 1.0}
        for i in range(len(profile.domain("cpu0").levels_khz)):
            assert pi.train_w({"cpu0": i}) == pytest.approx(profile.modeled_w({"cpu0": i}))
            assert pi.train_w({"cpu0": i}) == pytest.approx(pi.full_load_w({"cpu0": i}))


def energy_per_sample_j(dev, watts, gpu_level):
    """Joules per sample of a round with the GPU at ``gpu_level`` under ``watts`` (levels -> W)."""
    levels = {"gpu": gpu_level}
    return watts(levels) * dev.expected_seconds_per_sample(levels)


@pytest.mark.parametrize("profile, gpu_level", [(ORIN, 2), (AGX, 3)])
def test_a_lower_gpu_clock_costs_less_training_energy_when_compute_bound(profile, gpu_level):
    """The race-to-idle artefact is gone: billing the CPUs at full load for the stretched round
    made the lower GPU clock cost more; one core feeding the GPU makes it cost less."""
    dev = device(profile=profile)
    top = len(profile.domain("gpu").levels_khz) - 1
    # Compute-bound: the round is longer by the clock ratio.
    assert dev.expected_seconds_per_sample({"gpu": gpu_level}) > \
        1.2 * dev.expected_seconds_per_sample({"gpu": top})
    new_low, new_top = (energy_per_sample_j(dev, dev.train_w, lv) for lv in (gpu_level, top))
    old_low, old_top = (energy_per_sample_j(dev, dev.full_load_w, lv) for lv in (gpu_level, top))
    assert new_low < new_top
    assert old_low > old_top


def test_utilization_is_configurable_per_device():
    # One core spread over the Orin Nano's six: each cluster at 1/6.
    one_core = device(profile=ORIN, cpu_utilization_with_gpu=1 / 6.0)
    watts = ORIN.power_model.watts_per_level
    assert one_core.train_w({}) == pytest.approx(
        ORIN.power_model.idle_w + (watts["cpu0"][-1] + watts["cpu4"][-1]) / 6 + watts["gpu"][-1])
    half_gpu = device(profile=ORIN, gpu_utilization=0.5)
    assert half_gpu.train_w({}) == pytest.approx(device(profile=ORIN).train_w({})
                                                 - 0.5 * watts["gpu"][-1])
    two_cores = device(cpu_utilization_without_gpu=0.5)
    pi_watts = PI4.power_model.watts_per_level["cpu0"]
    assert two_cores.train_w({"cpu0": 9}) == pytest.approx(PI4.power_model.idle_w
                                                           + 0.5 * pi_watts[9])


# --- network ---------------------------------------------------------------------------------

def test_fixed_bandwidth_in_megabits():
    dev = device(up_mbps=8.0, down_mbps=80.0)
    assert dev.upload_s(1_000_000) == pytest.approx(1.0)  # 8e6 bit / 8e6 bit/s
    assert dev.download_s(1_000_000) == pytest.approx(0.1)
    assert dev.upload_s(0) == 0.0


def test_shannon_rate_falls_with_distance_and_matches_fedteddi():
    rates = [device(channel="shannon", distance_m=d).up_bps for d in (10, 50, 167, 250, 1000)]
    assert rates == sorted(rates, reverse=True) and rates[-1] > 0
    # FedTeddi V-A by hand: 23 dBm, 128.1 + 37.6 log10(0.167) dB, -174 dBm/Hz over 1 MHz.
    snr_db = 23 - (128.1 + 37.6 * math.log10(0.167)) - (-174 + 60)
    assert rates[2] == pytest.approx(1e6 * math.log2(1 + 10 ** (snr_db / 10)))
    dev = device(channel="shannon", server_tx_power_dbm=33.0)
    assert dev.down_bps > dev.up_bps  # the session paper's eq. 25: the server's power downlink
    assert dev.upload_s(10**6) == pytest.approx(8e6 / dev.up_bps)
    wide = device(channel="shannon", bandwidth_hz=20e6)
    assert wide.up_bps > dev.up_bps
    # Shadowing is drawn once per device, from its seed.
    assert device(seed=3, channel="shannon", shadowing_std_db=8.0).up_bps == \
        device(seed=3, channel="shannon", shadowing_std_db=8.0).up_bps != dev.up_bps


# --- availability ----------------------------------------------------------------------------

def test_availability_windows():
    dev = device(join_s=10.0, leave_s=100.0, offline=[(20.0, 30.0), (30.0, 40.0), (60.0, 70.0)])
    assert [dev.presence.available(t) for t in (0, 10, 19.9, 20, 35, 40, 65, 70, 99.9, 100)] == \
        [False, True, True, False, False, True, False, True, True, False]
    assert dev.presence.next_available_s(0.0) == 10.0
    assert dev.presence.next_available_s(15.0) == 15.0
    assert dev.presence.next_available_s(25.0) == 40.0  # touching windows are one stretch
    assert dev.presence.next_available_s(65.0) == 70.0
    assert dev.presence.next_available_s(100.0) is None
    assert dev.presence.next_unavailable_s(12.0) == 20.0
    assert dev.presence.next_unavailable_s(45.0) == 60.0
    assert dev.presence.next_unavailable_s(80.0) == 100.0
    assert dev.presence.next_unavailable_s(25.0) == 25.0
    forever = device(offline=[(5.0, math.inf)])
    assert forever.presence.next_available_s(6.0) is None and forever.presence.next_unavailable_s(1.0) == 5.0
    always = device()
    assert always.presence.available(1e9) and always.presence.next_unavailable_s(0.0) is None


@pytest.mark.parametrize("p", [0.0, 0.3, 1.0])
def test_participation_rate(p):
    dev = device(seed=11, participation=p)
    rate = np.mean([dev.participates() for _ in range(20000)])
    assert rate == pytest.approx(p, abs=0.015)


# --- configuration errors --------------------------------------------------------------------

@pytest.mark.parametrize("kw, match", [
    ({"speed": -1.0}, "speed"),
    ({"speed": 0.0}, "speed"),
    ({"board": "jetson-tx9"}, "unknown board profile"),
    ({"participation": 1.5}, "participation"),
    ({"offline": [(10.0, 20.0), (15.0, 30.0)]}, "overlap"),
    ({"offline": [(30.0, 40.0), (10.0, 20.0)]}, "sorted"),
    ({"offline": [(10.0, 10.0)]}, "not after"),
    ({"channel": "5g"}, "channel"),
    ({"leave_s": 5.0, "join_s": 5.0}, "leave_s"),
    ({"noise_scale": -0.1}, "noise_scale"),
    ({"distance_m": 0.0}, "distance_m"),
    ({"gpu_utilization": 1.5}, "gpu_utilization"),
    ({"cpu_utilization_with_gpu": -0.1}, "cpu_utilization_with_gpu"),
    ({"cpu_utilization_without_gpu": float("nan")}, "cpu_utilization_without_gpu"),
])
def test_bad_values_are_config_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        DeviceSpec(**kw)


def test_scenario_yaml_errors_name_the_file_and_key(tmp_path):
    spec = build(DeviceSpec, {"board": "jetson-nano", "offline": [[1, 2], [3, 4]]}, "scn.yaml")
    assert spec.offline == ((1.0, 2.0), (3.0, 4.0))
    with pytest.raises(ConfigError, match="scn.yaml.*speed"):
        build(DeviceSpec, {"speed": -2}, "scn.yaml")
    with pytest.raises(ConfigError, match="cannot read"):
        make_devices([DeviceSpec(profile_path=str(tmp_path / "missing.yaml"))], seed=0)
    with pytest.raises(ConfigError, match="seed"):
        make_devices([DeviceSpec()], seed=-1)


def test_statistics_after_training_count_as_work():
    dev = device()
    assert dev.work_samples(320, {}) == 320
    assert dev.work_samples(320, {"batched": 20}) == 340                      # one batched backward
    assert dev.work_samples(320, {"batched": 20, "per_window": 20}) == 390     # + 20 x 2.5
    assert device(per_window_backward_samples=1.0).work_samples(10, {"per_window": 4}) == 14
    with pytest.raises(ConfigError, match="per_window_backward_samples"):
        DeviceSpec(per_window_backward_samples=-1.0)
