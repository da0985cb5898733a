"""Windower: window sizes and strides across push boundaries, majority labels, times, bad input."""
import numpy as np
import pytest

from streamfl.sensors.window import UNLABELLED
from streamfl.sensors.windower import Windower, majority_label


def ramp(start, n, channels=2):
    """Samples whose first channel is their global index, so windows show where they started."""
    idx = np.arange(start, start + n, dtype=np.float32)
    return np.stack([idx] + [idx * 10 for _ in range(channels - 1)], axis=1)


def starts(windows):
    return [int(w.x[0, 0]) for w in windows]


@pytest.mark.parametrize("size,stride", [(4, 2), (5, 5), (3, 1), (4, 6), (1, 1)])
@pytest.mark.parametrize("chunk", [1, 3, 7, 100])
def test_windows_match_a_single_push_whatever_the_chunking(size, stride, chunk):
    total = 40
    expected = list(range(0, total - size + 1, stride))
    w = Windower(size, stride)
    out = []
    for s in range(0, total, chunk):
        out += w.push(ramp(s, min(chunk, total - s)), labels=0)
    assert starts(out) == expected
    for win in out:
        assert win.x.shape == (size, 2)
        assert win.x.dtype == np.float32
        np.testing.assert_array_equal(win.x[:, 0], np.arange(win.x[0, 0], win.x[0, 0] + size))
        np.testing.assert_array_equal(win.x[:, 1], win.x[:, 0] * 10)


def test_pending_and_reset():
    w = Windower(5, 2)
    assert w.push(ramp(0, 4), 0) == []
    assert w.pending == 4
    out = w.push(ramp(4, 3), 0)
    assert starts(out) == [0, 2]
    assert w.pending == 3  # samples 4, 5, 6 wait for the window starting at 4
    w.reset()
    assert w.pending == 0
    assert w.push(ramp(100, 4), 0) == []


def test_majority_label_across_pushes():
    w = Windower(6, 6)
    out = w.push(ramp(0, 2), labels=[3, 3])
    out += w.push(ramp(2, 4), labels=[1, 1, 3, 3])
    assert [x.label for x in out] == [3]  # four 3s against two 1s
    out = w.push(ramp(6, 3), labels=[3, 3, 3])
    out += w.push(ramp(9, 3), labels=[1, 1, 1])
    assert [x.label for x in out] == [1]  # a tie goes to the lowest class


def test_majority_ties_go_to_the_lowest_class():
    assert majority_label(np.array([2, 2, 5, 5])) == 2
    assert majority_label(np.array([4, 1, 4, 1, 0])) == 1


def test_unlabelled_needs_a_strict_majority():
    assert majority_label(np.array([-1, -1, 2, 2])) == 2
    assert majority_label(np.array([-1, -1, -1, 2])) == UNLABELLED
    assert majority_label(np.array([-1, -1])) == UNLABELLED
    w = Windower(3, 3)
    assert w.push(ramp(0, 3))[0].label == UNLABELLED  # labels=None


def test_window_time_is_its_last_sample():
    w = Windower(4, 2)
    out = w.push(ramp(0, 8), labels=0, t_s=np.arange(8) * 0.1 + 100.0)
    assert [round(x.t_s, 6) for x in out] == [100.3, 100.5, 100.7]


def test_scalar_time_spreads_back_with_a_sample_rate():
    w = Windower(4, 4, sample_rate_hz=10.0)
    out = w.push(ramp(0, 2), 0, t_s=1.0)  # samples at 0.9, 1.0
    out += w.push(ramp(2, 2), 0, t_s=2.0)  # samples at 1.9, 2.0
    assert len(out) == 1 and out[0].t_s == pytest.approx(2.0)
    w = Windower(4, 4, sample_rate_hz=10.0)
    out = w.push(ramp(0, 6), 0, t_s=5.0)  # samples at 4.5 .. 5.0; window ends at sample 3 = 4.8
    assert out[0].t_s == pytest.approx(4.8)


def test_default_time_is_the_sample_index_or_seconds():
    out = Windower(3, 3).push(ramp(0, 6), 0)
    assert [x.t_s for x in out] == [2.0, 5.0]
    out = Windower(3, 3, sample_rate_hz=2.0).push(ramp(0, 6), 0)
    assert [x.t_s for x in out] == [1.0, 2.5]


def test_labels_per_sample_and_scalar():
    w = Windower(2, 2)
    out = w.push(ramp(0, 4), labels=np.array([1, 1, 0, 0], dtype=np.int32))
    assert [x.label for x in out] == [1, 0]
    assert [x.label for x in w.push(ramp(4, 2), labels=4)] == [4]


@pytest.mark.parametrize("size,stride", [(0, 1), (1, 0), (-3, 1), (2.5, 1), (True, 1), (3, None)])
def test_bad_size_or_stride(size, stride):
    with pytest.raises(ValueError):
        Windower(size, stride)


def test_shape_mismatches_are_value_errors():
    w = Windower(3, 1)
    w.push(ramp(0, 2, channels=3), 0)
    with pytest.raises(ValueError, match="channels"):
        w.push(ramp(2, 2, channels=4), 0)
    with pytest.raises(ValueError, match="labels"):
        w.push(ramp(2, 2, channels=3), labels=[0, 0, 0])
    with pytest.raises(ValueError, match=r"\[n, C\]"):
        w.push(np.zeros((2, 3, 1)), 0)
    with pytest.raises(ValueError, match="t_s"):
        w.push(ramp(2, 2, channels=3), 0, t_s=[1.0])
    with pytest.raises(ValueError, match="class ids"):
        w.push(ramp(2, 2, channels=3), labels=[0, -2])
    with pytest.raises(ValueError, match="integers"):
        w.push(ramp(2, 2, channels=3), labels=[0.5, 1.0])
    with pytest.raises(ValueError, match="channels"):
        Windower(3, 1, channels=2).push(ramp(0, 3, channels=3), 0)


def test_windows_do_not_alias_the_stream():
    w = Windower(2, 1)
    out = w.push(ramp(0, 3), 0)
    out[0].x[:] = -1
    assert out[1].x[0, 0] == 1.0
