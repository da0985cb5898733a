"""Device-scheduling policies (methods/schedule/policies/): one contract suite run over every
registered policy on random fleets (sizes down to N = 0 and C = 1, unknown metrics, unreachable
devices, empty devices, tight budgets), then each policy's own ordering or sampling rule on small
cases."""
import math

import numpy as np
import pytest

from streamfl.methods.schedule.policies import (
    POLICIES, Budget, Candidates, RoundInfo, SchedulingPolicy, fill, global_distribution,
    greedy_select, make_policy, temporal_drift,
)
from streamfl.methods.schedule.policies.fedcbs import qcid

TOL = 1e-9
INFO = RoundInfo(k=0, K=10)


def candidates(p_now, samples=None, p_prev=None, L=None, cost=None, grad_norm=None, loss=None,
               snr_hz=None, latency_s=None, busy=None) -> Candidates:
    """Candidates from the arrays given, the rest filled: p_prev = p_now, samples = row sums, L = 1,
    cost 0, metrics unknown."""
    p_now = np.asarray(p_now, dtype=np.float64)
    n, c = p_now.shape
    nan = np.full(n, np.nan)

    def pick(x, default):
        return default if x is None else np.asarray(x, dtype=np.float64)

    return Candidates(
        device_ids=tuple("dev%d" % i for i in range(n)), p_now=p_now,
        p_prev=pick(p_prev, p_now.copy()), samples=pick(samples, p_now.sum(axis=1)),
        L=pick(L, np.ones(c)), cost=pick(cost, np.zeros(n)), grad_norm=pick(grad_norm, nan),
        loss=pick(loss, nan), snr_hz=pick(snr_hz, nan), latency_s=pick(latency_s, nan), busy=busy)


VARIANTS = ("plain", "nan-metrics", "inf-costs", "some-inf", "zero-samples", "max1", "tight",
            "bandwidth", "frame-change", "busy")


