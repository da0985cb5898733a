"""Dataset .npz format: round trip, validation errors naming the key, and the seglearn converter."""

import numpy as np
import pytest

from streamfl.errors import SensorError
from streamfl.sensors import load_npz, save_npz, synthetic_dataset, watch_to_npz


def arrays(n=5, t=4, c=3, k=2):
    rng = np.random.default_rng(0)
    return (rng.normal(size=(n, t, c)).astype(np.float32), np.arange(n, dtype=np.int64) % k,
            np.arange(n, dtype=np.int64) // 2, ["walk", "run"][:k])


def test_round_trip(tmp_path):
    X, y, subject, classes = arrays()
    path = save_npz(tmp_path / "sub" / "d.npz", X, y, subject, classes)
    assert path.is_file()
    d = load_npz(path)
    np.testing.assert_array_equal(d.X, X)
    np.testing.assert_array_equal(d.y, y)
    np.testing.assert_array_equal(d.subject, subject)
    assert d.classes.tolist() == ["walk", "run"] and d.num_classes == 2
    assert d.X.dtype == np.float32 and d.y.dtype == np.int64 and d.subject.dtype == np.int64
    assert not list(path.parent.glob(".*.tmp"))


def test_synthetic_dataset_round_trip(tmp_path):
    X, y, subject = synthetic_dataset(30, [3, 4], seed=0)
    d = load_npz(save_npz(tmp_path / "s.npz", X, y, subject, ["c%d" % i for i in range(6)]))
    np.testing.assert_array_equal(d.X, X)


def test_save_converts_widths_but_not_kinds(tmp_path):
    X, y, subject, classes = arrays()
    d = load_npz(save_npz(tmp_path / "d.npz", X.astype(np.float64), y.astype(np.int32),
                          subject.astype(np.uint8), classes))
    assert d.X.dtype == np.float32 and d.y.dtype == np.int64 and d.subject.dtype == np.int64
    with pytest.raises(SensorError, match="'y'"):
        save_npz(tmp_path / "e.npz", X, y.astype(np.float32), subject, classes)
    with pytest.raises(SensorError, match="'X'"):
        save_npz(tmp_path / "e.npz", X.astype(np.int64), y, subject, classes)


@pytest.mark.parametrize("change,key", [
    (lambda a: a.update(X=a["X"].astype(np.float64)), "'X'"),
    (lambda a: a.update(X=a["X"][:, :, 0]), "'X'"),
    (lambda a: a.update(y=a["y"].astype(np.int32)), "'y'"),
    (lambda a: a.update(y=a["y"][:-1]), "'y'"),
    (lambda a: a.update(subject=a["subject"].astype(np.float32)), "'subject'"),
    (lambda a: a.update(classes=np.array([1, 2])), "'classes'"),
    (lambda a: a.update(classes=np.array([], dtype=str)), "'classes'"),
    (lambda a: a.update(y=a["y"] + 5), "'y' holds labels outside 0..1"),
    (lambda a: a["X"].__setitem__((0, 0, 0), np.nan), "'X' holds non-finite"),
    (lambda a: a.pop("classes"), "missing key 'classes'"),
    (lambda a: a.update(subject=np.array([object()] * 5)), "'subject'"),
])
def test_load_rejects_a_bad_key_by_name(tmp_path, change, key):
    X, y, subject, classes = arrays()
    a = {"X": X, "y": y, "subject": subject, "classes": np.array(classes)}
    change(a)
    path = tmp_path / "bad.npz"
    np.savez(path, **a)
    with pytest.raises(SensorError, match=key):
        load_npz(path)


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(SensorError, match="dataset file not found"):
        load_npz(tmp_path / "none.npz")
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"this is not a zip file")
    with pytest.raises(SensorError, match="not a readable .npz"):
        load_npz(junk)


def test_watch_to_npz_windows_the_smartwatch_recordings(tmp_path):
    d = watch_to_npz(tmp_path / "watch.npz", window_len=50, stride=25)
    assert d.X.dtype == np.float32 and d.X.shape[1:] == (50, 6)
    assert 9000 < d.X.shape[0] < 10500  # 140 recordings, 244k samples at stride 25
    assert d.classes.tolist() == ["PEN", "ABD", "FEL", "IR", "ER", "TRAP", "ROW"]
    assert set(np.unique(d.y).tolist()) == set(range(7))
    assert set(np.unique(d.subject).tolist()) == set(range(1, 11))
    again = load_npz(tmp_path / "watch.npz")
    np.testing.assert_array_equal(again.y, d.y)
    coarse = watch_to_npz(tmp_path / "w100.npz", window_len=100, stride=100)
    assert coarse.X.shape[1] == 100 and coarse.X.shape[0] < d.X.shape[0] / 3


def test_watch_to_npz_without_seglearn_tells_how_to_install(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_seglearn(name, *args, **kwargs):
        if name.startswith("seglearn"):
            raise ImportError("No module named 'seglearn'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_seglearn)
    with pytest.raises(SensorError, match=r"pip install 'streamfl\[data\]'"):
        watch_to_npz(tmp_path / "w.npz")
