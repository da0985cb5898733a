"""Update admission: unknown senders, poisoned values and scaled models never reach the strategy;
honest outliers are clipped, not lost; robust FedAvg rounds shrug off one hostile device."""
import numpy as np
import pytest

from factories import SPEC, greet, make_update
from streamfl.config import build
from streamfl.coordinator.admission import AdmissionConfig, UpdateAdmission, admission_counters
from streamfl.coordinator.config import CoordinatorConfig, FedAvgConfig
from streamfl.coordinator.core import CoordinatorCore
from streamfl.coordinator.strategies.fedavg import FedAvgAggregator
from streamfl.coordinator.strategies.robust import coordinate_median, trimmed_count, trimmed_mean
from streamfl.errors import ConfigError


def honest(core, device="d1", scale=0.01, seed=0, **kw):
    """An update a little way from the current global model, as local training makes."""
    rng = np.random.default_rng(seed)
    tensors = {k: v + np.float32(scale) * rng.standard_normal(v.shape).astype(np.float32)
               for k, v in core.model.items()}
    return make_update(SPEC, device_id=device, base_version=core.version, tensors=tensors, **kw)


def norm(tensors):
    return float(np.sqrt(sum(float((a.astype(np.float64) ** 2).sum()) for a in tensors.values())))


def test_only_devices_that_said_hello_count():
    core = CoordinatorCore(CoordinatorConfig(model=SPEC))
    rec = core.on_update(honest(core, "ghost"), 1.0).update
    assert rec.outcome == "rejected" and rec.fields["reason"] == "unknown_device"
    assert core.version == 0 and "ghost" not in core.devices()      # not registered by its update
    greet(core, "d1")
    assert core.on_update(honest(core, "d1"), 2.0).update.aggregated and core.version == 1


def test_enrollment_file_decides_who_counts(tmp_path):
    path = tmp_path / "fleet.txt"
    path.write_text("# the lab's boards\npi-01\npi-02  # the spare\n")
    config = build(CoordinatorConfig, {"model": SPEC, "admission": {"enrollment_file": str(path)}}, "t")
    assert config.admission.enrolled == {"pi-01", "pi-02"}
    core = greet(CoordinatorCore(config), "intruder")                # a Hello is not enough
    assert core.on_update(honest(core, "intruder"), 1.0).update.fields["reason"] == "unknown_device"
    assert core.on_update(honest(core, "pi-02"), 1.0).update.aggregated  # enrolled: no Hello needed
    path.write_text("pi 01\n")
    with pytest.raises(ConfigError, match="line 1"):
        build(CoordinatorConfig, {"model": SPEC, "admission": {"enrollment_file": str(path)}}, "t")
    with pytest.raises(ConfigError, match="cannot be read"):
        build(CoordinatorConfig, {"model": SPEC, "admission": {"enrollment_file": str(tmp_path / "no")}}, "t")


def test_poisoned_and_scaled_updates_are_rejected_by_reason():
    core = greet(CoordinatorCore(CoordinatorConfig(model=SPEC)), "d1", "evil")
    before = {k: v.copy() for k, v in core.model.items()}
    huge = make_update(SPEC, 1e30, device_id="evil")                 # finite, so it decodes
    assert core.on_update(huge, 1.0).update.fields["reason"] == "magnitude"
    scaled = {k: v * np.float32(1000) for k, v in core.model.items()}
    rec = core.on_update(make_update(SPEC, device_id="evil", tensors=scaled), 2.0).update
    assert rec.outcome == "rejected" and rec.fields["reason"] == "norm" and rec.fields["delta_norm"] > 0
    assert core.version == 0 and all(np.array_equal(core.model[k], before[k]) for k in before)
    assert core.on_update(honest(core), 3.0).update.aggregated
    counters = admission_counters(core.admission)
    assert counters["admission_rejected_magnitude"] == 1 and counters["admission_rejected_norm"] == 1
    assert counters["admission_accepted"] == 1 and counters["admission_clipped"] == 0
    assert core.counters["rejected"] == 2


