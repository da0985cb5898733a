"""Per-device share caps: leave-one-out medians, the factors they give, and an incremental capped sum
that equals the sum computed from scratch after any sequence of puts and removes."""
import numpy as np
import pytest

from streamfl.coordinator.shares import CappedSum, capped, leave_one_out_medians, peer_scales


def test_leave_one_out_medians_match_the_definition():
    rng = np.random.default_rng(0)
    for n in range(1, 9):
        values = {str(i): float(v) for i, v in enumerate(rng.integers(0, 5, n))}
        got = leave_one_out_medians(values)
        for key in values:
            others = [v for k, v in values.items() if k != key]
            assert got[key] == (None if not others else pytest.approx(float(np.median(others))))


def test_one_device_cannot_own_a_sum():
    sizes = {"a": 1.0, "b": 1.2, "c": 0.9, "mallory": 1e30}
    scales = peer_scales(sizes, multiple=4.0)
    assert scales["a"] == scales["b"] == scales["c"] == 1.0
    held = sizes["mallory"] * scales["mallory"]
    assert held == pytest.approx(4.0 * 1.0)            # 4 x the median of the others
    assert held / (held + 1.0 + 1.2 + 0.9) < 4 / (4 + 3 - 1) + 1e-9
    assert peer_scales({"alone": 1e30}, 4.0) == {"alone": 1.0}


def test_capped_scalar():
    assert capped(1e9, [1.0, 2.0, 3.0], 2.0) == 4.0
    assert capped(1.5, [1.0, 2.0, 3.0], 2.0) == 1.5
    assert capped(1e9, [], 2.0) == 1e9
    assert capped(1e9, [0.0, 0.0], 2.0, floor=5.0) == 5.0


def _scratch(parts, multiple):
    scales = peer_scales({k: s for k, (s, _) in parts.items()}, multiple)
    out = {}
    for key, (_, groups) in parts.items():
        for group, tensors in groups.items():
            for name, a in tensors.items():
                out.setdefault(group, {}).setdefault(name, 0.0)
                out[group][name] = out[group][name] + scales[key] * a.astype(np.float64)
    return out


def test_capped_sum_is_the_scratch_sum_after_any_history():
    rng = np.random.default_rng(1)
    total = CappedSum(3.0)
    parts = {}
    for step in range(200):
        device = "d%d" % rng.integers(0, 6)
        if rng.random() < 0.15 and device in parts:
            total.remove(device)
            del parts[device]
            continue
        scale = 1e6 if rng.random() < 0.1 else 1.0          # now and then a device claims a lot
        f = (rng.random((3, 2)) * scale).astype(np.float32)
        groups = {"F": {"w": f}, "FW": {"w": f * 2}}
        size = float(f.sum())
        total.put(device, size, groups)
        parts[device] = (size, groups)
        want = _scratch(parts, 3.0)
        for group in want:
            for name in want[group]:
                np.testing.assert_allclose(total.sums()[group][name], want[group][name], rtol=1e-6,
                                           atol=1e-6 * max(1.0, float(np.abs(want[group][name]).max())))
    assert len(total) == len(parts)
