"""The kernels in plain numpy: what runs where numba is not installed, with the same mix bit for bit."""
from typing import Tuple

import numpy as np

from streamfl.coordinator.kernels.base import Kernels

#: Elements mixed per block (256 KiB of float32 per operand: a block of the model, of the update,
#: of the output and the scratch fit a core's L2 cache, 512 KiB to 2 MiB on the boards' and
#: servers' CPUs, with room to spare; the loop's Python overhead stays under 1 us per 64 K elements).
MIX_BLOCK_ELEMENTS = 65536


class NumpyKernels(Kernels):
    """Block-wise numpy passes into reused scratch buffers; not thread-safe (one per core/strategy)."""

    name = "numpy"

    def __init__(self) -> None:
        self._scratch = np.empty(MIX_BLOCK_ELEMENTS, dtype=np.float32)
        self._delta = np.empty(0, dtype=np.float32)

    def delta_squares(self, update: np.ndarray, base: np.ndarray) -> float:
        if self._delta.size < update.size:  # grows to the largest tensor seen, then is reused
            self._delta = np.empty(update.size, dtype=np.float32)
        delta = self._delta[:update.size]
        with np.errstate(over="ignore", invalid="ignore"):  # a NaN or Inf result says so
            np.subtract(update, base, out=delta)
            return float(np.dot(delta, delta))

    def delta_and_update_squares(self, update: np.ndarray, base: np.ndarray) -> Tuple[float, float]:
        delta = self.delta_squares(update, base)
        with np.errstate(over="ignore", invalid="ignore"):
            return delta, float(np.dot(update, update))

    def mix_into(self, out: np.ndarray, model: np.ndarray, update: np.ndarray,
                 keep: np.float32, take: np.float32) -> None:
        # Block by block, so that each block's three passes (model * keep into the output, update *
        # take into the scratch, their sum) touch memory still in the core's cache.
        for start in range(0, out.size, MIX_BLOCK_ELEMENTS):
            stop = min(start + MIX_BLOCK_ELEMENTS, out.size)
            block = out[start:stop]
            scratch = self._scratch[:stop - start]
            np.multiply(model[start:stop], keep, out=block, dtype=np.float32)
            np.multiply(update[start:stop], take, out=scratch, dtype=np.float32)
            block += scratch
