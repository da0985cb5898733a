"""Synthetic IMU source: determinism, per-user variability, schedules, pacing, learnability."""
import itertools

import numpy as np
import pytest

from streamfl.config import build
from streamfl.errors import ConfigError, SensorError
from streamfl.sensors import (AllClasses, ManualClock, Rotating, SensorConfig, Sequence,
                              SyntheticSource, make_schedule, make_source, synthetic_dataset)
from streamfl.sensors.synthetic import class_signatures, user_for_device

UNPACED = SensorConfig(windows_per_s=0.0)


def take(source, n):
    return list(itertools.islice(source.windows(), n))


def stack(windows):
    return np.stack([w.x for w in windows]), np.array([w.label for w in windows])


def test_windows_have_the_configured_shape_and_valid_labels():
    cfg = SensorConfig(windows_per_s=0, window_len=40, stride=10, channels=3, num_classes=4)
    ws = take(SyntheticSource(cfg, user_id=3), 30)
    assert all(w.x.shape == (40, 3) and w.x.dtype == np.float32 for w in ws)
    assert all(0 <= w.label < 4 for w in ws)
    assert all(np.isfinite(w.x).all() for w in ws)
    # unpaced stream time is the signal's own time: index * stride / sample_rate_hz
    assert [w.t_s for w in ws[:3]] == [0.0, 0.2, 0.4]


def test_deterministic_given_seed_and_user():
    a, ya = stack(take(SyntheticSource(UNPACED, user_id=7), 40))
    b, yb = stack(take(SyntheticSource(UNPACED, user_id=7), 40))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ya, yb)
    c, _ = stack(take(SyntheticSource(SensorConfig(windows_per_s=0, seed=1), user_id=7), 40))
    assert not np.array_equal(a, c)


def test_users_differ_in_orientation_gain_and_noise():
    X, y, subject = synthetic_dataset(240, [1, 2], seed=0)
    for label in range(6):
        m1 = X[(y == label) & (subject == 1)].mean(axis=(0, 1))
        m2 = X[(y == label) & (subject == 2)].mean(axis=(0, 1))
        # the same activity points gravity elsewhere for another user (sensor mounted differently)
        assert np.abs(m1[:3] - m2[:3]).max() > 0.05
    a, _, _ = synthetic_dataset(12, [5], seed=3)
    b, _, _ = synthetic_dataset(12, [6], seed=3)
    assert not np.allclose(a, b, atol=0.05)


def test_dataset_is_balanced_and_typed():
    cfg = SensorConfig(num_classes=5)
    X, y, subject = synthetic_dataset(103, 4, seed=1, cfg=cfg)
    assert X.shape == (103, 50, 6) and X.dtype == np.float32
    assert y.dtype == np.int64 and subject.dtype == np.int64
    counts = np.bincount(y, minlength=5)
    assert counts.max() - counts.min() <= 1
    assert set(subject.tolist()) == {0, 1, 2, 3}
    X2, y2, s2 = synthetic_dataset(103, 4, seed=1, cfg=cfg)
    np.testing.assert_array_equal(X, X2)
    with pytest.raises(ValueError):
        synthetic_dataset(10, [], seed=0)


def _features(X):
    return np.concatenate([X.mean(axis=1), X.std(axis=1)], axis=1)


def test_classes_separable_on_unseen_users_by_nearest_centroid():
    Xtr, ytr, _ = synthetic_dataset(600, list(range(10)), seed=0)
    Xte, yte, _ = synthetic_dataset(300, [50, 51, 52], seed=1)
    ftr, fte = _features(Xtr), _features(Xte)
    mu, sd = ftr.mean(0), ftr.std(0) + 1e-6
    cents = np.stack([((ftr - mu) / sd)[ytr == c].mean(0) for c in range(6)])
    pred = (((fte - mu) / sd)[:, None, :] - cents[None]).__pow__(2).sum(2).argmin(1)
    assert (pred == yte).mean() > 0.8  # chance is 1/6


