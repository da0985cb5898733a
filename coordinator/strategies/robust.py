"""Byzantine-robust ways to combine one FedAvg round: a few hostile updates cannot drag the mean.

The sample-weighted mean (``weighted_average``) follows any single update as far as it goes, and
admission (``coordinator/admission.py``) only bounds each update on its own. Per coordinate, the
median ignores up to half the round being arbitrary; the trimmed mean (Yin et al., ICML 2018)
drops the ``trim_ratio`` largest and smallest values and averages the rest, keeping more of the
honest signal. Both ignore ``num_samples``: a hostile device would simply claim many samples.
"""
from typing import Collection, Sequence

import numpy as np

from streamfl.protocol.messages import Tensors, Update

#: FedAvg's ``combine`` choices besides ``mean``.
ROBUST_NAMES = ("median", "trimmed_mean")


def _stack(updates: Sequence[Update], name: str) -> np.ndarray:
    return np.stack([np.asarray(u.tensors[name], dtype=np.float32) for u in updates])


def coordinate_median(updates: Collection[Update]) -> Tensors:
    """The coordinate-wise median of the updates' tensors."""
    updates = list(updates)
    if not updates:
        raise ValueError("coordinate_median needs at least one update")
    return {name: np.median(_stack(updates, name), axis=0).astype(np.float32)
            for name in updates[0].tensors}


def trimmed_count(n: int, trim_ratio: float) -> int:
    """How many values are dropped at each end among ``n``: ``floor(trim_ratio * n)``, leaving at least one."""
    return min(int(np.floor(trim_ratio * n)), (n - 1) // 2)


def trimmed_mean(updates: Collection[Update], trim_ratio: float = 0.1) -> Tensors:
    """The coordinate-wise mean after dropping the ``trim_ratio`` largest and smallest values."""
    updates = list(updates)
    if not updates:
        raise ValueError("trimmed_mean needs at least one update")
    if not 0.0 <= trim_ratio < 0.5:
        raise ValueError("trim_ratio must be in [0, 0.5), got %r" % (trim_ratio,))
    k = trimmed_count(len(updates), trim_ratio)
    out: Tensors = {}
    for name in updates[0].tensors:
        stacked = _stack(updates, name)
        if k:
            stacked = np.sort(stacked, axis=0)[k:len(updates) - k]
        out[name] = stacked.mean(axis=0, dtype=np.float64).astype(np.float32)
    return out