def random_case(seed: int, n: int, num_classes: int, variant: str):
    """A random fleet, budget and round for ``variant``."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 30, size=(n, num_classes)).astype(np.float64)
    counts[rng.random((n, num_classes)) < 0.4] = 0.0  # non-IID: each device misses some classes
    prev = counts.copy()
    if variant == "frame-change":
        prev = rng.integers(0, 30, size=(n, num_classes)).astype(np.float64)
    samples = counts.sum(axis=1)
    cost = rng.uniform(1.0, 10.0, n)
    metric = {name: rng.uniform(0.0, 5.0, n) for name in ("grad_norm", "loss", "snr", "lat")}
    for a in metric.values():
        a[rng.random(n) < 0.3] = np.nan
    total, max_devices = math.inf, None
    if variant == "nan-metrics":
        for a in metric.values():
            a[:] = np.nan
    elif variant == "inf-costs":
        cost[:] = np.inf
    elif variant == "some-inf":
        cost[rng.random(n) < 0.5] = np.inf
        total = 12.0
    elif variant == "zero-samples":
        zero = rng.random(n) < 0.5
        samples[zero] = 0.0
        counts[zero & (rng.random(n) < 0.5)] = 0.0
    elif variant == "max1":
        max_devices = 1
    elif variant == "tight":
        total = float(cost.min()) * 1.5 if n else 1.0
    elif variant == "bandwidth":
        total = float(cost.sum()) / 3.0 if n else 1.0
        max_devices = max(1, n // 2)
    elif variant == "busy":  # FedAsync's refill: some devices are still out, the band left is less
        total = float(cost.sum()) / 4.0 if n else 1.0
    if variant in ("plain", "nan-metrics", "zero-samples", "frame-change"):
        cost[:] = 0.0
    busy = rng.random(n) < 0.3 if variant == "busy" else None
    c = candidates(counts, samples=samples, p_prev=prev, L=rng.uniform(0.5, 2.0, num_classes),
                   cost=cost, grad_norm=metric["grad_norm"], loss=metric["loss"],
                   snr_hz=metric["snr"] * 1e6, latency_s=metric["lat"], busy=busy)
    info = RoundInfo(k=int(rng.integers(0, 5)), K=5, sigma=float(rng.uniform(0.0, 2.0)))
    return c, Budget(total=total, max_devices=max_devices), info


CASES = [(seed, n, cl, v) for seed, (n, cl) in enumerate(
    [(0, 3), (1, 1), (1, 4), (2, 2), (7, 1), (7, 5), (40, 3), (40, 10), (120, 6)])
    for v in VARIANTS]


def check_contract(name: str, c: Candidates, budget: Budget, info: RoundInfo) -> np.ndarray:
    before = {f: np.array(getattr(c, f)) for f in ("p_now", "p_prev", "samples", "L", "cost",
                                                   "grad_norm", "loss", "snr_hz", "latency_s")}
    picks = make_policy(name, seed=3).select(c, budget, info)
    again = make_policy(name, seed=3).select(c, budget, info)
    for field, value in before.items():
        np.testing.assert_array_equal(getattr(c, field), value, err_msg=field)
    assert isinstance(picks, np.ndarray) and picks.dtype == np.int64 and picks.ndim == 1
    np.testing.assert_array_equal(picks, again)  # same seed, same inputs: same picks
    assert len(set(picks.tolist())) == picks.size
    assert ((picks >= 0) & (picks < c.num_devices)).all()
    assert np.isfinite(c.cost[picks]).all()
    assert c.cost[picks].sum() <= budget.total * (1 + TOL) + TOL
    if budget.max_devices is not None:
        assert picks.size <= budget.max_devices
    assert c.holds_data()[picks].all()  # nobody without data trains
    assert not c.busy[picks].any()  # nobody still out is invited again
    feasible = ~c.busy & c.holds_data() & np.isfinite(c.cost) & (c.cost <= budget.total)
    if feasible.any() and not c.busy.any():  # eq. 17 may find a set with busy devices big enough
        assert picks.size >= 1
    return picks


@pytest.mark.parametrize("name", list(POLICIES))
@pytest.mark.parametrize("seed,n,num_classes,variant", CASES)
def test_contract(name, seed, n, num_classes, variant):
    c, budget, info = random_case(seed, n, num_classes, variant)
    check_contract(name, c, budget, info)


@pytest.mark.parametrize("name", list(POLICIES))
def test_contract_repeated_calls_stay_deterministic(name):
    c, budget, info = random_case(99, 30, 4, "bandwidth")
    a, b = make_policy(name, seed=5), make_policy(name, seed=5)
    for _ in range(3):
        np.testing.assert_array_equal(a.select(c, budget, info), b.select(c, budget, info))


@pytest.mark.parametrize("name", list(POLICIES))
def test_contract_caller_arrays_untouched(name):
    c, budget, info = random_case(7, 25, 3, "some-inf")
    raw = {f: np.array(getattr(c, f)) for f in ("p_now", "samples", "cost", "loss")}
    c2 = candidates(raw["p_now"], samples=raw["samples"], cost=raw["cost"], loss=raw["loss"])
    copies = {f: a.copy() for f, a in raw.items()}
    make_policy(name).select(c2, budget, info)
    for f in raw:
        np.testing.assert_array_equal(raw[f], copies[f])


@pytest.mark.parametrize("name", list(POLICIES))
def test_contract_names_are_registry_keys(name):
    cls = POLICIES[name]
    assert issubclass(cls, SchedulingPolicy) and cls.name == name
    policy = make_policy(name, seed=1)
    assert type(policy) is cls and policy.name == name


@pytest.mark.parametrize("name", list(POLICIES))
def test_contract_unknown_option_rejected(name):
    with pytest.raises(ValueError, match="unknown option.*bogus"):
        make_policy(name, options={"bogus": 1})


def test_make_policy_unknown_name_lists_known():
    with pytest.raises(ValueError, match="unknown scheduling policy 'nope'.*fedteddi"):
        make_policy("nope")


def test_registry_holds_the_papers_eight():
    assert list(POLICIES) == ["random", "best-channel", "best-norm", "power-of-choice",
                              "pure-drift", "fedcbs", "fedcgd", "fedteddi"]


@pytest.mark.parametrize("name,options", [
    ("power-of-choice", {"candidates": 0}), ("power-of-choice", {"candidates": 2.5}),
    ("power-of-choice", {"d_factor": 0.0}), ("power-of-choice", {"d_factor": float("nan")}),
    ("fedcbs", {"beta": -1.0}), ("fedcbs", {"beta": "2"}),
    ("fedteddi", {"lambda0": -0.5}), ("fedteddi", {"lambda0": float("inf")}),
])
def test_bad_option_values_rejected(name, options):
    with pytest.raises(ValueError, match=name):
        make_policy(name, options=options)


def test_all_policies_run_at_n2000():
    c, budget, info = random_case(11, 2000, 10, "bandwidth")
    for name in POLICIES:
        check_contract(name, c, budget, info)
        check_contract(name, c, Budget(max_devices=20), info)


# -- inputs ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("change,match", [
    ({"p_prev": np.ones((2, 3))}, "p_prev has shape"),
    ({"L": np.ones(3)}, "L has length"),
    ({"samples": np.ones(3)}, "samples has length"),
    ({"p_now": -np.ones((2, 2))}, "p_now must be >= 0"),
    ({"cost": np.array([np.nan, 0.0])}, "cost contains NaN"),
    ({"samples": np.array([np.inf, 1.0])}, "samples contains inf"),
    ({"grad_norm": np.array([-1.0, np.nan])}, "grad_norm must be >= 0"),
    ({"p_now": np.ones(2)}, "p_now must be 2-dimensional"),
    ({"device_ids": ("a", "a")}, "duplicates: a"),
])
def test_candidates_validation(change, match):
    fields = dict(device_ids=("a", "b"), p_now=np.ones((2, 2)), p_prev=np.ones((2, 2)),
                  samples=np.ones(2), L=np.ones(2), cost=np.zeros(2), grad_norm=np.full(2, np.nan),
                  loss=np.full(2, np.nan), snr_hz=np.full(2, np.nan), latency_s=np.full(2, np.nan))
    fields.update(change)
    with pytest.raises(ValueError, match=match):
        Candidates(**fields)


def test_candidates_shape_properties_and_read_only():
    c = candidates(np.ones((3, 4)))
    assert (c.num_devices, c.num_classes) == (3, 4)
    with pytest.raises(ValueError):
        c.cost[0] = 1.0  # a read-only copy
    assert c == c and c != candidates(np.ones((3, 4))) and hash(c) == hash(c)


@pytest.mark.parametrize("kwargs", [{"max_devices": 0}, {"max_devices": 1.5}, {"total": -1.0},
                                    {"total": float("nan")}, {"max_devices": True}])
def test_budget_validation(kwargs):
    with pytest.raises(ValueError, match="Budget"):
        Budget(**kwargs)


@pytest.mark.parametrize("kwargs", [{"k": -1, "K": 3}, {"k": 0, "K": 0},
                                    {"k": 0, "K": 3, "sigma": -1}, {"k": 0, "K": 3, "batch": 0}])
def test_round_info_validation(kwargs):
    with pytest.raises(ValueError, match="RoundInfo"):
        RoundInfo(**kwargs)


# -- fill ------------------------------------------------------------------------------------------

def test_fill_skips_what_does_not_fit_and_tries_the_next():
    c = candidates(np.ones((5, 2)), cost=[np.inf, 6.0, 5.0, 4.0, 1.0])
    np.testing.assert_array_equal(fill([0, 1, 2, 3, 4], c, Budget(total=10.0)), [1, 3])
    np.testing.assert_array_equal(fill([4, 3, 2, 1], c, Budget(total=10.0)), [4, 3, 2])
    np.testing.assert_array_equal(fill([4, 3, 2, 1], c, Budget(total=10.0, max_devices=2)), [4, 3])
    np.testing.assert_array_equal(fill([0, 4], c, Budget()), [4])  # inf never fits, even inf total


def test_fill_skips_devices_without_data():
    c = candidates([[1.0, 0.0], [0.0, 0.0], [2.0, 1.0]], samples=[0.0, 5.0, 3.0])
    np.testing.assert_array_equal(fill([0, 1, 2], c, Budget()), [2])


# -- per policy ------------------------------------------------------------------------------------

def test_random_is_a_seeded_permutation():
    c = candidates(np.ones((50, 2)))
    a = make_policy("random", seed=1).select(c, Budget(), INFO)
    np.testing.assert_array_equal(np.sort(a), np.arange(50))
    np.testing.assert_array_equal(a, np.random.default_rng(1).permutation(50))
    b = make_policy("random", seed=2).select(c, Budget(max_devices=10), INFO)
    assert b.size == 10 and not np.array_equal(a[:10], b)


def test_best_channel_snr_then_latency_then_unknown():
    c = candidates(np.ones((7, 2)), snr_hz=[1e6, np.nan, 5e6, np.nan, 1e6, np.nan, np.nan],
                   latency_s=[0.1, 2.0, 9.0, 0.5, 0.1, np.nan, np.nan])
    np.testing.assert_array_equal(make_policy("best-channel").select(c, Budget(), INFO),
                                  [2, 0, 4, 3, 1, 5, 6])
    np.testing.assert_array_equal(
        make_policy("best-channel").select(c, Budget(max_devices=2), INFO), [2, 0])


def test_best_norm_descending_unknown_last():
    c = candidates(np.ones((5, 2)), grad_norm=[0.5, np.nan, 3.0, 0.5, 1.0])
    np.testing.assert_array_equal(make_policy("best-norm").select(c, Budget(), INFO),
                                  [2, 4, 0, 3, 1])


def test_pure_drift_orders_by_eq9_drift():
    now = np.array([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0], [3.0, 1.0]])
    prev = np.array([[1.0, 1.0], [0.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    c = candidates(now, p_prev=prev, L=[1.0, 2.0])
    # drift: 0, |1-0|+2|0-1| = 3, |0-.5|+2|1-.5| = 1.5, |.75-.5|+2|.25-.5| = .75
    np.testing.assert_allclose(temporal_drift(now, prev, [1.0, 2.0]), [0.0, 3.0, 1.5, 0.75])
    np.testing.assert_array_equal(make_policy("pure-drift").select(c, Budget(), INFO), [1, 2, 3, 0])


def test_power_of_choice_orders_the_draw_by_loss():
    c = candidates(np.ones((6, 2)), loss=[0.1, 5.0, np.nan, 2.0, 3.0, 0.2])
    every = make_policy("power-of-choice", options={"candidates": 6}).select(c, Budget(), INFO)
    np.testing.assert_array_equal(every, [1, 4, 3, 5, 0, 2])
    for seed in range(10):
        two = make_policy("power-of-choice", seed=seed, options={"candidates": 2}).select(
            c, Budget(), INFO)
        assert two.size == 2
        assert np.isnan(c.loss[two[1]]) or c.loss[two[0]] >= c.loss[two[1]]


def test_power_of_choice_default_d_and_data_weighting():
    policy = make_policy("power-of-choice")
    assert policy.candidate_count(100, Budget(max_devices=5)) == 10
    assert policy.candidate_count(100, Budget()) == 100  # 2.0 * (100 // 2)
    assert make_policy("power-of-choice", options={"d_factor": 1.5}).candidate_count(
        9, Budget(max_devices=3)) == 5
    # the draw follows the sample counts: a device with 99% of the data is nearly always in it
    c = candidates(np.ones((4, 2)), samples=[990.0, 5.0, 3.0, 2.0], loss=[0.0, 1.0, 1.0, 1.0])
    hits = sum(0 in make_policy("power-of-choice", seed=s, options={"candidates": 1}).select(
        c, Budget(), INFO) for s in range(50))
    assert hits >= 45


def test_fedcbs_qcid_hand_computed():
    # {0, 1}: pooled (10 [1, 0] + 30 [0, 1]) / 40 = [.25, .75]: (.25-.5)^2 + (.75-.5)^2 = .125
    p = np.array([[2.0, 0.0], [0.0, 6.0], [1.0, 1.0]])
    assert qcid(p, [10.0, 30.0, 4.0], [0, 1]) == pytest.approx(0.125)
    assert qcid(p, [10.0, 30.0, 4.0], [2]) == pytest.approx(0.0)
    assert qcid(p, [10.0, 30.0, 4.0], []) == 0.0


def test_fedcbs_prefers_balanced_sets():
    one_class = np.array([[5.0, 0.0], [5.0, 0.0], [0.0, 5.0], [0.0, 5.0]])
    c = candidates(one_class)
    for seed in range(20):
        picks = make_policy("fedcbs", seed=seed, options={"beta": 20.0}).select(
            c, Budget(max_devices=2), INFO)
        assert sorted(one_class[picks].argmax(axis=1).tolist()) == [0, 1]
    # beta = 0 is uniform: same-class pairs happen
    pairs = [make_policy("fedcbs", seed=s, options={"beta": 0.0}).select(
        c, Budget(max_devices=2), INFO) for s in range(40)]
    assert any(one_class[p].argmax(axis=1)[0] == one_class[p].argmax(axis=1)[1] for p in pairs)


def test_fedcbs_everything_fits_takes_everyone():
    c = candidates(np.ones((5, 3)), samples=[1.0, 0.0, 1.0, 1.0, 1.0])
    np.testing.assert_array_equal(make_policy("fedcbs").select(c, Budget(), INFO), [0, 2, 3, 4])


def _teddi_case():
    # devices 0, 1 hold old classes only; 2, 3 gained class 2 this frame
    now = np.array([[10.0, 10.0, 0.0], [10.0, 0.0, 0.0], [0.0, 5.0, 10.0], [5.0, 0.0, 10.0],
                    [10.0, 10.0, 0.0]])
    prev = now.copy()
    prev[2:4, 2] = 0.0
    prev[2, 0] = 10.0
    prev[3, 1] = 10.0
    return now, prev


@pytest.mark.parametrize("name,lambda0", [("fedcgd", 0.0), ("fedteddi", 2.0)])
def test_teddi_policies_are_greedy_select(name, lambda0):
    now, prev = _teddi_case()
    cost = np.array([3.0, 2.0, 4.0, 1.0, np.inf])
    c = candidates(now, p_prev=prev, cost=cost)
    info = RoundInfo(k=1, K=4, sigma=0.5, batch=8)
    budget = Budget(total=7.0, max_devices=3)
    expect = greedy_select(now, prev, np.where(np.isfinite(cost), now.sum(axis=1), 0.0), np.ones(3),
                           1, 4, lambda0=lambda0, sigma=0.5, batch=8, max_devices=3,
                           bandwidth_hz=cost, total_bandwidth_hz=7.0,
                           p_global=global_distribution(now, now.sum(axis=1)))
    np.testing.assert_array_equal(make_policy(name).select(c, budget, info), expect)


def test_fedteddi_rewards_drift_early_in_a_frame_fedcgd_does_not():
    now, prev = _teddi_case()
    c = candidates(now, p_prev=prev)
    first_teddi = make_policy("fedteddi").select(c, Budget(max_devices=1), RoundInfo(k=0, K=10))
    first_cgd = make_policy("fedcgd").select(c, Budget(max_devices=1), RoundInfo(k=0, K=10))
    assert first_teddi[0] in (2, 3)
    assert first_cgd[0] not in (2, 3)
    # lambda0 = 0 makes fedteddi fedcgd
    np.testing.assert_array_equal(
        make_policy("fedteddi", options={"lambda0": 0}).select(c, Budget(), RoundInfo(0, 10)),
        make_policy("fedcgd").select(c, Budget(), RoundInfo(0, 10)))


def test_teddi_policies_never_take_unreachable_devices_with_no_budget():
    now, prev = _teddi_case()
    c = candidates(now, p_prev=prev, cost=[np.inf, np.inf, np.inf, 0.0, np.inf])
    for name in ("fedcgd", "fedteddi"):
        np.testing.assert_array_equal(make_policy(name).select(c, Budget(), INFO), [3])


def test_greedy_starts_from_the_devices_already_in_the_set():
    # Devices 0 and 1 (class 0) are out training: the set needs class 1, so the greedy takes a
    # class-1 device first, and eq. 17 counts the two busy ones in |S|.
    p = [[10, 0], [10, 0], [10, 0], [0, 10], [0, 10]]
    c = candidates(p, busy=[True, True, False, False, False])
    picks = make_policy("fedcgd").select(c, Budget(), RoundInfo(k=0, K=10, sigma=0.0))
    assert picks.tolist()[0] in (3, 4) and not set(picks.tolist()) & {0, 1}
    assert picks.tolist() == greedy_select(p, p, np.full(5, 10.0), np.ones(2), 0, 10, lambda0=0.0,
                                           sigma=0.0, given=[0, 1]).tolist()
    # Balanced already (one of each class busy): with no variance to win, nothing is added.
    even = [[10, 0], [10, 0], [0, 10], [0, 10]]
    both = candidates(even, busy=[True, False, True, False])
    assert make_policy("fedcgd").select(both, Budget(), RoundInfo(k=0, K=10, sigma=0.0)).size == 0
    # FedCBS balances with them too: a class-1 device is far likelier than a class-0 one.
    draws = [make_policy("fedcbs", seed=s).select(c, Budget(max_devices=1), INFO)[0]
             for s in range(50)]
    assert sum(d in (3, 4) for d in draws) >= 45
