"""Replay source: pacing on a fake clock, subject filter, loop, shuffle, and clear errors."""
import itertools

import numpy as np
import pytest

from streamfl.errors import SensorError
from streamfl.sensors import ManualClock, ReplaySource, SensorConfig, make_source, save_npz


@pytest.fixture
def data_file(tmp_path):
    """12 windows [4, 3]; window i has X filled with i, label i % 3, subject 10 + i % 2."""
    n = 12
    X = np.repeat(np.arange(n, dtype=np.float32)[:, None, None], 4, axis=1).repeat(3, axis=2)
    y = np.arange(n, dtype=np.int64) % 3
    subject = 10 + np.arange(n, dtype=np.int64) % 2
    return save_npz(tmp_path / "d.npz", X, y, subject, ["a", "b", "c"])


def ids(windows):
    return [int(w.x[0, 0]) for w in windows]


def test_replays_in_order_and_stops_without_loop(data_file):
    ws = list(ReplaySource(data_file).windows())
    assert ids(ws) == list(range(12))
    assert [w.label for w in ws] == [i % 3 for i in range(12)]
    assert ws[0].x.shape == (4, 3) and ws[0].x.dtype == np.float32
    assert [w.t_s for w in ws[:3]] == [0.0, 1.0, 2.0]


def test_rate_pacing_with_a_fake_clock(data_file):
    clock = ManualClock(50.0)
    src = ReplaySource(data_file, windows_per_s=10.0, clock=clock)
    ws = list(src.windows())
    assert len(ws) == 12
    # one wait before each window after the first, and one more that finds the file exhausted
    assert clock.waits == pytest.approx([0.1] * 12)
    assert clock.now() == pytest.approx(51.2)
    assert [w.t_s for w in ws[:3]] == pytest.approx([0.0, 0.1, 0.2])


def test_function_clock_and_sleep_arguments(data_file):
    now = [0.0]
    slept = []

    def sleep(s):
        slept.append(s)
        now[0] += s

    src = ReplaySource(data_file, windows_per_s=2.0, clock=lambda: now[0], sleep=sleep)
    assert len(list(src.windows())) == 12
    assert slept == pytest.approx([0.5] * 12)


def test_subject_filter(data_file):
    ws = list(ReplaySource(data_file, subject=11).windows())
    assert ids(ws) == [1, 3, 5, 7, 9, 11]
    with pytest.raises(SensorError, match=r"no windows of subject 12 \(subjects: 10, 11\)"):
        ReplaySource(data_file, subject=12)


def test_loop_and_seeded_shuffle(data_file):
    src = ReplaySource(data_file, subject=10, loop=True)
    ws = list(itertools.islice(src.windows(), 14))
    assert ids(ws) == [0, 2, 4, 6, 8, 10] * 2 + [0, 2]
    assert src.passes == 2
    a = ids(itertools.islice(ReplaySource(data_file, loop=True, shuffle=True, seed=5).windows(), 24))
    b = ids(itertools.islice(ReplaySource(data_file, loop=True, shuffle=True, seed=5).windows(), 24))
    c = ids(itertools.islice(ReplaySource(data_file, loop=True, shuffle=True, seed=6).windows(), 24))
    assert a == b != c
    assert sorted(a[:12]) == list(range(12)) and sorted(a[12:]) == list(range(12))
    assert a[:12] != list(range(12)) and a[:12] != a[12:]  # shuffled, and reshuffled per pass


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(SensorError, match="dataset file not found: .*nope.npz"):
        ReplaySource(tmp_path / "nope.npz")


def test_wrong_format_names_the_bad_key(tmp_path):
    bad = tmp_path / "bad.npz"
    np.savez(bad, X=np.zeros((2, 4, 3), np.float64), y=np.zeros(2, np.int64),
             subject=np.zeros(2, np.int64), classes=np.array(["a"]))
    with pytest.raises(SensorError, match="'X'"):
        ReplaySource(bad)
    np.savez(bad, X=np.zeros((2, 4, 3), np.float32), y=np.zeros(2, np.int64),
             classes=np.array(["a"]))
    with pytest.raises(SensorError, match="missing key 'subject'"):
        ReplaySource(bad)


def test_factory_checks_the_file_against_the_config(data_file):
    ok = SensorConfig(kind="replay", path=str(data_file), window_len=4, channels=3, num_classes=3,
                      windows_per_s=0.0, loop=False, subject=10)
    assert ids(make_source(ok, "dev").windows()) == [0, 2, 4, 6, 8, 10]
    wrong = SensorConfig(kind="replay", path=str(data_file))
    with pytest.raises(SensorError, match="4 x 3, the sensor config expects 50 x 6"):
        make_source(wrong, "dev")
    too_few = SensorConfig(kind="replay", path=str(data_file), window_len=4, channels=3,
                           num_classes=2)
    with pytest.raises(SensorError, match="3 classes"):
        make_source(too_few, "dev")
