"""Admission's fast path (the kernels' delta norm, the u.u magnitude proof) decides exactly as the plain
computation: the same norms to float32 rounding, the same rejections, the same clipped tensors."""
from dataclasses import replace

import numpy as np
import pytest

from streamfl.coordinator import admission as admission_module
from streamfl.coordinator.admission import AdmissionConfig, UpdateAdmission
from streamfl.coordinator.delta_norm import (
    MAX_PROOF_ELEMENTS, DeltaNorm, delta_of, norm_of, peak_abs, peak_unless_within,
)
from streamfl.coordinator.kernels import available
from factories import make_update

SHAPES = {"w": (64, 90), "u": (64, 16), "b": (64,), "h": (3, 16)}


def model(rng, scale=0.1):
    return {k: (rng.standard_normal(s) * scale).astype(np.float32) for k, s in SHAPES.items()}


@pytest.mark.parametrize("kernels", sorted(available()))
def test_the_delta_norm_is_the_plain_one_to_float32_rounding(kernels):
    rng = np.random.default_rng(0)
    delta_norm = DeltaNorm(available()[kernels]())
    for _ in range(20):
        base = model(rng)
        update = {k: v + (rng.standard_normal(v.shape) * 1e-3).astype(np.float32) for k, v in base.items()}
        fresh = {k: np.subtract(a, base[k], dtype=np.float32) for k, a in update.items()}
        assert delta_norm.norm(update, base) == pytest.approx(norm_of(fresh), rel=1e-6)
        assert all(np.array_equal(d.view(np.uint32), fresh[k].view(np.uint32))
                   for k, d in delta_of(update, base).items())
    if kernels == "numpy":  # numpy's kernel is numpy's dot on the same delta: the same bits
        assert delta_norm.norm(update, base) == norm_of(fresh)


def test_the_delta_is_left_to_the_general_path_unless_float32_tensors_match_the_base():
    base = model(np.random.default_rng(1))
    delta_norm = DeltaNorm()
    assert delta_norm.norm({k: v.astype(np.float64) for k, v in base.items()}, base) is None
    assert delta_norm.norm({"w": base["w"].T.copy()}, base) is None
    assert delta_norm.norm({"nope": base["b"]}, base) is None
    assert delta_norm.norm({"b": base["b"]}, base) == 0.0           # a subset of the names: fine


@pytest.mark.parametrize("cap", [1e4, 1.0, 0.3, 1e-12])
def test_the_magnitude_proof_never_lets_a_value_above_the_cap_through(cap):
    rng = np.random.default_rng(2)
    for trial in range(60):
        tensors = model(rng, scale=rng.choice([1e-3, 0.05, 0.2, 3.0]))
        if trial % 3 == 0:                                            # one spike near or over the cap
            name = rng.choice(list(tensors))
            tensors[name].reshape(-1)[rng.integers(tensors[name].size)] = np.float32(cap * rng.choice([0.9, 1.0, 1.01, 2.0]))
        exact = peak_abs(tensors)
        got = peak_unless_within(tensors, cap)
        assert got == exact if got is not None else exact <= cap


def test_non_finite_and_huge_tensors_take_the_exact_check():
    ok = {"w": np.full(8, 0.5, np.float32)}
    assert peak_unless_within(ok, 1e4) is None
    for bad in (np.inf, -np.inf, 1e30):
        tensors = {"w": np.array([0.5, bad], np.float32)}
        assert peak_unless_within(tensors, 1e4) == peak_abs(tensors)
    nan = {"w": np.array([0.5, np.nan], np.float32)}
    assert np.isnan(peak_unless_within(nan, 1e4)) and np.isnan(peak_abs(nan))
    big = {"w": np.zeros(MAX_PROOF_ELEMENTS + 1, np.float32)}
    assert peak_unless_within(big, 1e4) == 0.0                        # too many terms to prove


def _general_path(monkeypatch):
    """Make admission compute as it did before the fast path: fresh deltas, max/min always."""
    monkeypatch.setattr(admission_module, "peak_unless_within", lambda tensors, cap, squares=None: peak_abs(tensors))
    monkeypatch.setattr(DeltaNorm, "norm", lambda self, update, base: None)


def _run(updates, base):
    admission = UpdateAdmission(AdmissionConfig(warmup_updates=3, min_norm_ratio=1e-3, max_abs_value=5.0,
                                                max_updates_per_s=None))
    return [admission.check(u, base, True, float(i), fleet_size=4) for i, u in enumerate(updates)], admission


