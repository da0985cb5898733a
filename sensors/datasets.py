"""The one dataset file format of streamfl and loaders that produce it.

An ``.npz`` holding ``X`` float32 [N, T, C], ``y`` int64 [N] (0..K-1), ``subject`` int64 [N] and
``classes`` str [K]. It is loaded with ``allow_pickle=False``, so a dataset file cannot run code.
``watch_to_npz`` converts seglearn's smartwatch exercise recordings (the ``streamfl[data]`` extra).
"""
import io
import logging
import os
import zipfile
from pathlib import Path
from typing import NamedTuple, Sequence, Union

import numpy as np

from streamfl.errors import SensorError, StorageError
from streamfl.sensors.windower import Windower

log = logging.getLogger(__name__)

KEYS = ("X", "y", "subject", "classes")
PathLike = Union[str, Path]


class Dataset(NamedTuple):
    """A validated dataset in memory; ``classes[y[i]]`` names window i's class."""

    X: np.ndarray
    y: np.ndarray
    subject: np.ndarray
    classes: np.ndarray

    @property
    def num_classes(self) -> int:
        return int(self.classes.shape[0])


def validate(X, y, subject, classes, where: str = "dataset") -> Dataset:
    """Check dtypes, shapes, label range and finiteness; ``SensorError`` names the bad key."""
    arrays = {"X": X, "y": y, "subject": subject, "classes": classes}
    for key, value in arrays.items():
        if not isinstance(value, np.ndarray):
            raise SensorError("%s: key %r must be a numpy array, got %s" % (
                where, key, type(value).__name__))
    if X.dtype != np.float32 or X.ndim != 3:
        raise SensorError("%s: key 'X' must be float32 [N, T, C], got %s %s" % (
            where, X.dtype, X.shape))
    n = X.shape[0]
    for key in ("y", "subject"):
        arr = arrays[key]
        if arr.dtype != np.int64 or arr.shape != (n,):
            raise SensorError("%s: key %r must be int64 [N] = [%d], got %s %s" % (
                where, key, n, arr.dtype, arr.shape))
    if classes.dtype.kind != "U" or classes.ndim != 1 or classes.shape[0] < 1:
        raise SensorError("%s: key 'classes' must be a non-empty str [K] array, got %s %s" % (
            where, classes.dtype, classes.shape))
    k = classes.shape[0]
    if n and (y.min() < 0 or y.max() >= k):
        raise SensorError("%s: key 'y' holds labels outside 0..%d (min %d, max %d)" % (
            where, k - 1, y.min(), y.max()))
    if X.size and not np.isfinite(X).all():
        raise SensorError("%s: key 'X' holds non-finite values" % where)
    return Dataset(X, y, subject, classes)


def save_npz(path: PathLike, X, y, subject, classes: Sequence[str]) -> Path:
    """Validate and write a dataset atomically (temp file, fsync, rename); returns the path.

    Float ``X`` is stored as float32 and integer ``y``/``subject`` as int64; other dtypes are errors.
    """
    path = Path(path)
    X, y, subject = np.asarray(X), np.asarray(y), np.asarray(subject)
    if X.dtype.kind == "f":  # other float widths and integer widths are converted, nothing else
        X = X.astype(np.float32, copy=False)
    y = y.astype(np.int64, copy=False) if y.dtype.kind in "iu" else y
    subject = subject.astype(np.int64, copy=False) if subject.dtype.kind in "iu" else subject
    data = validate(X, y, subject, np.asarray([str(c) for c in classes], dtype=str), str(path))
    buf = io.BytesIO()
    np.savez_compressed(buf, **data._asdict())
    tmp = path.with_name(".%s.tmp" % path.name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(str(tmp), "wb") as fh:
            fh.write(buf.getvalue())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(str(tmp), str(path))
    except OSError as exc:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise StorageError("cannot write dataset %s: %s" % (path, exc.strerror or exc)) from exc
    return path


def load_npz(path: PathLike) -> Dataset:
    """Read and validate a dataset file; missing file, bad zip or bad key -> ``SensorError``."""
    path = Path(path)
    if not path.is_file():
        raise SensorError("dataset file not found: %s" % path)
    try:
        with np.load(str(path), allow_pickle=False) as npz:
            missing = [k for k in KEYS if k not in npz.files]
            if missing:
                raise SensorError("dataset %s: missing key %r (has %s)" % (
                    path, missing[0], ", ".join(npz.files) or "nothing"))
            arrays = {}
            for key in KEYS:
                try:
                    arrays[key] = npz[key]
                except ValueError as exc:  # object arrays need pickle: refused
                    raise SensorError("dataset %s: key %r cannot be read without pickle (%s)" % (
                        path, key, exc)) from exc
    except (OSError, zipfile.BadZipFile, ValueError, EOFError) as exc:
        raise SensorError("dataset %s is not a readable .npz file: %s" % (path, exc)) from exc
    return validate(arrays["X"], arrays["y"], arrays["subject"], arrays["classes"], str(path))


def _load_watch() -> dict:
    """seglearn's ``load_watch()``, with an install hint when seglearn (or its pandas) is missing."""
    try:
        from seglearn.datasets import load_watch
    except ImportError as exc:
        # seglearn 1.2.5 imports pandas without declaring it; the ``data`` extra installs both.
        raise SensorError("the smartwatch dataset needs seglearn and pandas (%s): "
                          "pip install 'streamfl[data]'" % exc) from exc
    return load_watch()


def watch_to_npz(out_path: PathLike, window_len: int = 50, stride: int = 25) -> Dataset:
    """Window seglearn's smartwatch exercises (10 subjects, 6 channels, 50 Hz, 7 classes) to .npz.

    Each of the 140 recordings is one exercise, windowed on its own so no window spans two.
    """
    data = _load_watch()
    try:
        series, labels, subjects = data["X"], np.asarray(data["y"]), np.asarray(data["subject"])
        classes = [str(c) for c in data["y_labels"]]
    except (KeyError, TypeError) as exc:
        raise SensorError("seglearn's watch data has an unexpected layout: %s" % exc) from exc
    xs, ys, subs = [], [], []
    for x, label, subject in zip(series, labels, subjects):
        windower = Windower(window_len, stride)
        for w in windower.push(np.asarray(x, dtype=np.float32), int(label)):
            xs.append(w.x)
            ys.append(w.label)
            subs.append(int(subject))
    if not xs:
        raise SensorError("no recording is at least %d samples long" % window_len)
    X = np.stack(xs).astype(np.float32)
    save_npz(out_path, X, np.asarray(ys, dtype=np.int64), np.asarray(subs, dtype=np.int64), classes)
    log.info("wrote %d windows of %d x %d from seglearn's watch data to %s",
             X.shape[0], X.shape[1], X.shape[2], out_path)
    return load_npz(out_path)