def test_an_outlier_is_clipped_to_the_bound_not_dropped():
    admission = UpdateAdmission(AdmissionConfig(warmup_updates=3, min_norm_ratio=1e-6))
    base = {"w": np.zeros(100, np.float32), "b": np.ones(10, np.float32)}
    for i in range(3):                                                # warm-up: three deltas of 0.1
        delta = np.zeros(100, np.float32)
        delta[i] = 0.1
        verdict = admission.check(make_update(base, device_id="d", tensors={"w": delta, "b": base["b"]}),
                                  base, said_hello=True)
        assert verdict.update is not None and not verdict.clipped
    assert admission.bound(base) == pytest.approx(0.3)               # 3 x median 0.1
    far = {"w": np.full(100, 0.1, np.float32), "b": base["b"]}        # delta norm 1.0: clip, not reject
    verdict = admission.check(make_update(base, device_id="d", tensors=far), base, said_hello=True)
    assert verdict.clipped and verdict.delta_norm == pytest.approx(1.0, rel=1e-5)
    got = verdict.update.tensors
    assert norm({"w": got["w"] - base["w"], "b": got["b"] - base["b"]}) == pytest.approx(0.3, rel=1e-5)
    np.testing.assert_allclose(got["w"], 0.03, rtol=1e-5)            # same direction, shorter
    assert admission.counters["clipped"] == 1
    again = UpdateAdmission(AdmissionConfig(warmup_updates=3, min_norm_ratio=1e-6))
    again.load_state(admission.state())                               # a restart keeps the bound
    assert again.bound(base) == pytest.approx(admission.bound(base))


def test_the_bound_never_falls_below_a_share_of_the_model():
    admission = UpdateAdmission(AdmissionConfig(warmup_updates=1, min_norm_ratio=0.25))
    base = {"w": np.full(4, 2.0, np.float32)}                          # norm 4
    admission.check(make_update(base, device_id="d", tensors=dict(base)), base, said_hello=True)
    assert admission.bound(base) == pytest.approx(1.0)                 # median 0, floor 0.25 x 4
    tiny = {"w": base["w"] + np.float32(1e-4)}                         # rounding noise stays honest
    assert admission.check(make_update(base, device_id="d", tensors=tiny), base, True).update is not None


def test_admission_settings_are_checked():
    for bad in ({"max_abs_value": 0}, {"norm_multiplier": -1}, {"reject_multiplier": 0.5},
                {"vote_ttl_s": 0}, {"min_norm_ratio": 0}):
        with pytest.raises(ConfigError, match="admission"):
            build(CoordinatorConfig, {"admission": bad}, "t")


# ---- robust FedAvg ----------------------------------------------------------------------------

def _updates(values):
    return [make_update({"w": np.zeros(3, np.float32)}, float(v), device_id="d%d" % i, num_samples=10)
            for i, v in enumerate(values)]


def test_median_and_trimmed_mean_ignore_one_hostile_device():
    ups = _updates([1.0, 1.1, 0.9, 1.0, 1000.0])
    np.testing.assert_allclose(coordinate_median(ups)["w"], 1.0)
    assert trimmed_count(5, 0.2) == 1 and trimmed_count(2, 0.4) == 0
    np.testing.assert_allclose(trimmed_mean(ups, 0.2)["w"], 3.1 / 3, rtol=1e-6)   # drops 1000 and 0.9
    with pytest.raises(ValueError):
        trimmed_mean(ups, 0.5)


@pytest.mark.parametrize("combine, expected", [("mean", 200.8), ("median", 1.0), ("trimmed_mean", 3.1 / 3)])
def test_fedavg_combine_option(combine, expected):
    online = ["d%d" % i for i in range(5)]
    agg = FedAvgAggregator(online_devices=lambda: online, combine=combine, trim_ratio=0.2)
    model = {"w": np.zeros(3, np.float32)}
    out = None
    for u in _updates([1.0, 1.1, 0.9, 1.0, 1000.0]):
        out = agg.on_update(model, 0, u, 0.0)
    np.testing.assert_allclose(out.model["w"], expected, rtol=1e-5)
    with pytest.raises(ConfigError, match="combine"):
        build(CoordinatorConfig, {"strategy": "fedavg", "fedavg": {"combine": "mode"}}, "t")


def test_a_fedavg_round_opened_before_any_device_registered_does_not_wait_for_the_deadline():
    core = CoordinatorCore(CoordinatorConfig(model=SPEC, strategy="fedavg",
                                             fedavg=FedAvgConfig(deadline_s=60.0)))
    assert core.tick(0.0).new_version is None                          # round 0 opens, nobody online
    greet(core, "d1", now=1.0)
    step = core.on_update(honest(core, "d1"), 2.0)                     # the only device reported
    assert step.new_version == 1, step.update.outcome