def test_admission_decides_as_the_general_path_does(monkeypatch):
    rng = np.random.default_rng(3)
    base = model(rng)
    updates = []
    for i in range(60):
        scale = [1e-3, 1e-2, 0.3, 3.0][i % 4] if i > 6 else 1e-3    # honest, outliers, scaled
        tensors = {k: v + (rng.standard_normal(v.shape) * scale).astype(np.float32) for k, v in base.items()}
        if i % 11 == 5:
            tensors["w"][0, 0] = np.float32(50.0)                     # over max_abs_value
        updates.append(make_update(base, device_id="d%d" % (i % 4), tensors=tensors, num_samples=100 + i))
    fast, fast_admission = _run(updates, base)
    with monkeypatch.context() as patch:
        _general_path(patch)
        plain, plain_admission = _run(updates, base)
    assert fast_admission.counters == plain_admission.counters
    assert {"clipped", "rejected_norm", "rejected_magnitude"} <= set(fast_admission.counters)
    fast_votes, plain_votes = fast_admission.state()["votes"], plain_admission.state()["votes"]
    assert fast_votes.keys() == plain_votes.keys()
    assert all(fast_votes[d] == pytest.approx(plain_votes[d], rel=1e-6, abs=2e-6) for d in fast_votes)
    for a, b in zip(fast, plain):
        assert replace(a, update=None, delta_norm=None, bound=None) == replace(b, update=None, delta_norm=None, bound=None)
        assert (a.delta_norm is None) == (b.delta_norm is None) and (a.bound is None) == (b.bound is None)
        assert a.delta_norm is None or a.delta_norm == pytest.approx(b.delta_norm, rel=1e-6)
        assert a.bound is None or a.bound == pytest.approx(b.bound, rel=1e-6)
        assert (a.update is None) == (b.update is None)
        if a.update is not None and not a.clipped:  # a clip scales by bound / norm: rounding apart
            assert all(np.array_equal(a.update.tensors[k].view(np.uint32), b.update.tensors[k].view(np.uint32))
                       for k in base)
        elif a.update is not None:
            assert all(np.allclose(a.update.tensors[k], b.update.tensors[k], rtol=1e-5, atol=1e-6) for k in base)


def _decoded(tensors, writable=False, deferred=False, **fields):
    from streamfl.protocol.codec import Decoder, encode
    from streamfl.protocol.messages import Update
    fields.setdefault("device_id", "d1")
    update = make_update(tensors, tensors=tensors, **fields)
    spec = {k: (v.shape, "float32") for k, v in tensors.items()}
    return Decoder({update.arch_id: spec}, writable=writable,
                   receiver_checks_finite=(Update,) if deferred else ()).decode(encode(update))


def test_decoded_tensors_bring_the_finiteness_checks_sum_of_squares_while_they_are_the_decoded_ones():
    from streamfl.protocol.codec import DecodedTensors
    tensors = model(np.random.default_rng(4))
    got = _decoded(tensors).tensors
    assert isinstance(got, DecodedTensors)
    squares, elements = got.measured_squares()
    assert elements == sum(v.size for v in tensors.values())
    assert squares == pytest.approx(sum(float((v.astype(np.float64) ** 2).sum()) for v in tensors.values()), rel=1e-5)
    got["w"] = np.zeros_like(tensors["w"])                           # no longer what was measured
    assert got.measured_squares() is None
    assert not isinstance(_decoded(tensors, writable=True).tensors, DecodedTensors)


def test_a_decoded_value_over_the_cap_is_still_rejected():
    base = model(np.random.default_rng(5))
    for value in (5.0001, -7.0, 3e38):
        tensors = {k: v.copy() for k, v in base.items()}
        tensors["u"][1, 2] = np.float32(value)
        admission = UpdateAdmission(AdmissionConfig(max_abs_value=5.0, max_updates_per_s=None))
        verdict = admission.check(_decoded(tensors), base, True)
        assert verdict.reason == "magnitude"
    admission = UpdateAdmission(AdmissionConfig(max_abs_value=5.0, max_updates_per_s=None))
    assert admission.check(_decoded(base), base, True).update is not None


