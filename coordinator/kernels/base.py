"""The two loops every FedAsync update runs over the whole model: its delta's squared norm and the mix.

At 2.1 MB an update's cost is these two loops (``bench/bench_coordinator.py``): admission's
``||u - b||^2`` and FedAsync's ``keep * x + take * u``. numpy runs each as several passes over
memory (a subtraction into a buffer and a dot product; two multiplications and a sum), a compiled
loop as one; ``numba_kernels`` is that loop, ``numpy_kernels`` the same arithmetic without a
compiler. Both implement ``Kernels`` and pass one contract suite (``tests/test_kernels.py``):

* ``mix_into`` writes ``keep * x + take * u``: each element rounded to float32 after each of the
  two products and after their sum, no fused multiply-add, so the model is the same bit for bit
  whichever runs;
* ``delta_squares`` returns ``sum((u - b)^2)`` with ``u - b`` rounded to float32, as admission's
  delta (and its clip) is; ``delta_and_update_squares`` also ``sum(u^2)``, which proves the
  update finite and within the magnitude cap where the decoder left that to admission
  (``coordinator/delta_norm.py``): numba adds it to the same loop for free. The order of the sum is the implementation's own (BLAS's blocks in
  float32 for numpy, float64 for numba), so norms agree to float32 rounding, not bit for bit. The
  delta is computed, never ``|u|^2 - 2 u.b + |b|^2``, which cancels catastrophically for an update
  close to its base.
"""
import abc
from typing import Tuple

import numpy as np


class Kernels(abc.ABC):
    """The delta's squared norm and the FedAsync mix over one flat float32 tensor."""

    #: Shown in logs and the benchmark's JSON.
    name = ""

    @abc.abstractmethod
    def delta_squares(self, update: np.ndarray, base: np.ndarray) -> float:
        """``sum(float32(u - b)^2)`` over two flat float32 arrays of one size (NaN/Inf if any is)."""

    @abc.abstractmethod
    def delta_and_update_squares(self, update: np.ndarray, base: np.ndarray) -> Tuple[float, float]:
        """``(delta_squares(u, b), sum(u^2))``: both finite only if every value of ``u`` is."""

    @abc.abstractmethod
    def mix_into(self, out: np.ndarray, model: np.ndarray, update: np.ndarray,
                 keep: np.float32, take: np.float32) -> None:
        """``out = keep * model + take * update``, float32, elementwise; flat arrays of one size."""
