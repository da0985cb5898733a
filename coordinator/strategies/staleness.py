"""FedAsync staleness functions s(t - tau) (Xie et al. 2019, "Asynchronous Federated Optimization").

An update trained from version tau arriving at server version t is mixed in with weight
``alpha * s(t - tau)``; older updates weigh less. Negative staleness (an update from a version
the coordinator does not know, e.g. after it lost its state) is clamped to 0.
"""
from typing import Callable, Optional

#: ``s(staleness) -> weight factor in (0, 1]``.
StalenessFn = Callable[[int], float]

#: Paper defaults: polynomial a = 0.5; hinge a = 10, b = 4 (FedAsync sec. 5).
POLYNOMIAL_A = 0.5
HINGE_A = 10.0
HINGE_B = 4.0

STALENESS_NAMES = ("constant", "polynomial", "hinge")


def staleness_of(version: int, base_version: int) -> int:
    """``t - tau``: versions made since ``base_version`` when merged into ``version``, clamped at 0
    (a base from the future means the coordinator lost its state). The one staleness convention:
    update records, FedAsync's weight and the simulator's per-round figures all use it."""
    return max(0, int(version) - int(base_version))


def constant(staleness: int) -> float:
    """s = 1: every update weighs alpha, however old."""
    return 1.0


def polynomial(staleness: int, a: float = POLYNOMIAL_A) -> float:
    """s = (t - tau + 1)^-a: smooth decay."""
    return float((max(0, staleness) + 1) ** -a)


def hinge(staleness: int, a: float = HINGE_A, b: float = HINGE_B) -> float:
    """s = 1 while t - tau <= b, then 1 / (a (t - tau - b) + 1): free grace period, then decay."""
    st = max(0, staleness)
    if st <= b:
        return 1.0
    return 1.0 / (a * (st - b) + 1.0)


def make_staleness(name: str, a: Optional[float] = None, b: Optional[float] = None) -> StalenessFn:
    """The staleness function ``name`` with parameters ``a``/``b`` (None = the paper's default)."""
    if name == "constant":
        return constant
    if name == "polynomial":
        pa = POLYNOMIAL_A if a is None else float(a)
        if pa < 0:
            raise ValueError("polynomial staleness a must be >= 0, got %r" % pa)
        return lambda staleness: polynomial(staleness, pa)
    if name == "hinge":
        ha = HINGE_A if a is None else float(a)
        hb = HINGE_B if b is None else float(b)
        if ha < 0 or hb < 0:
            raise ValueError("hinge staleness a and b must be >= 0, got a=%r b=%r" % (ha, hb))
        return lambda staleness: hinge(staleness, ha, hb)
    raise ValueError("unknown staleness function %r (known: %s)" % (name, ", ".join(STALENESS_NAMES)))
