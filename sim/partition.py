"""Split a training set over simulated devices: the spatial (cross-device) heterogeneity of a scenario.

Each function returns one sorted int64 index array into ``ds`` per device; the same seed gives the
same split. Temporal heterogeneity (which classes arrive when) is ``sim.streams``' job.
"""
from typing import List, Optional, Sequence

import numpy as np

from streamfl.errors import ConfigError
from streamfl.sensors.datasets import Dataset

HOWS = ("subject", "dirichlet", "shards", "iid")


def _rng(seed: int, tag: int) -> np.random.Generator:
    return np.random.default_rng([int(seed) & 0xFFFFFFFFFFFFFFFF, 21, tag])


def _by_subject(ds: Dataset, n_devices: int, rng: np.random.Generator) -> List[np.ndarray]:
    """Whole subjects per device, round robin over a shuffled subject order.

    With at least as many subjects as devices every subject goes to exactly one device. With fewer,
    device d gets subject ``order[d % S]``: several devices then share (draw from) the same subject's
    pool, like several sensors worn by one person, rather than splitting a subject's windows.
    """
    subjects = rng.permutation(np.unique(ds.subject))
    owned = [[] for _ in range(n_devices)]  # type: List[list]
    if len(subjects) >= n_devices:
        for j, s in enumerate(subjects):
            owned[j % n_devices].append(s)
    else:
        for d in range(n_devices):
            owned[d].append(subjects[d % len(subjects)])
    return [np.flatnonzero(np.isin(ds.subject, own)) for own in owned]


def _dirichlet(ds: Dataset, n_devices: int, beta: float, rng: np.random.Generator) -> List[np.ndarray]:
    """Per class, Dirichlet(beta) shares over devices (Hsu et al. 2019); no device is left empty.

    Every index lands on exactly one device. Empty devices then take one window each from the
    currently largest device, which keeps the split a partition and terminates.
    """
    if not beta > 0:
        raise ConfigError("dirichlet partition needs beta > 0, got %r" % (beta,))
    owner = np.empty(ds.y.shape[0], dtype=np.int64)
    for c in np.unique(ds.y):
        idx = rng.permutation(np.flatnonzero(ds.y == c))
        shares = rng.dirichlet(np.full(n_devices, float(beta)))
        if not np.all(np.isfinite(shares)):  # tiny beta can underflow: give the class to one device
            shares = np.eye(n_devices)[rng.integers(n_devices)]
        cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(np.int64)
        for d, part in enumerate(np.split(idx, cuts)):
            owner[part] = d
    sizes = np.bincount(owner, minlength=n_devices)
    for d in np.flatnonzero(sizes == 0):
        donor = int(np.argmax(sizes))
        victim = rng.choice(np.flatnonzero(owner == donor))
        owner[victim] = d
        sizes[donor] -= 1
        sizes[d] += 1
    return [np.flatnonzero(owner == d) for d in range(n_devices)]


def _shards(ds: Dataset, n_devices: int, per_device: int, rng: np.random.Generator) -> List[np.ndarray]:
    """Sort by class, cut ``n_devices * per_device`` equal shards, deal them out (McMahan et al.)."""
    if per_device < 1:
        raise ConfigError("shards_per_device must be >= 1, got %r" % (per_device,))
    n_shards = n_devices * per_device
    if n_shards > ds.y.shape[0]:
        raise ConfigError("%d shards need at least as many windows, dataset has %d" % (
            n_shards, ds.y.shape[0]))
    shuffled = rng.permutation(ds.y.shape[0])
    order = shuffled[np.argsort(ds.y[shuffled], kind="stable")]
    shards = np.array_split(order, n_shards)
    deal = rng.permutation(n_shards)
    return [np.concatenate([shards[s] for s in deal[d * per_device:(d + 1) * per_device]])
            for d in range(n_devices)]


def keep_class_subsets(ds: Dataset, parts: List[np.ndarray], classes_per_device: Sequence[int],
                       seed: int) -> List[np.ndarray]:
    """Each device keeps only a random subset of the classes its part holds (AdaCLP sec. 5.1).

    The paper's HARBox users each recorded only some of the activities, so a device lacks what
    others hold; where a dataset's users recorded every class (the smartwatch subjects did all
    seven exercises), this makes them class-incomplete the same way. Device d keeps
    ``k ~ U{lo..hi}`` (``classes_per_device = (lo, hi)``) of the classes present in its part, drawn
    from ``seed`` and d alone; a part with at most k classes is kept whole. Devices sharing a
    subject (fewer subjects than devices) draw their subsets independently.
    """
    lo, hi = (int(v) for v in classes_per_device)
    if not 1 <= lo <= hi:
        raise ConfigError("classes_per_device must be [lo, hi] with 1 <= lo <= hi, got %r"
                          % (list(classes_per_device),))
    out = []
    for d, part in enumerate(parts):
        rng = np.random.default_rng([int(seed) & 0xFFFFFFFFFFFFFFFF, 21, 5, d])
        present = np.unique(ds.y[part])
        k = int(rng.integers(lo, hi + 1))
        if len(present) > k:
            keep = rng.choice(present, k, replace=False)
            part = part[np.isin(ds.y[part], keep)]
        out.append(part)
    return out


def partition(ds: Dataset, n_devices: int, how: str, seed: int, beta: float = 0.5,
              shards_per_device: int = 2,
              classes_per_device: Optional[Sequence[int]] = None) -> List[np.ndarray]:
    """Index arrays (sorted int64), one per device: "subject", "dirichlet", "shards" or "iid".

    "subject": whole subjects per device (devices share a subject's pool when there are fewer
    subjects than devices, see ``_by_subject``). "dirichlet": per-class Dirichlet(``beta``) shares,
    every device >= 1 window. "shards": ``shards_per_device`` class-sorted shards each. "iid": a
    shuffled equal split. Only "subject" may give the same index to two devices.
    ``classes_per_device = (lo, hi)``: then each device keeps a random subset of its classes
    (``keep_class_subsets``).
    """
    if n_devices < 1:
        raise ConfigError("n_devices must be >= 1, got %r" % (n_devices,))
    n = ds.y.shape[0]
    if how != "subject" and n < n_devices:
        raise ConfigError("%d devices need at least as many windows, dataset has %d" % (n_devices, n))
    if how == "subject":
        parts = _by_subject(ds, n_devices, _rng(seed, 1))
    elif how == "dirichlet":
        parts = _dirichlet(ds, n_devices, beta, _rng(seed, 2))
    elif how == "shards":
        parts = _shards(ds, n_devices, int(shards_per_device), _rng(seed, 3))
    elif how == "iid":
        parts = np.array_split(_rng(seed, 4).permutation(n), n_devices)
    else:
        raise ConfigError("unknown partition %r (choose one of %s)" % (how, ", ".join(HOWS)))
    parts = [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
    if classes_per_device is not None:
        parts = keep_class_subsets(ds, parts, classes_per_device, seed)
    return parts


__all__ = ["HOWS", "keep_class_subsets", "partition"]
