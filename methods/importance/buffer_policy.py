"""Importance-sampling admission (the SFedPO paper's ``IS`` baseline, after Li et al. 2021).

IS keeps the windows with the largest gradient norm, the most informative ones. A per-window
norm would cost a forward pass per arriving window on the board, so importance is kept per class:
``importance[c]``, the mean norm of the loss gradient at the logits, ||softmax(z) - onehot(y)||,
over the class's buffered windows at the last round's model (a cheap upper-bound proxy of the
per-sample gradient norm; the ``importance`` agent plug-in measures it). A window of class c is
admitted with probability ``budget * importance[c] / mean importance`` (at most 1; a class not
measured yet counts as the most important), and the slot it takes is the least important of
``candidates`` uniformly drawn slots: old, well-learned windows go first. With no importance
measured every class is admitted at the budget. Seeded.
"""
from typing import Dict, Optional

import numpy as np

from streamfl.agent.buffer_policies.base import BufferView, ReplacementPolicy


class ImportancePolicy(ReplacementPolicy):
    """Admit by class importance; evict the least important of a few random slots."""

    name = "importance"

    def __init__(self, seed: int = 0, budget: float = 0.5, candidates: int = 8):
        if not 0.0 < budget <= 1.0 or candidates < 1:
            raise ValueError("importance sampling needs budget in (0, 1] and candidates >= 1")
        self._rng = np.random.default_rng([seed, 0x15])
        self.budget = float(budget)
        self.candidates = int(candidates)
        #: Mean logit-gradient norm per class (empty until measured).
        self.importance: Dict[int, float] = {}

    def _rate(self, label: int) -> float:
        if not self.importance:
            return self.budget
        mean = sum(self.importance.values()) / len(self.importance)
        value = self.importance.get(label, max(self.importance.values()))
        return min(1.0, self.budget * value / mean) if mean > 0 else self.budget

    def admit(self, label: int, buffer: BufferView, state: int = -1,
              window: Optional[np.ndarray] = None) -> bool:
        if buffer.size < buffer.capacity:
            return True
        return bool(self._rng.random() < self._rate(label))

    def victim(self, label: int, buffer: BufferView) -> int:
        slots = self._rng.integers(buffer.capacity, size=self.candidates)
        if not self.importance:
            return int(slots[0])
        top = max(self.importance.values())
        values = [self.importance.get(int(buffer.y[s]), top) for s in slots]
        return int(slots[int(np.argmin(values))])
