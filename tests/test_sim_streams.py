"""Device streams over virtual time: determinism, exact arrival partition, each kind's property."""
import numpy as np
import pytest

from streamfl.errors import ConfigError
from streamfl.sensors.datasets import Dataset
from streamfl.sim.partition import partition
from streamfl.sim.streams import KINDS, make_streams

K = 10


def small_dataset(n=400, k=K):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 4, 3)).astype(np.float32)
    y = np.arange(n, dtype=np.int64) % k
    return Dataset(X, y, np.arange(n, dtype=np.int64) % 5, np.asarray(["c%d" % c for c in range(k)]))


DS = small_dataset()
PARTS = partition(DS, 6, "shards", seed=0, shards_per_device=2)


def streams(kind, seed=0, rate=4.0, duration=200.0, parts=PARTS, **params):
    return make_streams(DS, parts, kind, seed, rate, duration, **params)


@pytest.mark.parametrize("kind", KINDS)
def test_same_seed_same_windows_and_calls_partition_the_timeline(kind):
    a, b = streams(kind)[2], streams(kind)[2]
    X, y = a.windows(0, 100)
    parts = [b.windows(t0, t1) for t0, t1 in [(0, 3.3), (3.3, 3.3), (3.3, 50), (50, 77.7), (77.7, 100)]]
    np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), y)
    np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), X)
    assert X.dtype == np.float32 and y.dtype == np.int64 and X.shape == (len(y), 4, 3)
    assert len(y) == a.count(0, 100) == 400  # 4 windows/s on a fixed grid
    times = a.arrival_times_s(0, 100)
    assert times.min() >= 0 and times.max() < 100 and np.all(np.diff(times) > 0)
    other = streams(kind, seed=1)[2].windows(0, 100)[1]
    assert not np.array_equal(other, y)
    dist = a.class_distribution(42.0)
    assert dist.shape == (K,) and abs(dist.sum() - 1) < 1e-9 and (dist >= 0).all()


@pytest.mark.parametrize("kind", KINDS)
def test_windows_follow_the_schedule_and_classes_seen_grows(kind):
    s = streams(kind)[1]
    rows, y, period = s.draw(0, 200)
    times = s.arrival_times_s(0, 200)
    for t, c, p in zip(times[::7], y[::7], period[::7]):
        assert s.class_distribution(t)[c] > 0
        assert s.period(t) == p
        assert c in s.classes_seen(t)
    assert np.array_equal(DS.y[rows], y)
    seen = [s.classes_seen(t) for t in (0, 50, 100, 199)]
    assert all(a <= b for a, b in zip(seen, seen[1:]))
    bounds = s.period_bounds_s
    assert bounds[0] == 0 and np.all(np.diff(bounds) > 0) and len(bounds) == s.num_periods


def test_samples_come_from_the_pool_or_borrow_the_class_globally():
    s = streams("iid")[0]
    rows, y, _ = s.draw(0, 200)
    pool_classes = set(DS.y[s.pool].tolist())
    own = np.isin(y, list(pool_classes))
    assert own.any() and (~own).any()
    assert np.isin(rows[own], s.pool).all() and not np.isin(rows[~own], s.pool).any()
    local = streams("iid", missing="local")[0]
    y_local = local.windows(0, 200)[1]
    assert set(y_local.tolist()) <= pool_classes
    assert set(local.classes_seen(200)) == pool_classes


def test_iid_mix_pool_uses_the_pool_class_shares():
    s = streams("iid", mix="pool")[0]
    expect = np.bincount(DS.y[s.pool], minlength=K) / len(s.pool)
    np.testing.assert_allclose(s.class_distribution(10.0), expect)


def test_extreme_has_exactly_one_class_per_period():
    ss = streams("extreme", duration=400.0, mu_s=20.0, sigma_s=3.0)
    for s in ss:
        _, y, period = s.draw(0, 400)
        for p in np.unique(period):
            assert len(np.unique(y[period == p])) == 1
        mid = (s.period_bounds_s[:-1] + s.period_bounds_s[1:]) / 2
        assert all(np.count_nonzero(s.class_distribution(t)) == 1 for t in mid)
        assert len(s.period_bounds_s) > 10
        lengths = np.diff(s.period_bounds_s)
        assert 10 < lengths.mean() < 30 and lengths.min() >= 5.0
    assert not np.array_equal(ss[0].period_bounds_s, [])
    np.testing.assert_array_equal(ss[0].period_bounds_s, ss[1].period_bounds_s)  # shared switches
    orders = {tuple(int(np.argmax(s.class_distribution(t))) for t in (1, 25, 45)) for s in ss}
    assert len(orders) > 1  # each device its own class order
    same = streams("extreme", mu_s=20.0, shared_order=True)
    assert len({int(np.argmax(s.class_distribution(30.0))) for s in same}) == 1