def test_a_decoder_that_leaves_the_finiteness_check_to_admission_marks_the_tensors_it_left():
    from streamfl.protocol.codec import DecodedTensors, Decoder, encode
    from streamfl.errors import ProtocolError
    from streamfl.protocol.messages import GlobalModel, Update
    tensors = model(np.random.default_rng(6))
    tensors["w"][3, 4] = np.nan
    got = _decoded(tensors, deferred=True).tensors                   # decoded, NaN and all
    assert isinstance(got, DecodedTensors) and not got.finite and got.measured_squares() is None
    assert np.isnan(got["w"][3, 4])
    with pytest.raises(ProtocolError) as err:                         # a decoder that checks
        _decoded(tensors)
    assert err.value.reason == "non_finite"
    with pytest.raises(ProtocolError):                                # a writable frame is checked
        _decoded(tensors, writable=True, deferred=True)
    assert _decoded(model(np.random.default_rng(6)), deferred=True).tensors.finite is False
    assert _decoded(model(np.random.default_rng(6))).tensors.finite is True
    spec = {k: (v.shape, "float32") for k, v in tensors.items()}
    deferring = Decoder({"test-arch": spec}, receiver_checks_finite=(Update,))
    with pytest.raises(ProtocolError):                                # other types are checked
        deferring.decode(encode(GlobalModel(version=1, arch_id="test-arch", tensors=tensors)))


def test_a_deferring_decoder_still_checks_an_updates_extras():
    from streamfl.errors import ProtocolError
    from streamfl.protocol.codec import Decoder, encode
    from streamfl.methods.fedcurv.payloads import CurvatureDiagonal
    from streamfl.protocol.messages import Update
    tensors = model(np.random.default_rng(7))
    fisher = {k: np.abs(v) for k, v in tensors.items()}
    fisher["b"][0] = np.inf
    update = make_update(tensors, tensors=tensors, extras={CurvatureDiagonal.KIND: CurvatureDiagonal(fisher)})
    spec = {k: (v.shape, "float32") for k, v in tensors.items()}
    with pytest.raises(ProtocolError) as err:
        Decoder({update.arch_id: spec}, receiver_checks_finite=(Update,)).decode(encode(update))
    assert err.value.reason == "non_finite"


@pytest.mark.parametrize("kernels", sorted(available()))
def test_admission_rejects_a_non_finite_update_the_decoder_left_to_it_before_it_votes(kernels):
    from streamfl.coordinator.kernels import available as found
    base = model(np.random.default_rng(8))
    for bad in (np.nan, np.inf, -np.inf):
        tensors = {k: v.copy() for k, v in base.items()}
        tensors["u"][5, 6] = np.float32(bad)
        admission = UpdateAdmission(AdmissionConfig(max_updates_per_s=None), kernels=found()[kernels]())
        verdict = admission.check(_decoded(tensors, deferred=True), base, True)
        assert verdict.update is None and verdict.reason == "magnitude" and verdict.delta_norm is None
        assert admission.counters["rejected_magnitude"] == 1 and admission.state()["votes"] == {}
    for value in (5.0001, -7.0, 3e38):                                # finite, over the cap
        tensors = {k: v.copy() for k, v in base.items()}
        tensors["u"][1, 2] = np.float32(value)
        admission = UpdateAdmission(AdmissionConfig(max_abs_value=5.0, max_updates_per_s=None),
                                    kernels=found()[kernels]())
        verdict = admission.check(_decoded(tensors, deferred=True), base, True)
        assert verdict.reason == "magnitude"


@pytest.mark.parametrize("kernels", sorted(available()))
def test_admission_decides_the_same_whether_the_decoder_or_its_own_pass_checked_finiteness(kernels):
    from streamfl.coordinator.kernels import available as found
    rng = np.random.default_rng(9)
    base = model(rng)
    runs = []
    for deferred in (False, True):
        admission = UpdateAdmission(AdmissionConfig(warmup_updates=3, min_norm_ratio=1e-3, max_abs_value=5.0,
                                                    max_updates_per_s=None), kernels=found()[kernels]())
        draws = np.random.default_rng(10)
        verdicts = []
        for i in range(40):
            scale = [1e-3, 1e-2, 0.3, 3.0][i % 4] if i > 6 else 1e-3
            tensors = {k: v + (draws.standard_normal(v.shape) * scale).astype(np.float32) for k, v in base.items()}
            if i % 11 == 5:
                tensors["w"][0, 0] = np.float32(50.0)
            update = _decoded(tensors, deferred=deferred, device_id="d%d" % (i % 4), num_samples=100 + i)
            verdicts.append(admission.check(update, base, True, float(i), fleet_size=4))
        runs.append((verdicts, admission))
    (checked, a), (deferred, b) = runs
    assert a.counters == b.counters and {"clipped", "rejected_norm", "rejected_magnitude"} <= set(a.counters)
    assert a.state() == b.state()
    for x, y in zip(checked, deferred):
        assert replace(x, update=None) == replace(y, update=None)
        if x.update is not None:
            assert all(np.array_equal(x.update.tensors[k], y.update.tensors[k]) for k in base)
