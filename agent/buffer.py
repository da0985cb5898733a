"""The agent's bounded window buffer: memory fixed up front, O(1) insert, per-class counts.

A board must not grow its memory with the stream, so every window lives in one preallocated
``X [capacity, T, C]`` / ``y [capacity]`` pair. Which slot a new window takes once the buffer is full,
and whether it is admitted at all, is a ``ReplacementPolicy`` (``streamfl.agent.buffer_policies``):
FIFO by default, or a reservoir; SFedPO's distribution-guided sampling (DDS, SFedPO eq. 10)
plugs in as an admission rule per window.
"""
import logging
from typing import Dict, Optional, Tuple

import numpy as np

from streamfl.agent.buffer_policies import FifoPolicy, ReplacementPolicy
from streamfl.sensors.window import UNLABELLED

log = logging.getLogger(__name__)


class Buffer:
    """A ring of ``capacity`` windows of shape [window_len, channels] with labels in [0, num_classes)."""

    def __init__(self, capacity: int, window_len: int, channels: int, num_classes: int,
                 policy: Optional[ReplacementPolicy] = None):
        if capacity < 1:
            raise ValueError("buffer capacity must be at least 1, got %r" % capacity)
        if num_classes < 1:
            raise ValueError("num_classes must be at least 1, got %r" % num_classes)
        self.capacity = int(capacity)
        self.num_classes = int(num_classes)
        self.window_shape = (int(window_len), int(channels))
        self.X = np.zeros((self.capacity,) + self.window_shape, dtype=np.float32)
        self.X.fill(0.0)  # touch every page now: an out-of-memory board fails at start, not mid-run
        self.y = np.zeros(self.capacity, dtype=np.int64)
        #: Windows per class currently held (a plain list: cheapest to update per insert).
        self.counts = [0] * self.num_classes
        self.use(policy if policy is not None else FifoPolicy())
        self.size = 0
        #: Next slot in ring order, i.e. the oldest window once the buffer is full.
        self.oldest_slot = 0
        #: Windows offered / stored / dropped as unlabelled / refused by the policy / malformed.
        self.offered = 0
        self.stored = 0
        self.unlabelled = 0
        self.refused = 0
        self.invalid = 0

    def use(self, policy: ReplacementPolicy) -> None:
        """Decide admissions and victims by ``policy`` from now on (the windows held stay)."""
        self.policy = policy
        self._fifo = type(policy) is FifoPolicy   # the common case, without two calls per window

    @property
    def nbytes(self) -> int:
        """Memory held by the window and label arrays."""
        return self.X.nbytes + self.y.nbytes

    def __len__(self) -> int:
        return self.size

    def add(self, x: np.ndarray, label: int, state: int = -1) -> bool:
        """Store one window ``x`` [T, C] with ``label`` (of latent ``state``, -1 if unknown); False
        if unlabelled, refused or malformed."""
        self.offered += 1
        if label < 0 or label >= self.num_classes:
            if label == UNLABELLED:
                self.unlabelled += 1
            else:
                self._invalid("label %r outside [0, %d)" % (label, self.num_classes))
            return False
        if x.shape != self.window_shape:
            self._invalid("window shape %s, buffer expects %s" % (x.shape, self.window_shape))
            return False
        if self._fifo:
            if self.size < self.capacity:
                slot = self.size
                self.size += 1
            else:
                slot = self.oldest_slot
                self.counts[self.y[slot]] -= 1
            self.oldest_slot = slot + 1 if slot + 1 < self.capacity else 0
        else:
            if not self.policy.admit(label, self, state, window=x):
                self.refused += 1
                return False
            if self.size < self.capacity:
                slot = self.size
                self.size += 1
            else:
                slot = int(self.policy.victim(label, self))
                self.counts[self.y[slot]] -= 1
            if slot == self.oldest_slot:
                self.oldest_slot = slot + 1 if slot + 1 < self.capacity else 0
        self.X[slot] = x
        self.y[slot] = label
        self.counts[label] += 1
        self.stored += 1
        return True

    def _invalid(self, why: str) -> None:
        if self.invalid == 0:
            log.warning("buffer refuses a malformed window (%s); further ones are only counted", why)
        self.invalid += 1

    def class_counts(self) -> Dict[int, int]:
        """``{class: windows held}`` for the classes present."""
        return {c: n for c, n in enumerate(self.counts) if n}

    def sample(self, batch_size: int, rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray]:
        """A uniform minibatch (with replacement) of held windows: copies ``(X [B, T, C], y [B])``."""
        if self.size == 0:
            raise ValueError("cannot sample from an empty buffer")
        idx = rng.integers(0, self.size, size=int(batch_size))
        return self.X[idx], self.y[idx]

    def clear(self) -> None:
        """Forget every window (the memory stays allocated)."""
        self.size = 0
        self.oldest_slot = 0
        self.counts = [0] * self.num_classes

    def stats(self) -> Dict[str, int]:
        """Counters for telemetry and tests."""
        return {"size": self.size, "capacity": self.capacity, "offered": self.offered,
                "stored": self.stored, "unlabelled": self.unlabelled, "refused": self.refused,
                "invalid": self.invalid}