def test_non_extreme_mix_is_constant_within_a_period_and_differs_across_devices():
    ss = streams("non_extreme", mu_s=20.0, beta=0.1)
    b = ss[0].period_bounds_s
    dist = ss[0].class_distribution
    np.testing.assert_array_equal(dist(b[1] + 0.1), dist(b[2] - 0.1))
    assert not np.allclose(ss[0].class_distribution(b[1] + 0.1), ss[0].class_distribution(b[2] + 0.1))
    assert not np.allclose(ss[0].class_distribution(5.0), ss[1].class_distribution(5.0))


def test_periodic_repeats_every_period():
    s = streams("periodic", period_s=60.0, phases=4)[0]
    for t in (1.0, 17.0, 31.0, 59.0):
        np.testing.assert_array_equal(s.class_distribution(t), s.class_distribution(t + 120.0))
    assert s.period(61.0) == 4
    one = streams("periodic", period_s=60.0, phases=5, beta=None)[0]
    assert all(np.count_nonzero(one.class_distribution(t)) == 1 for t in (1.0, 13.0, 25.0))


def test_aperiodic_rare_classes_hold_about_rare_prob_of_the_time():
    ss = streams("aperiodic_rare", duration=20000.0, n_rare=2, rare_prob=0.05, mu_s=50.0, burst_s=5.0)
    rare = ss[0].meta["rare_classes"]
    assert len(rare) == 2 and all(s.meta["rare_classes"] == rare for s in ss)
    ts = np.arange(0, 20000.0, 0.5)
    probs = ss[0].timeline.probs(ts)
    for c in rare:
        assert 0.03 < (probs[:, c] > 0).mean() < 0.07
    common = np.setdiff1d(np.arange(K), rare)
    assert (probs[:, common] > 0).any(axis=0).all()
    assert np.all(np.count_nonzero(probs, axis=1) == 1)


def test_new_class_frames_add_at_most_one_class_per_device_per_frame():
    parts = partition(DS, 30, "iid", seed=0)
    ss = streams("new_class_frames", parts=parts, frame_s=50.0)
    sets = [[set(np.flatnonzero(s.class_distribution(f * 50.0 + 1)).tolist()) for f in range(4)]
            for s in ss]
    initial = set(ss[0].params["initial_classes"])
    assert len(initial) == 6
    assert all(1 <= len(d[0]) <= 2 and d[0] <= initial for d in sets)
    assert set().union(*[d[0] for d in sets]) == initial
    for f in range(1, 4):
        gained = [len(d[f] - d[f - 1]) for d in sets]
        assert all(d[f - 1] <= d[f] for d in sets) and max(gained) <= 1
        if f <= 2:
            assert sum(gained) == 12  # 40% of 30 devices, while new classes remain
    new = set(range(K)) - initial
    assert set().union(*[d[2] for d in sets]) >= new  # both blocks arrived by frame 2
    dist = ss[0].class_distribution(1.0)
    np.testing.assert_allclose(dist[dist > 0], 1.0 / np.count_nonzero(dist))


def test_a_long_first_frame_delays_every_later_frame_and_changes_nothing_else():
    parts = partition(DS, 30, "iid", seed=0)
    same = streams("new_class_frames", parts=parts, frame_s=50.0)
    long_first = streams("new_class_frames", parts=parts, frame_s=50.0, first_frame_s=200.0)
    for a, b in zip(same, long_first):
        assert a.period(49.0) == b.period(199.0) == 0 and b.period(200.0) == 1 and b.period(250.0) == 2
        for t_a, t_b in [(1.0, 1.0), (51.0, 201.0), (101.0, 251.0)]:
            np.testing.assert_array_equal(a.class_distribution(t_a), b.class_distribution(t_b))
    with pytest.raises(ConfigError, match="first_frame_s"):
        streams("new_class_frames", parts=parts, frame_s=50.0, first_frame_s=0.0)


