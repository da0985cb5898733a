"""Input drift on a board: has the sensor stream moved to another domain? (ST-EWC's periods.)

The ST-EWC paper assumes the periods are known. A board can notice them itself: a new permutation, a
re-mounted or rotated sensor, another room, change the statistics of the windows. Per window this
keeps a cheap feature vector, each channel's mean and standard deviation over the window's time
axis (2C numbers). A reference is the features' mean and variance over ``windows`` windows; the
newest ``windows`` windows are compared with it by

    shift = || mean(recent) - mean(reference) || / sqrt(sum of the reference's variances)

i.e. how far the recent windows moved, in units of the reference's own spread. Why this form: it
needs no per-feature variance floor (a constant pixel or a dead channel would divide by zero) and
its noise level does not grow with the number of features: on stationary data its expected value
is about sqrt(2 / windows) (0.25 for 32 windows), so the default threshold of 0.6 is 2.4 times
that. Why not higher: at 0.75 a board noticed a random rotation of the smartwatch's sensors in 8
of 20 trials, at 0.6 in 16, with one false alarm in 20,000 stationary windows (20 two-class
streams of 1,000) on that data and on MNIST-5k (a permutation of MNIST is noticed at either); a
lone false alarm cuts no period, since the coordinator needs a quorum of devices within seconds
of each other. After a drift the reference is rebuilt from the next ``windows`` windows (all of the new
domain; the recent ones straddle the boundary), so one move counts once.
"""
from collections import deque
from typing import Deque, Optional

import numpy as np


def window_features(x: np.ndarray) -> np.ndarray:
    """Per-channel mean and standard deviation over time of one window [T, C] (or [C]) as float64."""
    a = np.asarray(x, dtype=np.float64)
    a = a.reshape(-1, a.shape[-1]) if a.ndim > 1 else a.reshape(1, -1)
    return np.concatenate([a.mean(axis=0), a.std(axis=0)])


class InputDrift:
    """Counts the drifts of a stream of windows (see the module docstring)."""

    def __init__(self, windows: int = 32, threshold: float = 0.6):
        if windows < 2:
            raise ValueError("drift windows must be >= 2, got %r" % (windows,))
        if not threshold > 0:
            raise ValueError("drift threshold must be > 0, got %r" % (threshold,))
        self.windows, self.threshold = int(windows), float(threshold)
        #: Drifts detected since the device started.
        self.drifts = 0
        #: The last shift computed (0 until the first comparison).
        self.shift = 0.0
        self._ref: list = []
        self._ref_mean: Optional[np.ndarray] = None
        self._ref_scale = 0.0
        self._recent: Deque[np.ndarray] = deque()
        self._recent_sum: Optional[np.ndarray] = None

    def add(self, x: np.ndarray) -> bool:
        """Take one window; True if it completed a drift."""
        f = window_features(x)
        if self._ref_mean is None or self._ref_mean.shape != f.shape:
            return self._grow_reference(f)
        self._recent.append(f)
        self._recent_sum = f.copy() if self._recent_sum is None else self._recent_sum + f
        if len(self._recent) > self.windows:
            self._recent_sum -= self._recent.popleft()
        if len(self._recent) < self.windows:
            return False
        delta = self._recent_sum / len(self._recent) - self._ref_mean
        self.shift = float(np.sqrt(np.dot(delta, delta)) / self._ref_scale)
        if self.shift <= self.threshold:
            return False
        self.drifts += 1
        self._ref, self._ref_mean = [], None
        self._recent.clear()
        self._recent_sum = None
        return True

    def _grow_reference(self, f: np.ndarray) -> bool:
        if self._ref and self._ref[0].shape != f.shape:
            self._ref = []
        self._ref.append(f)
        if len(self._ref) >= self.windows:
            ref = np.stack(self._ref)
            self._ref_mean = ref.mean(axis=0)
            self._ref_scale = float(np.sqrt(ref.var(axis=0).sum())) + 1e-12
            self._ref = []
        return False
