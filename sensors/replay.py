"""Replay a recorded dataset (.npz, DESIGN.md section 7) as a live window stream.

Lets a device or the simulator train on real recordings at a chosen rate: optionally one subject
only (one "user" per device), looping, and shuffled per pass with a seed.
"""
import logging
from pathlib import Path
from typing import Callable, Iterator, Optional, Tuple, Union

import numpy as np

from streamfl.errors import SensorError
from streamfl.sensors.base import SensorSource
from streamfl.sensors.datasets import Dataset, load_npz
from streamfl.sensors.window import Window

log = logging.getLogger(__name__)


class ReplaySource(SensorSource):
    """Windows of a dataset file in order (or shuffled), at ``windows_per_s``.

    Each window's ``t_s`` is its stream time: ``time_fn()`` when given, else index /
    ``windows_per_s`` (unpaced: the index). ``expected_shape`` (T, C) and ``num_classes`` check the
    file against the model up front instead of failing in training.
    """

    def __init__(self, path: Union[str, Path, Dataset], windows_per_s: float = 0.0,
                 subject: Optional[int] = None, loop: bool = False, shuffle: bool = False,
                 seed: int = 0, expected_shape: Optional[Tuple[int, int]] = None,
                 num_classes: Optional[int] = None, clock=None, sleep=None,
                 time_fn: Optional[Callable[[], float]] = None):
        super().__init__(windows_per_s, clock, sleep)
        data = path if isinstance(path, Dataset) else load_npz(path)
        where = "dataset" if isinstance(path, Dataset) else "dataset %s" % path
        if expected_shape is not None and tuple(data.X.shape[1:]) != tuple(expected_shape):
            raise SensorError("%s has windows of T x C = %d x %d, the sensor config expects %d x %d"
                              % (where, data.X.shape[1], data.X.shape[2], expected_shape[0],
                                 expected_shape[1]))
        if num_classes is not None and data.num_classes > num_classes:
            raise SensorError("%s has %d classes, the sensor config allows %d" % (
                where, data.num_classes, num_classes))
        if subject is None:
            index = np.arange(data.X.shape[0])
        else:
            index = np.flatnonzero(data.subject == int(subject))
            if index.size == 0:
                raise SensorError("%s has no windows of subject %d (subjects: %s)" % (
                    where, subject, ", ".join(str(s) for s in np.unique(data.subject))))
        if index.size == 0:
            raise SensorError("%s holds no windows" % where)
        self.data = data
        self.index = index
        self.loop = bool(loop)
        self.shuffle = bool(shuffle)
        self._rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, 4])
        self._time_fn = time_fn
        #: Completed passes over the (filtered) data.
        self.passes = 0

    def __len__(self) -> int:
        """Windows in one pass (after the subject filter)."""
        return int(self.index.size)

    def _stream_time(self, i: int) -> float:
        if self._time_fn is not None:
            return float(self._time_fn())
        return i / self.windows_per_s if self.windows_per_s > 0 else float(i)

    def _generate(self) -> Iterator[Window]:
        i = 0
        while not self.closed:
            order = self._rng.permutation(self.index) if self.shuffle else self.index
            for j in order:
                if self.closed:
                    return
                yield Window(self.data.X[j].copy(), int(self.data.y[j]), self._stream_time(i))
                i += 1
            self.passes += 1
            if not self.loop:
                return
            log.debug("replay pass %d done, looping", self.passes)
