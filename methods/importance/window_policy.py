"""Per-window importance sampling: the SFedPO paper's ``IS`` baseline as Li et al. (2021) define it.

Each window is scored by itself, not by its class (``ImportancePolicy``, streamfl's cheaper
class-level variant): its importance is the norm of the loss gradient at the logits,
||softmax(z) - onehot(y)||, under the board's model after its last round (an upper bound, up to
the last layer's scale, of the window's own gradient norm, as Katharopoulos and Fleuret use it).

* Admission: once the buffer is full, a window with importance s is admitted with probability
  ``budget * s / mean`` (at most 1), where ``mean`` is the running mean of the importance of the
  windows offered (over about ``mean_windows`` of them): so the mean admission is the budget, as
  SFedPO's DDS and the class-level variant keep it, and a window twice as informative as the
  recent ones is twice as likely to be kept. Li et al. select samples by this norm without a
  fixed share; the budget makes the three comparable (the choice is ours).
* Eviction: the least important of ``candidates`` uniformly drawn slots, each scored at once
  under the same model (one batched forward pass), so that a window learned since it came in is
  the first to go.

Before the first round's model there is nothing to score with: windows are then admitted at the
budget and evicted from a uniform slot. Each admission decision costs one forward pass of one
window and each eviction one of ``candidates`` windows: ``scored`` counts them, for the runtime's
cost. Seeded.
"""
from typing import Callable, Optional

import numpy as np

from streamfl.agent.buffer_policies.base import BufferView, ReplacementPolicy

#: ``scorer(X [n, T, C] float32, y [n] int) -> importance [n]``: the model's per-window gradient
#: norm at the logits.
Scorer = Callable[[np.ndarray, np.ndarray], np.ndarray]


class WindowImportancePolicy(ReplacementPolicy):
    """Admit each window by its own importance; evict the least important of a few random slots."""

    name = "importance-window"

    def __init__(self, seed: int = 0, budget: float = 0.5, candidates: int = 8, mean_windows: int = 256):
        if not 0.0 < budget <= 1.0 or candidates < 1 or mean_windows < 1:
            raise ValueError("per-window importance sampling needs budget in (0, 1], candidates >= 1 "
                             "and mean_windows >= 1, got %r, %r, %r" % (budget, candidates, mean_windows))
        self._rng = np.random.default_rng([seed, 0x16])
        self.budget = float(budget)
        self.candidates = int(candidates)
        self.mean_windows = int(mean_windows)
        #: The model's scorer (None until the device's first round).
        self.scorer: Optional[Scorer] = None
        #: Running mean importance of the windows offered to the full buffer, and how many.
        self.mean = 0.0
        self.offered = 0
        #: Windows scored (forward passes of one window each), since the policy was made.
        self.scored = 0

    def admit(self, label: int, buffer: BufferView, state: int = -1,
              window: Optional[np.ndarray] = None) -> bool:
        if buffer.size < buffer.capacity:
            return True
        scorer = self.scorer
        if scorer is None or window is None:
            return bool(self._rng.random() < self.budget)
        value = float(scorer(np.asarray(window, dtype=np.float32)[None], np.asarray([label]))[0])
        self.scored += 1
        if not np.isfinite(value):  # a diverged model: score nothing, admit at the budget
            return bool(self._rng.random() < self.budget)
        self.offered += 1
        self.mean += (value - self.mean) / min(self.offered, self.mean_windows)
        rate = min(1.0, self.budget * value / self.mean) if self.mean > 0 else self.budget
        return bool(self._rng.random() < rate)

    def victim(self, label: int, buffer: BufferView) -> int:
        slots = self._rng.integers(buffer.capacity, size=self.candidates)
        scorer = self.scorer
        if scorer is None:
            return int(slots[0])
        values = np.asarray(scorer(buffer.X[slots], buffer.y[slots]), dtype=np.float64)
        self.scored += len(slots)
        values = np.where(np.isfinite(values), values, np.inf)  # an unscorable slot is kept
        return int(slots[int(np.argmin(values))])