@pytest.mark.parametrize("overlap", [0.0, 0.2, 0.8])
@pytest.mark.parametrize("per_device", [False, True])
def test_sessions_label_sets_overlap_as_configured(overlap, per_device):
    ss = streams("sessions", duration=300.0, session_s=30.0, label_overlap=overlap,
                 dirichlet_alpha=0.7, per_device=per_device)
    for s in ss[:3]:
        sets = [set(np.flatnonzero(s.class_distribution(30.0 * j + 15)).tolist()) for j in range(10)]
        assert all(len(a) == K // 2 for a in sets)
        measured = [len(a & b) / len(b) for a, b in zip(sets, sets[1:])]
        assert np.allclose(measured, overlap)
        assert s.num_periods == 10 and s.period(45.0) == 1
    if not per_device:
        assert ss[0].class_distribution(15.0).nonzero()[0].tolist() == \
            ss[1].class_distribution(15.0).nonzero()[0].tolist()
        assert not np.allclose(ss[0].class_distribution(15.0), ss[1].class_distribution(15.0))


def test_domain_incremental_permutes_each_period_with_a_fixed_permutation():
    ss = streams("domain_incremental", duration=100.0)
    s = ss[0]
    assert s.num_periods == 5 and np.allclose(s.period_bounds_s, [0, 20, 40, 60, 80])
    X, y = s.windows(0, 100)
    rows, y2, period = s.draw(0, 100)
    np.testing.assert_array_equal(y, y2)
    np.testing.assert_array_equal(X[period == 0], DS.X[rows[period == 0]])  # period 0: identity
    for p in range(1, 5):
        np.testing.assert_array_equal(X[period == p], s.transform(DS.X[rows[period == p]], p))
    probe = DS.X[:3]
    outs = [s.transform(probe, p) for p in range(5)]
    assert all(not np.array_equal(outs[a], outs[b]) for a in range(5) for b in range(a + 1, 5))
    np.testing.assert_array_equal(outs[2], ss[3].transform(probe, 2))  # same domain on every device
    np.testing.assert_array_equal(np.sort(outs[3].ravel()), np.sort(probe.ravel()))
    assert s.period(1e6) == 4  # the last domain holds
    assert np.allclose(s.class_distribution(50.0), 1.0 / K)


@pytest.mark.parametrize("access", ["partial", "full"])
def test_latent_states_visit_only_the_accessible_states(access):
    ss = streams("latent_states", duration=1000.0, state_s=5.0, access=access, n_states=12,
                 states_per_device=3)
    visited_all = set()
    for s in ss:
        accessible = s.meta["accessible_states"]
        assert len(accessible) == (3 if access == "partial" else 12)
        assert np.count_nonzero(s.meta["state_probs"]) == len(accessible)
        visited = {s.state(t) for t in np.arange(0, 1000.0, 5.0)}
        assert visited <= accessible
        visited_all |= visited
        for t in (2.5, 502.5):
            np.testing.assert_array_equal(s.class_distribution(t),
                                          s.meta["state_class_probs"][s.state(t)])
    assert len(visited_all) > 3
    assert streams("iid")[0].state(1.0) is None


def test_long_runs_grow_lazily():
    s = streams("extreme", duration=1e9, mu_s=10.0)[0]
    X, y = s.windows(5e4, 5e4 + 10)
    assert len(y) == 40 and len(s.timeline.starts_s) < 6000


def test_bad_kind_or_parameter_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown stream kind"):
        streams("bogus")
    with pytest.raises(ConfigError, match="'period_s'"):
        streams("extreme", period_s=3)
    with pytest.raises(ConfigError, match="missing"):
        streams("iid", missing="nowhere")
    with pytest.raises(ConfigError, match="windows_per_s"):
        streams("iid", rate=0)


def test_domain_incremental_channel_permutations_and_sensor_rotations():
    """"channels" permutes the last axis; "rotation" turns each x/y/z triple by one rotation (norms
    kept, the same on every device, another per period); a bad domain is a ConfigError."""
    probe = DS.X[:5]
    chans = streams("domain_incremental", duration=100.0, domain="channels")
    out = chans[0].transform(probe, 2)
    assert sorted(map(tuple, out[0].T.tolist())) == sorted(map(tuple, probe[0].T.tolist()))
    np.testing.assert_array_equal(chans[0].transform(probe, 0), probe)
    rot = streams("domain_incremental", duration=100.0, domain="rotation")
    turned = [rot[0].transform(probe, p) for p in (1, 2)]
    np.testing.assert_allclose(np.linalg.norm(turned[0], axis=-1), np.linalg.norm(probe, axis=-1), rtol=1e-5)
    assert not np.allclose(turned[0], probe) and not np.allclose(turned[0], turned[1])
    np.testing.assert_array_equal(rot[4].transform(probe, 1), turned[0])
    R = rot[0]._perms[1]
    assert np.linalg.det(R) == pytest.approx(1.0, abs=1e-5)      # a rotation, not a reflection
    with pytest.raises(ConfigError):
        streams("domain_incremental", duration=100.0, domain="mirror")
