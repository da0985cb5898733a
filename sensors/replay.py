"""Replay a recorded dataset (an ``sensors.datasets`` .npz) as a live window stream.

Lets a device or the simulator train on real recordings at a chosen rate: optionally one subject
only (one "user" per device), looping, and shuffled per pass with a seed.

A dataset file may also hold an optional ``state`` key: integer [N], window i's latent state
(SFedPO's "at work", "at home", ...) as an id 0..``MAX_STATE``, or -1 where unknown. Every replayed
window carries its state; a file without the key gives ``UNKNOWN_STATE`` for all. ``load_npz`` and
the other readers of the format ignore the key.
"""
import logging
import zipfile
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, Tuple, Union

import numpy as np

from streamfl.errors import SensorError
from streamfl.sensors.base import SensorSource
from streamfl.sensors.datasets import Dataset, load_npz
from streamfl.sensors.encoding import MAX_STATE
from streamfl.sensors.window import UNKNOWN_STATE, Window

log = logging.getLogger(__name__)

#: The optional dataset key of per-window latent states.
STATE_KEY = "state"


def check_states(states, n: int, where: str) -> np.ndarray:
    """int64 [n] states in -1..MAX_STATE, else ``SensorError``: a bad id would steer admission."""
    arr = np.asarray(states)
    if arr.dtype.kind not in "iu" or arr.shape != (n,):
        raise SensorError("%s: per-window states (key %r) must be integer [N] = [%d], got %s %s" % (
            where, STATE_KEY, n, arr.dtype, arr.shape))
    if n and (arr.min() < UNKNOWN_STATE or arr.max() > MAX_STATE):
        raise SensorError("%s: per-window states (key %r) outside %d..%d (min %d, max %d)" % (
            where, STATE_KEY, UNKNOWN_STATE, MAX_STATE, arr.min(), arr.max()))
    return arr.astype(np.int64)


def load_states(path: Union[str, Path], n: int) -> Optional[np.ndarray]:
    """The file's per-window states, checked, or None when it has none (states are optional)."""
    where = "dataset %s" % path
    try:
        with np.load(str(path), allow_pickle=False) as npz:
            if STATE_KEY not in npz.files:
                return None
            states = npz[STATE_KEY]
    except ValueError as exc:  # an object array needs pickle: refused
        raise SensorError("%s: key %r cannot be read without pickle (%s)" % (
            where, STATE_KEY, exc)) from exc
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        raise SensorError("%s is not a readable .npz file: %s" % (where, exc)) from exc
    return check_states(states, n, where)


class ReplaySource(SensorSource):
    """Windows of a dataset file in order (or shuffled), at ``windows_per_s``.

    Each window's ``t_s`` is its stream time: ``time_fn()`` when given, else index /
    ``windows_per_s`` (unpaced: the index). ``expected_shape`` (T, C) and ``num_classes`` check the
    file against the model up front instead of failing in training. Each window's ``state`` comes
    from ``states`` when given (one per window of the dataset, -1 = unknown), else from the file's
    ``state`` key, else is ``UNKNOWN_STATE``.
    """

    def __init__(self, path: Union[str, Path, Dataset], windows_per_s: float = 0.0,
                 subject: Optional[int] = None, loop: bool = False, shuffle: bool = False,
                 seed: int = 0, expected_shape: Optional[Tuple[int, int]] = None,
                 num_classes: Optional[int] = None, clock=None, sleep=None,
                 time_fn: Optional[Callable[[], float]] = None,
                 states: Optional[Sequence[int]] = None):
        super().__init__(windows_per_s, clock, sleep)
        data = path if isinstance(path, Dataset) else load_npz(path)
        where = "dataset" if isinstance(path, Dataset) else "dataset %s" % path
        self.states = self._states(path, data.X.shape[0], states, where)
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

    @staticmethod
    def _states(path, n: int, states, where: str) -> np.ndarray:
        """One state per window of the dataset: the given ones, the file's, or all unknown."""
        if states is not None:
            return check_states(states, n, where)
        found = None if isinstance(path, Dataset) else load_states(path, n)
        if found is None:
            return np.full(n, UNKNOWN_STATE, dtype=np.int64)
        log.info("%s carries %d distinct latent states", where, np.unique(found[found >= 0]).size)
        return found

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
                yield Window(self.data.X[j].copy(), int(self.data.y[j]), self._stream_time(i),
                             int(self.states[j]))
                i += 1
            self.passes += 1
            if not self.loop:
                return
            log.debug("replay pass %d done, looping", self.passes)