def test_lstm_learns_the_classes_in_a_few_hundred_sgd_steps():
    torch = pytest.importorskip("torch")
    from streamfl.models import ModelSpec, build_model

    torch.manual_seed(0)
    Xtr, ytr, _ = synthetic_dataset(1200, list(range(8)), seed=0)
    Xte, yte, _ = synthetic_dataset(300, [90, 91, 92], seed=1)
    model = build_model(ModelSpec(), 0.0, 0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xt, yt = torch.from_numpy(Xtr), torch.from_numpy(ytr)
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        idx = torch.randint(0, len(xt), (32,), generator=gen)
        loss = torch.nn.functional.cross_entropy(model(xt[idx]), yt[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        acc = (model(torch.from_numpy(Xte)).argmax(1).numpy() == yte).mean()
    assert acc > 0.8, acc


def test_stream_labels_follow_the_schedule():
    cfg = SensorConfig(windows_per_s=0.0, num_classes=6)
    seq = Sequence([(20.0, [4]), (20.0, [0, 2])], loop=False)
    ws = take(SyntheticSource(cfg, user_id=1, schedule=seq), 120)  # 0.5 s per window: 60 s
    first = {w.label for w in ws if w.t_s < 19.0}
    second = {w.label for w in ws if 21.0 <= w.t_s}
    assert first == {4}
    assert second == {0, 2}  # both are picked: uniform among the active classes


def test_rotating_schedule_limits_classes_per_phase_and_uses_offsets():
    cfg = SensorConfig(windows_per_s=0.0, classes_per_phase=2, phase_s=10.0)
    src = SyntheticSource(cfg, user_id=0, schedule=Rotating(2, 10.0, range(6), offset=0))
    ws = take(src, 200)  # 100 s of stream time: 10 phases
    for phase in range(10):
        labels = {w.label for w in ws if phase * 10 + 1.5 <= w.t_s < phase * 10 + 9.5}
        allowed = {(2 * phase) % 6, (2 * phase + 1) % 6}
        assert labels and labels <= allowed, (phase, labels)
    other = take(SyntheticSource(cfg, user_id=0, schedule=Rotating(2, 10.0, range(6), offset=3)), 15)
    assert {w.label for w in other[3:]} <= {3, 4}


def test_schedule_units():
    assert AllClasses(3).active_classes(123.0) == (0, 1, 2)
    r = Rotating(2, 5.0, [5, 3, 1], offset=1)
    assert r.active_classes(0.0) == (3, 1)
    assert r.active_classes(5.0) == (5, 3)
    assert r.active_classes(10.0) == (1, 5)
    seq = Sequence([(1.0, [0]), (2.0, (1, 2))])
    assert [seq.active_classes(t) for t in (0.5, 1.5, 2.9, 3.2)] == [(0,), (1, 2), (1, 2), (0,)]
    assert Sequence([(1.0, [0]), (1.0, [1])], loop=False).active_classes(50.0) == (1,)
    for bad in (lambda: Rotating(0, 1.0, [0, 1]), lambda: Rotating(3, 1.0, [0, 1]),
                lambda: Rotating(1, 0.0, [0]), lambda: Sequence([]),
                lambda: Sequence([(0.0, [1])]), lambda: Sequence([(1.0, [])]),
                lambda: Sequence([(1.0, [-1])]), lambda: Sequence([5])):
        with pytest.raises(ValueError):
            bad()


def test_schedule_with_an_unknown_class_is_a_sensor_error():
    src = SyntheticSource(SensorConfig(windows_per_s=0, num_classes=3), schedule=AllClasses(5))
    with pytest.raises(SensorError, match="valid ids are 0..2"):
        take(src, 200)


def test_pacing_with_a_manual_clock():
    clock = ManualClock(100.0)
    src = SyntheticSource(SensorConfig(windows_per_s=4.0), user_id=1, clock=clock)
    ws = take(src, 9)
    assert clock.waits == pytest.approx([0.25] * 8)
    assert clock.now() == pytest.approx(102.0)
    assert [w.t_s for w in ws] == pytest.approx([i * 0.25 for i in range(9)])
    assert src.emitted == 9


def test_slow_consumer_gets_no_catch_up_burst():
    clock = ManualClock()
    src = SyntheticSource(SensorConfig(windows_per_s=2.0), clock=clock)
    it = src.windows()
    next(it)
    clock.advance(5.0)  # the consumer was busy for 10 periods
    next(it)
    next(it)
    assert clock.waits == pytest.approx([0.5])


def test_virtual_clock_drives_the_schedule_through_the_factory():
    clock = ManualClock(0.0)
    cfg = SensorConfig(windows_per_s=0.0, schedule="rotating", classes_per_phase=1, phase_s=10.0,
                       phase_offset=0, user_id=1)
    it = make_source(cfg, "dev-a", clock=clock).windows()
    assert {next(it).label for _ in range(5)} == {0}
    clock.advance(25.0)  # phase 2 of the shared virtual timeline
    ws = [next(it) for _ in range(5)]
    assert {w.label for w in ws[2:]} == {2}
    assert ws[-1].t_s == 25.0


def test_factory_derives_user_and_offset_from_the_device_id():
    cfg = SensorConfig(windows_per_s=0)
    a = make_source(cfg, "jetson-01")
    b = make_source(cfg, "jetson-02")
    assert a.user_id == user_for_device("jetson-01") != b.user_id
    assert make_source(cfg, "jetson-01").user_id == a.user_id  # stable across processes (crc32)
    sched = make_schedule(SensorConfig(user_id=8, num_classes=6), 8)
    assert sched.active_classes(0.0) == (2, 3)
    assert make_schedule(SensorConfig(schedule="all"), 0).active_classes(0.0) == tuple(range(6))


def test_class_signatures_are_shared_and_distinct():
    sigs = class_signatures(6)
    assert [s.freq_hz for s in sigs] == [s.freq_hz for s in class_signatures(6)]
    g = np.array([s.gravity for s in sigs])
    angles = np.degrees(np.arccos(np.clip(g @ g.T, -1, 1)))
    np.fill_diagonal(angles, 180)
    assert angles.min() >= 44.0


@pytest.mark.parametrize("values,key", [
    ({"kind": "camera"}, "kind"), ({"windows_per_s": -1.0}, "windows_per_s"),
    ({"window_len": 0}, "window_len"), ({"stride": 0}, "stride"), ({"num_classes": 1}, "num_classes"),
    ({"schedule": "random"}, "schedule"), ({"classes_per_phase": 7}, "classes_per_phase"),
    ({"phase_s": 0.0}, "phase_s"), ({"sample_rate_hz": 0.0}, "sample_rate_hz"),
    ({"noise": -0.1}, "noise"), ({"kind": "replay"}, "path"), ({"channels": 4}, "channels"),
    ({"user_id": -1}, "user_id"), ({"queue_len": 0}, "queue_len"),
    ({"windows_per_s": float("nan")}, "windows_per_s"),
])
def test_config_validation_names_the_key(values, key):
    with pytest.raises(ValueError, match=key):
        SensorConfig(**values)
    with pytest.raises(ConfigError, match=key):
        build(SensorConfig, values, "agent.yaml [sensor]")


def test_config_defaults_match_the_model_defaults():
    cfg = build(SensorConfig, {}, "defaults")
    assert (cfg.kind, cfg.window_len, cfg.channels, cfg.num_classes) == ("synthetic", 50, 6, 6)
    assert build(SensorConfig, {"kind": "mqtt", "channels": 9}, "x").channels == 9
