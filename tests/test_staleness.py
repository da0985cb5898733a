"""FedAsync staleness functions at known points (Xie et al. 2019, FedAsync)."""
import pytest

from streamfl.coordinator.strategies.staleness import constant, hinge, make_staleness, polynomial


def test_constant_is_one_at_any_staleness():
    s = make_staleness("constant")
    assert [s(t) for t in (0, 1, 10, 1000)] == [1.0, 1.0, 1.0, 1.0]
    assert constant(-5) == 1.0


def test_polynomial_default_exponent_half():
    s = make_staleness("polynomial")
    assert s(0) == 1.0
    assert s(3) == pytest.approx(0.5)          # (3 + 1) ** -0.5
    assert s(8) == pytest.approx(1.0 / 3.0)    # (8 + 1) ** -0.5
    assert s(1) > s(2) > s(100) > 0


def test_polynomial_custom_exponent():
    s = make_staleness("polynomial", a=1.0)
    assert s(1) == pytest.approx(0.5)
    assert s(3) == pytest.approx(0.25)


def test_hinge_defaults_a10_b4():
    s = make_staleness("hinge")
    assert [s(t) for t in range(5)] == [1.0] * 5
    assert s(5) == pytest.approx(1.0 / 11.0)   # 1 / (10 * (5 - 4) + 1)
    assert s(6) == pytest.approx(1.0 / 21.0)
    assert hinge(7, a=2.0, b=1.0) == pytest.approx(1.0 / 13.0)


def test_negative_staleness_clamped_to_zero():
    assert make_staleness("polynomial")(-3) == 1.0
    assert polynomial(-1, 0.5) == 1.0
    assert make_staleness("hinge")(-10) == 1.0


def test_unknown_or_invalid_parameters_rejected():
    with pytest.raises(ValueError, match="unknown staleness"):
        make_staleness("exponential")
    with pytest.raises(ValueError):
        make_staleness("polynomial", a=-1.0)
    with pytest.raises(ValueError):
        make_staleness("hinge", b=-1.0)
