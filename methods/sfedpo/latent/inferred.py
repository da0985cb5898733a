"""States inferred on the device: online leader clustering of the recent windows' label mix.

SFedPO's states differ in their class mix (App. H.1), and a board sees the labels of the windows
it trains on, so the cheapest statistic that tells states apart is the label histogram of the
last ``history`` windows (32). Every ``every`` windows (8) that histogram is matched to the
nearest known state's centroid in total-variation distance; within ``threshold`` (0.35) it joins
it (the centroid moves toward it by ``1/visits``, capped at ``1/min_weight`` so centroids keep
following slow change); a histogram beyond it keeps the state in force until it has stayed
beyond for a whole ``history`` (a transition's blend of two states is no state of its own), then
starts a new state, up to ``max_states`` (32; then the nearest is taken). The threshold sits above the sampling noise of a 32-window histogram over a handful of
classes (about 0.2 TV) and below the gap between a skewed mix and a balanced one. A window is
given the state in force when it arrives; the first ``history`` windows are state 0. Ids are the
device's own: they mean nothing to other devices (``shared_ids`` is False). States that change
the inputs rather than the labels are not seen by this source.
"""
from collections import deque
from typing import Deque, List

import numpy as np

from streamfl.methods.sfedpo.latent.base import StateSource
from streamfl.sensors.window import Window


class InferredStates(StateSource):
    """Leader clustering of the sliding label histogram (module docstring)."""

    name = "inferred"

    def __init__(self, num_classes: int, history: int = 32, every: int = 8, threshold: float = 0.35,
                 max_states: int = 32, min_weight: int = 20):
        if num_classes < 1 or history < 1 or every < 1 or max_states < 1 or min_weight < 1:
            raise ValueError("inferred states need num_classes, history, every, max_states and "
                             "min_weight >= 1")
        if not 0.0 < threshold <= 1.0:
            raise ValueError("inferred states need a threshold in (0, 1], got %r" % (threshold,))
        self.k, self.history, self.every = int(num_classes), int(history), int(every)
        self.threshold, self.max_states, self.min_weight = float(threshold), int(max_states), int(min_weight)
        self._labels: Deque[int] = deque()
        self._hist = np.zeros(self.k, dtype=np.float64)
        self._since = 0
        #: Centroids (label mixes) of the states found so far, and how often each was matched.
        self.centroids: List[np.ndarray] = []
        self.visits: List[int] = []
        #: The state in force (given to arriving windows).
        self.current = 0
        self._far = 0  # consecutive matches beyond the threshold

    def state_of(self, window: Window) -> int:
        label = window.label
        if 0 <= label < self.k:
            self._labels.append(label)
            self._hist[label] += 1
            if len(self._labels) > self.history:
                self._hist[self._labels.popleft()] -= 1
            self._since += 1
            if len(self._labels) == self.history and self._since >= self.every:
                self._since = 0
                self.current = self._match(self._hist / self.history)
        return self.current

    def _match(self, mix: np.ndarray) -> int:
        """The nearest state within the threshold (its centroid updated), else a new one."""
        if self.centroids:
            dist = [0.5 * float(np.abs(c - mix).sum()) for c in self.centroids]
            best = int(np.argmin(dist))
            if dist[best] <= self.threshold or len(self.centroids) >= self.max_states:
                self._far = 0
                self.visits[best] += 1
                rate = 1.0 / min(self.visits[best], self.min_weight)
                self.centroids[best] += rate * (mix - self.centroids[best])
                return best
            self._far += 1
            if self._far * self.every < self.history:
                return self.current
        self._far = 0
        self.centroids.append(mix.copy())
        self.visits.append(1)
        return len(self.centroids) - 1
