"""The kernels as single compiled loops (numba): each reads its inputs once, where numpy passes over them several times.

Compiled on first use (about half a second) and cached on disk (beside the module, or in
``NUMBA_CACHE_DIR``, or the user's cache folder), so a restarted coordinator does not compile
again. Where no such folder is writable (a read-only install under a sandboxed service without
``NUMBA_CACHE_DIR``: the shipped unit sets one) the loops compile at each start instead, with a
WARNING, rather than the coordinator failing to start.

Only the sums of squares may be reordered (``fastmath={"reassoc"}``, so that they vectorize; in
float64, where the float32 squares are exact); the mix is compiled without any fast-math flag, so
no multiply-add is fused and its bits are numpy's. One loop sums the delta's squares and the
update's own: the second costs nothing in a pass bound by memory, so ``delta_squares`` is its
first half.
"""
import logging
from typing import Tuple

import numba
import numpy as np

from streamfl.coordinator.kernels.base import Kernels

log = logging.getLogger(__name__)


def _compiled(**options):
    """``numba.njit`` with an on-disk cache where numba finds a writable folder, else without one."""
    def decorate(fn):
        try:
            return numba.njit(cache=True, **options)(fn)
        except RuntimeError as exc:  # numba: "cannot cache function ...: no locator available"
            log.warning("numba cannot cache %s (%s): it compiles at each start, about half a second; "
                        "set NUMBA_CACHE_DIR to a writable folder", fn.__name__, exc)
            return numba.njit(**options)(fn)
    return decorate


@_compiled(nogil=True, fastmath={"reassoc"})
def _delta_and_update_squares(update, base):  # pragma: no cover - compiled; run by the contract suite
    delta = 0.0
    own = 0.0
    for i in range(update.size):
        u = update[i]
        d = np.float32(u - base[i])
        delta += np.float64(d) * np.float64(d)
        own += np.float64(u) * np.float64(u)
    return delta, own


@_compiled(nogil=True)
def _mix_into(out, model, update, keep, take):  # pragma: no cover - compiled; run by the contract suite
    for i in range(out.size):
        out[i] = keep * model[i] + take * update[i]


class NumbaKernels(Kernels):
    """One compiled pass per kernel; stateless, so one instance serves every caller."""

    name = "numba"

    def delta_squares(self, update: np.ndarray, base: np.ndarray) -> float:
        return float(_delta_and_update_squares(update, base)[0])

    def delta_and_update_squares(self, update: np.ndarray, base: np.ndarray) -> Tuple[float, float]:
        delta, own = _delta_and_update_squares(update, base)
        return float(delta), float(own)

    def mix_into(self, out: np.ndarray, model: np.ndarray, update: np.ndarray,
                 keep: np.float32, take: np.float32) -> None:
        _mix_into(out, model, update, np.float32(keep), np.float32(take))
