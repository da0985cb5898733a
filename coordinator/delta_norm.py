"""An update's delta from its base and the delta's norm, in reused buffers, with a magnitude check for free.

Admission needs, for every update, ``d = update - base`` (to clip it), ``||d||_2`` and whether any
``|w| > max_abs_value``. Done plainly that is four passes over a 2 MB update plus a fresh 2 MB
array per update (max, min, subtract, dot): half of what the coordinator spent on an update
(``bench/bench_coordinator.py``). Here it is two passes and no allocation:

* ``d`` is written into float32 buffers (``DeltaBuffers``) kept from one update to the next: one
  model's worth, which the plain code allocated per update anyway; the same ``np.subtract``;
* ``||d||`` is the same per-tensor ``np.dot(d, d)``, summed in the same order: the same bits as
  before, so the bound, the votes and the clips do not move (the simulator's figures depend on
  them). The delta is computed, never ``|u|^2 - 2 u.b + |b|^2``, which cancels catastrophically
  for an update close to its base;
* the magnitude check (``peak_unless_within``) starts from ``s = sum(u . u)``, which the decoder's
  finiteness check computed already (``DecodedTensors``; else one BLAS pass here). Since
  ``max|u_i| <= ||u||_2``, ``s <= max_abs_value^2 / 4`` proves every value within the cap. The
  factor 4 covers float32 rounding: a sum of at most ``2^22`` squares, in any order, is at least
  2/3 of the true one (Higham, "Accuracy and Stability of Numerical Algorithms", eq. 3.5:
  ``gamma_n = n u / (1 - n u) <= 1/3`` for ``n u <= 1/4``), and a cap of at least ``1e-9`` keeps
  the underflow of tiny squares (``2^-126`` at most each) negligible. Otherwise (a value near the
  cap, NaN, Inf, more terms) the exact ``max``/``min`` pass decides, as before: the same updates
  are rejected, with the same peak in the message.

Tensors that are not float32 shaped like the base's take the caller's general path (None).
"""
import math
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np

from streamfl.protocol.codec import DecodedTensors

#: Most terms a float32 ``sum(u . u)`` may have and still prove the magnitude bound (see the docstring).
MAX_PROOF_ELEMENTS = 2 ** 22
#: ``u . u <= max_abs_value^2 * PROOF_SHARE`` proves ``max|u| <= max_abs_value``.
PROOF_SHARE = 0.25
#: Smallest cap for which the proof holds (squares below ``2^-126`` may flush to zero).
MIN_PROOF_CAP = 1e-9

_F32 = np.dtype(np.float32)


def peak_abs(tensors: Mapping[str, np.ndarray]) -> float:
    """``max |w|`` over every tensor: the exact magnitude check (one ``max`` and ``min`` per tensor)."""
    return max((max(float(a.max()), -float(a.min())) for a in tensors.values() if a.size), default=0.0)


def norm_of(tensors: Mapping[str, np.ndarray]) -> float:
    """``||tensors||_2``: per-tensor float32 dot products, summed in order as Python floats."""
    return float(np.sqrt(sum(float(np.dot(a.reshape(-1), a.reshape(-1))) for a in tensors.values())))


def peak_unless_within(update: Mapping[str, np.ndarray], max_abs_value: float) -> Optional[float]:
    """None if ``sum(u . u)`` proves every ``|u_i| <= max_abs_value`` (see the module docstring),
    else the exact ``peak_abs(update)``. Tensors fresh from the decoder bring the sum along."""
    if max_abs_value >= MIN_PROOF_CAP:
        measured = update.measured_squares() if isinstance(update, DecodedTensors) else None
        if measured is not None and measured[1] <= MAX_PROOF_ELEMENTS:
            proof: Optional[float] = measured[0]
        else:
            proof = _squares(update)
        if proof is not None and math.isfinite(proof) and proof <= PROOF_SHARE * max_abs_value * max_abs_value:
            return None
    return peak_abs(update)


def _squares(update: Mapping[str, np.ndarray]) -> Optional[float]:
    """``sum(u . u)`` over float32 tensors of at most ``MAX_PROOF_ELEMENTS``, else None."""
    if not all(type(u) is np.ndarray and u.dtype == _F32 and u.size <= MAX_PROOF_ELEMENTS
               for u in update.values()):
        return None
    proof = 0.0
    with np.errstate(over="ignore", invalid="ignore"):  # a huge value: the exact check decides
        for u in update.values():
            flat = u.reshape(-1)
            proof += float(np.dot(flat, flat))
    return proof


class DeltaBuffers:
    """Float32 buffers for ``update - base``, reused from update to update (one model's worth)."""

    def __init__(self) -> None:
        self._buffers: Dict[str, np.ndarray] = {}

    def delta(self, update: Mapping[str, np.ndarray],
              base: Mapping[str, np.ndarray]) -> Optional[Tuple[Dict[str, np.ndarray], float]]:
        """``(update - base, ||update - base||_2)``: the delta as views of the reused buffers (valid
        until the next call), the norm bit for bit what ``norm_of`` gives on a fresh delta; None
        unless every tensor is float32 with the name and shape of a float32 base tensor."""
        pairs = []
        for name, u in update.items():
            b = base.get(name)
            if (type(u) is not np.ndarray or type(b) is not np.ndarray or u.dtype != _F32
                    or b.dtype != _F32 or u.shape != b.shape):
                return None
            pairs.append((name, u, b))
        buffers = self._buffers
        if buffers.keys() != update.keys() or any(buffers[n].shape != u.shape for n, u, _ in pairs):
            # A new model layout: drop the old buffers, so that they hold one model at most.
            buffers = self._buffers = {n: np.empty(u.shape, _F32) for n, u, _ in pairs}
        delta: Dict[str, np.ndarray] = {}
        squares: List[float] = []
        for name, u, b in pairs:
            d = buffers[name]
            np.subtract(u, b, out=d)
            flat = d.reshape(-1)
            squares.append(float(np.dot(flat, flat)))
            delta[name] = d
        return delta, float(np.sqrt(sum(squares)))
