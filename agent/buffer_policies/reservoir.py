"""Reservoir sampling (Vitter's algorithm R): a uniform sample of every window seen so far.

The n-th labelled window is kept with probability ``capacity / n`` in a uniformly chosen slot, so
at any time each window of the stream is in the buffer with the same probability. Under a stream
whose classes come in long periods (AdaCLP's extreme setting) a FIFO buffer holds only the current
period; a reservoir keeps earlier periods in proportion to their length, at the price of learning
a new class more slowly (its share grows as its windows arrive). Seeded: the same stream and seed
keep the same windows.
"""
from typing import Optional

import numpy as np

from streamfl.agent.buffer_policies.base import BufferView, ReplacementPolicy


class ReservoirPolicy(ReplacementPolicy):
    """Keep the n-th window with probability capacity/n, over a uniform victim slot."""

    name = "reservoir"

    def __init__(self, seed: int = 0):
        # Its own stream, apart from the device's other generators seeded with the same number.
        self._rng = np.random.default_rng([seed, 0x5EED])
        #: Labelled windows offered to this policy so far.
        self.seen = 0

    def admit(self, label: int, buffer: BufferView, state: int = -1,
              window: Optional[np.ndarray] = None) -> bool:
        self.seen += 1
        if buffer.size < buffer.capacity:
            return True
        return bool(self._rng.random() * self.seen < buffer.capacity)

    def victim(self, label: int, buffer: BufferView) -> int:
        return int(self._rng.integers(buffer.capacity))
