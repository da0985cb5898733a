"""The agent's window buffer: bounded ring, counts kept right across overwrites, uniform sampling."""
import numpy as np
import pytest

from streamfl.agent.buffer import Buffer, FifoPolicy, ReplacementPolicy
from streamfl.sensors.window import UNLABELLED


def win(value, T=4, C=2):
    """A window whose every sample equals ``value``, so tests can tell windows apart."""
    return np.full((T, C), value, dtype=np.float32)


def test_fills_up_to_capacity_then_overwrites_oldest():
    buf = Buffer(capacity=3, window_len=4, channels=2, num_classes=3)
    for i, label in enumerate([0, 1, 2]):
        assert buf.add(win(i), label)
    assert len(buf) == 3 and buf.counts == [1, 1, 1]
    assert buf.add(win(10), 2)  # overwrites window 0 (class 0)
    assert len(buf) == 3
    assert buf.counts == [0, 1, 2]
    assert sorted(float(x[0, 0]) for x in buf.X) == [1.0, 2.0, 10.0]
    assert buf.add(win(11), 0)  # overwrites window 1 (class 1)
    assert buf.counts == [1, 0, 2]
    assert buf.class_counts() == {0: 1, 2: 2}


def test_counts_match_contents_after_many_overwrites():
    rng = np.random.default_rng(1)
    buf = Buffer(capacity=37, window_len=4, channels=2, num_classes=5)
    labels = rng.integers(0, 5, size=1000)
    for i, label in enumerate(labels):
        buf.add(win(i), int(label))
    assert len(buf) == 37
    expected = np.bincount(labels[-37:], minlength=5)
    assert buf.counts == expected.tolist()
    assert np.array_equal(np.bincount(buf.y, minlength=5), expected)
    # The buffer holds exactly the last 37 windows.
    assert sorted(int(x[0, 0]) for x in buf.X) == list(range(1000 - 37, 1000))
    assert buf.stored == 1000 and buf.offered == 1000


def test_unlabelled_and_malformed_windows_are_counted_not_stored():
    buf = Buffer(capacity=4, window_len=4, channels=2, num_classes=3)
    assert not buf.add(win(1), UNLABELLED)
    assert not buf.add(win(1), 3)  # label out of range
    assert not buf.add(np.zeros((5, 2), np.float32), 0)  # wrong shape
    assert len(buf) == 0 and buf.counts == [0, 0, 0]
    assert buf.unlabelled == 1 and buf.invalid == 2 and buf.offered == 3


def test_memory_is_preallocated():
    buf = Buffer(capacity=100, window_len=50, channels=6, num_classes=6)
    assert buf.X.shape == (100, 50, 6) and buf.X.dtype == np.float32
    assert buf.y.shape == (100,) and buf.y.dtype == np.int64
    x_id = id(buf.X)
    for i in range(250):
        buf.add(np.ones((50, 6), np.float32), i % 6)
    assert id(buf.X) == x_id
    assert buf.nbytes == 100 * 50 * 6 * 4 + 100 * 8


def test_sampling_is_uniform_over_held_windows_and_reproducible():
    buf = Buffer(capacity=10, window_len=4, channels=2, num_classes=2)
    for i in range(4):
        buf.add(win(i), i % 2)
    X, y = buf.sample(4000, np.random.default_rng(0))
    assert X.shape == (4000, 4, 2) and y.shape == (4000,)
    assert X.dtype == np.float32 and y.dtype == np.int64
    values = X[:, 0, 0].astype(int)
    assert set(values.tolist()) == {0, 1, 2, 3}  # never an unfilled slot
    freq = np.bincount(values) / 4000
    assert np.all(np.abs(freq - 0.25) < 0.04)
    assert np.array_equal(y, values % 2)  # labels travel with their windows
    X2, _ = buf.sample(4000, np.random.default_rng(0))
    assert np.array_equal(X, X2)
    X[0] = 99  # a copy, not a view
    assert float(buf.X.max()) < 99


def test_sample_from_empty_buffer_raises():
    buf = Buffer(capacity=2, window_len=4, channels=2, num_classes=2)
    with pytest.raises(ValueError):
        buf.sample(1, np.random.default_rng(0))


class CapPerClass(ReplacementPolicy):
    """Admit a class only while it holds under half the buffer (a stand-in for DDS's per-window
    admission); when full, overwrite the first slot of the most frequent class."""

    def admit(self, label, buffer, state=-1, window=None):
        return buffer.counts[label] < buffer.capacity // 2

    def victim(self, label, buffer):
        top = int(np.argmax(buffer.counts))
        return int(np.flatnonzero(buffer.y[:buffer.size] == top)[0])


def test_pluggable_policy_decides_admission_and_victim():
    buf = Buffer(capacity=4, window_len=4, channels=2, num_classes=3, policy=CapPerClass())
    assert buf.add(win(0), 0) and buf.add(win(1), 0)
    assert not buf.add(win(2), 0)  # class 0 already holds half
    assert buf.refused == 1
    assert buf.add(win(3), 1) and buf.add(win(4), 1)
    assert buf.counts == [2, 2, 0]
    assert buf.add(win(5), 2)  # full: overwrites the first window of class 0 (argmax tie -> 0)
    assert buf.counts == [1, 2, 1]
    assert sorted(int(x[0, 0]) for x in buf.X) == [1, 3, 4, 5]
    assert np.array_equal(np.bincount(buf.y, minlength=3), buf.counts)


def test_fifo_policy_is_the_default():
    assert isinstance(Buffer(2, 4, 2, 2).policy, FifoPolicy)
