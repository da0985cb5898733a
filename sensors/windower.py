"""Cut a labelled sample stream into fixed windows of ``size`` samples every ``stride`` samples.

Samples arrive in pushes of any length; windows span push boundaries. A window's label is the
majority label of its samples (ties go to the lowest class id; ``UNLABELLED`` wins only with more
samples than every single class), and its ``t_s`` is the time of its last sample.
"""
from typing import List, Optional, Sequence, Union

import numpy as np

from streamfl.sensors.window import UNLABELLED, Window


def majority_label(labels: np.ndarray) -> int:
    """The most frequent label; ties -> lowest class id; ``UNLABELLED`` only on a strict majority."""
    labels = np.asarray(labels)
    known = labels[labels >= 0]
    unknown = int(labels.size - known.size)
    if known.size == 0:
        return UNLABELLED
    counts = np.bincount(known)
    best = int(np.argmax(counts))  # argmax returns the first, i.e. lowest, of tied maxima
    if unknown > counts[best]:
        return UNLABELLED
    return best


class Windower:
    """Stateful stream-to-window cutter; one per stream (do not share across series or devices).

    ``sample_rate_hz`` (optional) lets a scalar ``t_s`` of a multi-sample push be spread back over
    its samples; without it every sample of a push shares the push's ``t_s``.
    """

    def __init__(self, size: int, stride: int, channels: Optional[int] = None,
                 sample_rate_hz: Optional[float] = None):
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise ValueError("window size must be a positive integer, got %r" % (size,))
        if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or stride < 1:
            raise ValueError("window stride must be a positive integer, got %r" % (stride,))
        if channels is not None and channels < 1:
            raise ValueError("channels must be >= 1, got %r" % (channels,))
        if sample_rate_hz is not None and not sample_rate_hz > 0:
            raise ValueError("sample_rate_hz must be > 0, got %r" % (sample_rate_hz,))
        self.size = int(size)
        self.stride = int(stride)
        self.channels = channels
        self.sample_rate_hz = sample_rate_hz
        self._x = np.zeros((0, channels or 0), dtype=np.float32)
        self._y = np.zeros(0, dtype=np.int64)
        self._t = np.zeros(0, dtype=np.float64)
        self._skip = 0  # samples still to drop before the next window starts (stride > size)
        self._count = 0  # samples pushed so far, the time base when no t_s is given

    @property
    def pending(self) -> int:
        """Samples held that do not yet form a window."""
        return int(self._y.size)

    def reset(self) -> None:
        """Forget held samples, e.g. when the stream was interrupted."""
        self._x = self._x[:0]
        self._y = self._y[:0]
        self._t = self._t[:0]
        self._skip = 0

    def push(self, samples, labels: Union[int, Sequence[int], np.ndarray, None] = None,
             t_s: Union[float, Sequence[float], np.ndarray, None] = None) -> List[Window]:
        """Add ``samples`` [n, C] with ``labels`` [n] (an int or None for all); return new windows.

        ``t_s`` is the time of the last sample of this push (a number) or one time per sample;
        None counts samples since the start (index / ``sample_rate_hz``, or the bare index).
        Raises ``ValueError`` on a shape, channel or label mismatch (nothing is consumed then).
        """
        x = np.asarray(samples, dtype=np.float32)
        if x.ndim == 1 and self.channels is not None and x.size == self.channels:
            x = x[None, :]
        if x.ndim != 2:
            raise ValueError("samples must be [n, C], got shape %s" % (x.shape,))
        n, c = x.shape
        if self.channels is not None and c != self.channels:
            raise ValueError("samples have %d channels, the stream has %d" % (c, self.channels))
        y = self._labels(labels, n)
        t = self._times(t_s, n)
        if self.channels is None:
            self.channels = c
            self._x = np.zeros((0, c), dtype=np.float32)
        self._count += n
        if n == 0:
            return []
        if self._skip:
            drop = min(self._skip, n)
            self._skip -= drop
            x, y, t = x[drop:], y[drop:], t[drop:]
        self._x = np.concatenate([self._x, x]) if self._x.size else x.copy()
        self._y = np.concatenate([self._y, y])
        self._t = np.concatenate([self._t, t])
        out = []
        start = 0
        held = self._y.size
        while held - start >= self.size:
            end = start + self.size
            out.append(Window(self._x[start:end].copy(), majority_label(self._y[start:end]),
                              float(self._t[end - 1])))
            start += self.stride
        if start > held:
            self._skip = start - held
            start = held
        self._x, self._y, self._t = self._x[start:], self._y[start:], self._t[start:]
        return out

    def _labels(self, labels, n: int) -> np.ndarray:
        if labels is None:
            return np.full(n, UNLABELLED, dtype=np.int64)
        if np.ndim(labels) == 0:
            value = int(labels)
            if value < UNLABELLED:
                raise ValueError("labels must be class ids >= 0 or UNLABELLED (-1), got %d" % value)
            return np.full(n, value, dtype=np.int64)
        y = np.asarray(labels)
        if y.shape != (n,):
            raise ValueError("labels must be [n] = [%d], got shape %s" % (n, y.shape))
        if y.size and not np.issubdtype(y.dtype, np.integer):
            raise ValueError("labels must be integers, got dtype %s" % y.dtype)
        y = y.astype(np.int64)
        if y.size and y.min() < UNLABELLED:
            raise ValueError("labels must be class ids >= 0 or UNLABELLED (-1), got %d" % y.min())
        return y

    def _times(self, t_s, n: int) -> np.ndarray:
        if t_s is None:
            idx = np.arange(self._count, self._count + n, dtype=np.float64)  # 0-based sample index
            return idx / self.sample_rate_hz if self.sample_rate_hz else idx
        if np.ndim(t_s) == 0:
            last = float(t_s)
            if self.sample_rate_hz:
                return last - np.arange(n - 1, -1, -1, dtype=np.float64) / self.sample_rate_hz
            return np.full(n, last, dtype=np.float64)
        t = np.asarray(t_s, dtype=np.float64)
        if t.shape != (n,):
            raise ValueError("t_s must be a number or [n] = [%d] times, got shape %s" % (n, t.shape))
        return t
