"""An update's delta norm from its base, in one pass and no allocation, with a magnitude check for free.

Admission needs, for every update, ``||u - b||_2`` and whether any ``|w| > max_abs_value``; the
delta ``d = u - b`` itself only to clip, which is rare. Done plainly that is four passes over a
2 MB update plus a fresh 2 MB array per update (max, min, subtract, dot): half of what the
coordinator spent on an update (``bench/bench_coordinator.py``). Here:

* ``||d||`` is summed by the coordinator's kernels (``coordinator/kernels``: one compiled pass
  with numba, a subtraction into a reused buffer and a dot product without it), per tensor, the
  tensors' sums added in order. ``d`` is rounded to float32 as the clip's delta is. The delta is
  computed, never ``|u|^2 - 2 u.b + |b|^2``, which cancels catastrophically for an update close
  to its base. A clip computes ``d`` again (``delta_of``);
* the magnitude check (``peak_unless_within``) starts from ``s = sum(u . u)``, which the decoder's
  finiteness check computed already (``DecodedTensors``), or, where the decoder left that check
  to admission (``Decoder(receiver_checks_finite=...)``), the kernels' pass sums beside the
  delta's (``norm_and_squares``: finite only if every value is); else one BLAS pass here. Since
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

from streamfl.coordinator.kernels import Kernels, default_kernels
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


def peak_unless_within(update: Mapping[str, np.ndarray], max_abs_value: float,
                       squares: Optional[float] = None) -> Optional[float]:
    """None if ``sum(u . u)`` proves every ``|u_i| <= max_abs_value`` (see the module docstring),
    else the exact ``peak_abs(update)``. The sum: ``squares`` where the caller has it (the
    kernels' pass), else what tensors fresh from the decoder bring along, else one pass here."""
    if max_abs_value >= MIN_PROOF_CAP:
        measured = update.measured_squares() if isinstance(update, DecodedTensors) else None
        elements = sum(u.size for u in update.values()) if squares is not None else 0
        if squares is not None and elements <= MAX_PROOF_ELEMENTS:
            proof: Optional[float] = squares
        elif measured is not None and measured[1] <= MAX_PROOF_ELEMENTS:
            proof = measured[0]
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


def delta_of(update: Mapping[str, np.ndarray], base: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """``update - base`` per tensor, float32 (as the norm rounds it): what a clip scales."""
    return {k: np.subtract(a, base[k], dtype=np.float32) for k, a in update.items()}


class DeltaNorm:
    """``||update - base||_2`` through the coordinator's kernels, for float32 tensors shaped like the base's."""

    def __init__(self, kernels: Optional[Kernels] = None) -> None:
        self.kernels = kernels if kernels is not None else default_kernels()

    def norm(self, update: Mapping[str, np.ndarray], base: Mapping[str, np.ndarray]) -> Optional[float]:
        """The delta's norm (NaN or Inf if a value is), tensors' sums added in order; None unless
        every tensor is float32 with the name and shape of a float32 base tensor."""
        pairs = self._pairs(update, base)
        if pairs is None:
            return None
        squares = self.kernels.delta_squares
        return float(np.sqrt(sum(squares(u, b) for u, b in pairs)))

    @staticmethod
    def _pairs(update: Mapping[str, np.ndarray],
               base: Mapping[str, np.ndarray]) -> Optional[List[Tuple[np.ndarray, np.ndarray]]]:
        """Flat ``(u, b)`` per tensor, or None unless each is float32 shaped like the base's."""
        pairs = []
        for name, u in update.items():
            b = base.get(name)
            if (type(u) is not np.ndarray or type(b) is not np.ndarray or u.dtype != _F32
                    or b.dtype != _F32 or u.shape != b.shape):
                return None
            pairs.append((u.reshape(-1), b.reshape(-1)))
        return pairs

    def norm_and_squares(self, update: Mapping[str, np.ndarray],
                         base: Mapping[str, np.ndarray]) -> Optional[Tuple[float, float]]:
        """``(norm, sum(u^2))`` in the same pass (``Kernels.delta_and_update_squares``): both
        finite only if every value of the update is; None as for ``norm``."""
        pairs = self._pairs(update, base)
        if pairs is None:
            return None
        delta = own = 0.0
        for u, b in pairs:
            d, o = self.kernels.delta_and_update_squares(u, b)
            delta += d
            own += o
        return float(np.sqrt(delta)), own
