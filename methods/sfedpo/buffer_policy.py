"""SFedPO's distribution-guided sampling (DDS, SFedPO eq. 10-11, Algorithm 2) as buffer admission.

A window of latent state m is admitted with probability ``rates[m]`` (alpha_n,m; ``default_rate``
for a state without a rate, or when the state is unknown), and once the buffer is full it replaces
a uniformly chosen slot: the buffer then follows eq. 1, D_t = (1 - alpha) D_{t-1} + alpha D_m, a
convex mix of what it held and the current state, rather than FIFO's newest-only window. While the
buffer is filling every window is admitted (the paper's clients start with a full buffer).
``victim: oldest`` keeps FIFO's eviction instead; ``victim: balanced`` (streamfl's, not the paper's)
replaces the window of the most-held class among ``CANDIDATES`` random slots, so that a long stay
in a state of one or two classes crowds out the other classes more slowly (the paper leaves
which windows make room open). The ``sfedpo`` agent plug-in keeps the rates
current; on its own (``buffer_policy: dds``) every state is admitted at the budget, the paper's
"uniform sampling" ablation. Seeded.
"""
from typing import Dict, Optional

import numpy as np

from streamfl.agent.buffer_policies.base import BufferView, ReplacementPolicy

#: alpha_n, the paper's sampling budget (App. H.1).
DEFAULT_BUDGET = 0.5
#: Uniform draws made at once.
_BLOCK = 1024
#: Random slots a ``balanced`` eviction compares.
CANDIDATES = 8
VICTIMS = ("random", "oldest", "balanced")


class DdsPolicy(ReplacementPolicy):
    """Admit a window of state m with probability ``rates[m]``; evict a uniform slot (or the oldest)."""

    name = "dds"

    def __init__(self, seed: int = 0, default_rate: float = DEFAULT_BUDGET, victim: str = "random"):
        if not 0.0 <= default_rate <= 1.0:
            raise ValueError("default_rate must be in [0, 1], got %r" % (default_rate,))
        if victim not in VICTIMS:
            raise ValueError("victim must be one of %s, got %r" % (", ".join(VICTIMS), victim))
        self._rng = np.random.default_rng([seed, 0xDD5])
        self._uniforms = self._rng.random(_BLOCK)  # drawn in blocks: one call per window costs more
        self._next = 0
        self.default_rate = float(default_rate)
        self.victim_rule = victim
        #: alpha_n,m per state id.
        self.rates: Dict[int, float] = {}
        #: Windows offered while the buffer was full, and admitted of them (the admission rate).
        self.offered_full = 0
        self.admitted_full = 0
        #: The buffer's capacity in windows, as last seen (0: no window offered yet).
        self.capacity = 0

    def admit(self, label: int, buffer: BufferView, state: int = -1,
              window: Optional[np.ndarray] = None) -> bool:
        self.capacity = buffer.capacity
        if buffer.size < buffer.capacity:
            return True
        self.offered_full += 1
        if self._uniform() < self.rates.get(state, self.default_rate):
            self.admitted_full += 1
            return True
        return False

    def victim(self, label: int, buffer: BufferView) -> int:
        if self.victim_rule == "oldest":
            return buffer.oldest_slot
        if self.victim_rule == "random":
            return self._slot(buffer.capacity)
        slots = [self._slot(buffer.capacity) for _ in range(CANDIDATES)]
        counts, y = buffer.counts, buffer.y
        return max(slots, key=lambda s: counts[y[s]])

    def _slot(self, capacity: int) -> int:
        """A uniform slot index in [0, capacity)."""
        return min(int(self._uniform() * capacity), capacity - 1)

    def _uniform(self) -> float:
        """The next U[0, 1) draw of the current block."""
        if self._next == _BLOCK:
            self._uniforms, self._next = self._rng.random(_BLOCK), 0
        self._next += 1
        return float(self._uniforms[self._next - 1])

    @property
    def admission_rate(self) -> float:
        """Share of the windows offered to a full buffer that were admitted (NaN before any)."""
        return self.admitted_full / self.offered_full if self.offered_full else float("nan")
