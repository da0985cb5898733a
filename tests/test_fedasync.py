"""FedAsync arithmetic: x <- (1 - a) x + a x_new with a = alpha * s(t - tau), exactly."""
import numpy as np
import pytest

from streamfl.coordinator.kernels import available
from streamfl.coordinator.strategies import AGGREGATED, STALE, FedAsyncAggregator, Outcome, make_staleness
from streamfl.protocol.messages import Update


def update(tensors, base_version=0, device="d1", uid="u1"):
    return Update(device_id=device, update_id=uid, base_version=base_version, arch_id="a",
                  tensors=tensors, num_samples=10, class_counts={0: 10}, loss=0.5,
                  seconds_per_sample=0.01)


def f32(*values):
    return np.array(values, dtype=np.float32)


def test_mix_with_constant_staleness_is_exact():
    agg = FedAsyncAggregator(alpha=0.5)
    model = {"w": f32(1.0, 2.0), "b": f32(-4.0)}
    u = update({"w": f32(3.0, 6.0), "b": f32(0.0)})
    out = agg.on_update(model, 0, u, now=0.0)
    assert out.kind == AGGREGATED and out.merged == (u,) and out.mixing_weight == 0.5
    new = out.model
    np.testing.assert_array_equal(new["w"], f32(2.0, 4.0))
    np.testing.assert_array_equal(new["b"], f32(-2.0))
    assert new["w"].dtype == np.float32
    # the old model is untouched (shared with the history and the publisher)
    np.testing.assert_array_equal(model["w"], f32(1.0, 2.0))


@pytest.mark.parametrize("kernels", sorted(available()))
def test_the_mix_gives_the_whole_tensor_numpy_bits_with_every_kernel(kernels):
    # Tensors across numpy's block edges (one element short of, at and past a block), a matrix, a
    # scalar and a float64 update: each element is the three float32 operations of a plain mix.
    from streamfl.coordinator.kernels.numpy_kernels import MIX_BLOCK_ELEMENTS as B
    rng = np.random.default_rng(7)
    shapes = {"short": (B - 1,), "exact": (B,), "past": (2 * B + 7,), "matrix": (300, 517), "scalar": ()}
    model = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    new = {k: (v + rng.standard_normal(v.shape)).astype(np.float64 if k == "matrix" else np.float32)
           for k, v in model.items()}
    for weight in (0.6, 1.0 / 3.0, 1e-7):
        keep, take = np.float32(1.0 - weight), np.float32(weight)
        got = FedAsyncAggregator(alpha=0.6, kernels=available()[kernels]()).mix(model, new, weight)
        for k, x in model.items():
            want = np.multiply(x, keep, dtype=np.float32)
            want += np.multiply(new[k].astype(np.float32), take, dtype=np.float32)
            assert got[k].dtype == np.float32 and got[k].shape == x.shape
            assert got[k].tobytes() == want.tobytes(), k


def test_staleness_lowers_the_mixing_weight():
    agg = FedAsyncAggregator(alpha=0.5, staleness_fn=make_staleness("polynomial"))
    model = {"w": f32(1.0, 2.0)}
    # version 3, trained from 0: s = (3 + 1) ** -0.5 = 0.5, a = 0.25
    new = agg.on_update(model, 3, update({"w": f32(3.0, 6.0)}, base_version=0), now=0.0)
    assert new.mixing_weight == pytest.approx(0.25)
    np.testing.assert_array_equal(new.model["w"], f32(1.5, 3.0))
    fresh = agg.on_update(model, 3, update({"w": f32(3.0, 6.0)}, base_version=3), now=0.0)
    np.testing.assert_array_equal(fresh.model["w"], f32(2.0, 4.0))


def test_matches_float64_formula_on_random_tensors():
    rng = np.random.default_rng(0)
    alpha = 0.7
    s = make_staleness("hinge")
    agg = FedAsyncAggregator(alpha=alpha, staleness_fn=s)
    x = {"w": rng.standard_normal((16, 8)).astype(np.float32)}
    x_new = {"w": rng.standard_normal((16, 8)).astype(np.float32)}
    out = agg.on_update(x, 10, update(x_new, base_version=4), now=0.0).model   # staleness 6
    a = alpha * s(6)
    expected = (1 - a) * x["w"].astype(np.float64) + a * x_new["w"].astype(np.float64)
    np.testing.assert_allclose(out["w"], expected, rtol=1e-6, atol=1e-7)


def test_max_staleness_drops_and_counts():
    agg = FedAsyncAggregator(alpha=0.6, max_staleness=2)
    model = {"w": f32(1.0)}
    assert agg.on_update(model, 5, update({"w": f32(2.0)}, base_version=2), now=0.0) == Outcome(STALE)
    assert agg.stale_dropped == 1
    assert agg.on_update(model, 5, update({"w": f32(2.0)}, base_version=3), now=0.0).model is not None
    assert agg.stale_dropped == 1


def test_future_base_version_counts_as_fresh():
    agg = FedAsyncAggregator(alpha=0.5, staleness_fn=make_staleness("polynomial"), max_staleness=0)
    out = agg.on_update({"w": f32(0.0)}, 2, update({"w": f32(2.0)}, base_version=9), now=0.0).model
    np.testing.assert_array_equal(out["w"], f32(1.0))


def test_float16_update_tensors_are_accepted():
    agg = FedAsyncAggregator(alpha=0.5)
    out = agg.on_update({"w": f32(1.0)}, 0, update({"w": np.array([3.0], dtype=np.float16)}), now=0.0).model
    assert out["w"].dtype == np.float32 and out["w"][0] == 2.0


def test_state_round_trip_and_alpha_validation():
    agg = FedAsyncAggregator(alpha=0.6, max_staleness=0)
    agg.on_update({"w": f32(1.0)}, 3, update({"w": f32(2.0)}, base_version=0), now=0.0)
    agg.on_update({"w": f32(1.0)}, 3, update({"w": f32(2.0)}, base_version=3), now=0.0)
    other = FedAsyncAggregator(alpha=0.6)
    other.load_state(agg.state())
    assert other.stale_dropped == 1
    # the saved state keeps its format: the last mixing weight under "last_weight"
    assert agg.state() == {"stale_dropped": 1, "last_weight": 0.6} == other.state()
    assert not hasattr(agg, "last_weight") and not hasattr(agg, "last_outcome")
    with pytest.raises(ValueError):
        FedAsyncAggregator(alpha=0.0)
    with pytest.raises(ValueError):
        FedAsyncAggregator(alpha=1.5)


def test_a_methods_weight_factor_scales_the_mixing_weight_up_to_one():
    agg = FedAsyncAggregator(alpha=0.5)
    model = {"w": f32(0.0, 0.0)}
    half = agg.on_update(model, 0, update({"w": f32(4.0, 8.0)}), now=0.0, weight=0.5)
    assert half.mixing_weight == pytest.approx(0.25)
    np.testing.assert_array_equal(half.model["w"], f32(1.0, 2.0))
    replaced = agg.on_update(model, 0, update({"w": f32(4.0, 8.0)}), now=0.0, weight=10.0)
    assert replaced.mixing_weight == 1.0
    np.testing.assert_array_equal(replaced.model["w"], f32(4.0, 8.0))
    kept = agg.on_update(model, 0, update({"w": f32(4.0, 8.0)}), now=0.0, weight=0.0)
    assert kept.kind == AGGREGATED and kept.mixing_weight == 0.0
    np.testing.assert_array_equal(kept.model["w"], f32(0.0, 0.0))
