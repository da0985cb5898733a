"""FedTeddi's scheduling math (methods/schedule/policies/teddi.py): eq. 9, 11, 14, 15, 17, 18 on small
cases worked out by hand, the greedy's choices and budgets, and the vectorized greedy against a plain
loop version of Algorithm 1 on random fleets."""
import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.special import lambertw

from streamfl.methods.schedule.policies import (
    allocate_bandwidth, class_weights, collective_divergence, drift_weight, global_distribution,
    greedy_select, temporal_drift, utility,
)

# Three devices, two classes. Device 2 holds exactly the global mix:
#   global = (100 [1, 0] + 200 [0, 1] + 50 [1/3, 2/3]) / 350 = [350/3, 700/3] / 350 = [1/3, 2/3].
P3 = np.array([[1.0, 0.0], [0.0, 1.0], [1 / 3, 2 / 3]])
D3 = np.array([100.0, 200.0, 50.0])
ONES2 = np.ones(2)
# Second greedy step from S = {2} (lambda = 0): adding device 1 gives the mix
#   (50 [1/3, 2/3] + 200 [0, 1]) / 250 = [1/15, 14/15], divergence |1/15 - 1/3| + |14/15 - 2/3| = 8/15;
# adding device 0 gives (50 [1/3, 2/3] + 100 [1, 0]) / 150 = [7/9, 2/9], divergence 8/9.
# eq. 17 then holds iff 8/15 <= sigma / sqrt(b) (1 - 1/sqrt(2)).
SIGMA_STAR = (8 / 15) * math.sqrt(32) / (1 - 1 / math.sqrt(2))


# -- eq. 9 -------------------------------------------------------------------------------------------

def test_temporal_drift_hand_computed():
    # L = [1, 2, 3]. Device 0: |0.5 - 1| 1 + |0.5 - 0| 2 + 0 = 1.5. Device 1 unchanged: 0.
    # Device 2 moved to a class new this frame (previous share 0): |0 - 1| 1 + |1 - 0| 3 = 4.
    p_now = [[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]
    p_prev = [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    np.testing.assert_allclose(temporal_drift(p_now, p_prev, [1.0, 2.0, 3.0]), [1.5, 0.0, 4.0])


def test_temporal_drift_normalizes_counts_and_empty_history():
    # Counts [2, 2, 0] are the mix [0.5, 0.5, 0]; a device with no history (zero row) drifted by its
    # whole mix: 0.5 1 + 0.5 2 = 1.5.
    drift = temporal_drift([[2, 2, 0], [2, 2, 0]], [[10, 0, 0], [0, 0, 0]], [1.0, 2.0, 3.0])
    np.testing.assert_allclose(drift, [1.5, 1.5])


# -- eq. 11 ------------------------------------------------------------------------------------------

def test_global_distribution_is_sample_weighted():
    np.testing.assert_allclose(global_distribution(P3, D3), [1 / 3, 2 / 3])
    # A device that holds nothing does not dilute the mix, whatever its sample count says.
    np.testing.assert_allclose(global_distribution(np.vstack([P3, [0, 0]]), np.append(D3, 1000)),
                               [1 / 3, 2 / 3])


def test_collective_divergence_hand_computed():
    p = [[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]
    samples = [100, 300, 200]
    # global = (100 [1, 0] + 300 [0, 1] + 200 [.5, .5]) / 600 = [1/3, 2/3]
    # {0}: |1 - 1/3| + |0 - 2/3| = 4/3; with L = [2, 1]: 2 (2/3) + 2/3 = 2.
    assert collective_divergence(p, samples, ONES2, [0]) == pytest.approx(4 / 3)
    assert collective_divergence(p, samples, [2.0, 1.0], [0]) == pytest.approx(2.0)
    # {0, 1}: shares normalized over the set, a = [1/4, 3/4], mix [1/4, 3/4]: 1/12 + 1/12 = 1/6.
    assert collective_divergence(p, samples, ONES2, [0, 1]) == pytest.approx(1 / 6)
    # {2}: |1/2 - 1/3| + |1/2 - 2/3| = 1/3; all three = the global mix: 0.
    assert collective_divergence(p, samples, ONES2, [2]) == pytest.approx(1 / 3)
    assert collective_divergence(p, samples, ONES2, [0, 1, 2]) == pytest.approx(0.0, abs=1e-15)
    # A boolean mask selects the same set; the empty set's aggregate is 0: 1/3 + 2/3 = 1.
    assert collective_divergence(p, samples, ONES2, [True, True, False]) == pytest.approx(1 / 6)
    assert collective_divergence(p, samples, ONES2, []) == pytest.approx(1.0)
    # An explicit target replaces the global mix: {0} against [1, 0] is 0.
    assert collective_divergence(p, samples, ONES2, [0], p_global=[1.0, 0.0]) == 0.0


# -- eq. 15 ------------------------------------------------------------------------------------------

def test_drift_weight_decays_with_k():
    weights = [drift_weight(k, 10) for k in range(11)]
    assert weights[0] == 2.0 and weights[-1] == 0.0
    assert all(a > b for a, b in zip(weights, weights[1:]))
    assert drift_weight(5, 10, lambda0=4.0) == pytest.approx(2.0)
    assert drift_weight(15, 10) == 0.0  # past the planned rounds: clamped, never negative
    for k, K in ((-1, 10), (1, 0)):
        with pytest.raises(ValueError):
            drift_weight(k, K)


def test_utility_hand_computed():
    p = [[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]
    p_prev = [[1.0, 0.0], [1.0, 0.0], [0.5, 0.5]]
    samples = [100, 300, 200]
    # drift = [0, |0 - 1| + |1 - 0| = 2, 0]; lambda = 2 (1 - 1/4) = 1.5.
    # U({0, 1}) = 1/6 - 1.5 (1/4 0 + 3/4 2) = 1/6 - 2.25.
    assert utility(p, p_prev, samples, ONES2, [0, 1], k=1, K=4) == pytest.approx(1 / 6 - 2.25)
    # U({1}) = (|0 - 1/3| + |1 - 2/3|) - 1.5 2 = 2/3 - 3.
    assert utility(p, p_prev, samples, ONES2, [1], k=1, K=4) == pytest.approx(2 / 3 - 3)
    # At the end of the frame only the divergence is left.
    assert utility(p, p_prev, samples, ONES2, [0, 1], k=4, K=4) == pytest.approx(1 / 6)


# -- eq. 18 ------------------------------------------------------------------------------------------

def test_class_weights_fallbacks():
    np.testing.assert_array_equal(class_weights(3), [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(class_weights(3, default=2.0), [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(class_weights(3, previous=[0.5, 0.7, 0.9]), [0.5, 0.7, 0.9])


def test_class_weights_from_per_class_norms_take_the_max():
    # Class 1 has no report (0 everywhere): it keeps the coordinator's previous value.
    L = class_weights(3, class_grad_norms=[[1.0, 0.0, 3.0], [2.0, 0.0, 1.0]], previous=[9, 8, 7])
    np.testing.assert_array_equal(L, [2.0, 8.0, 3.0])


def test_class_weights_eq18_literal():
    # p_global = [0.75, 0.25]: device 0 = [1, 0] is at L1 distance 0.5, device 1 = [0.5, 0.5] too,
    # device 2 matches p_global (distance 0: no estimate). Ratios: [0.3, 0.1] / 0.5 = [0.6, 0.2],
    # [0.1, 0.2] / 0.5 = [0.2, 0.4]; max per class = [0.6, 0.4].
    L = class_weights(2, diff_norms=[[0.3, 0.1], [0.1, 0.2], [5.0, 5.0]],
                      p=[[1, 0], [1, 1], [3, 1]], p_global=[0.75, 0.25])
    np.testing.assert_allclose(L, [0.6, 0.4])
    with pytest.raises(ValueError, match="p_global"):
        class_weights(2, diff_norms=[[0.3, 0.1]])
    with pytest.raises(ValueError):
        class_weights(2, class_grad_norms=[[np.nan, 1.0]])


# -- greedy (Algorithm 1, eq. 17) ---------------------------------------------------------------------

def test_greedy_picks_the_divergence_fixer_first():
    # lambda = 0 (k = K): U({2}) = 0 < U({1}) = 2/3 < U({0}) = 4/3, although device 2 is the smallest.
    # With sigma = 0, the next best addition (device 1, +8/15) raises U: stop.
    chosen = greedy_select(P3, P3, D3, ONES2, k=10, K=10, sigma=0.0)
    assert chosen.tolist() == [2]


def test_greedy_prefers_drift_early_in_the_frame():
    # Device 0 moved from [0, 1] to [1, 0]: drift 2. At k = 0, U({0}) = 4/3 - 2 2 = -8/3 < U({2}) = 0.
    p_prev = np.array([[0.0, 1.0], [0.0, 1.0], [1 / 3, 2 / 3]])
    assert greedy_select(P3, p_prev, D3, ONES2, k=0, K=10, sigma=0.0)[0] == 0
    assert greedy_select(P3, p_prev, D3, ONES2, k=10, K=10, sigma=0.0)[0] == 2


def test_greedy_stopping_rule_threshold():
    # Step 2 costs +8/15 in U; eq. 17 admits it only once the variance gain pays for it.
    below = greedy_select(P3, P3, D3, ONES2, k=10, K=10, sigma=SIGMA_STAR * (1 - 1e-6), batch=32)
    above = greedy_select(P3, P3, D3, ONES2, k=10, K=10, sigma=SIGMA_STAR * (1 + 1e-6), batch=32)
    assert below.tolist() == [2]
    # Then {2, 1} + 0 is the global mix again (delta -8/15): taken for any sigma.
    assert above.tolist() == [2, 1, 0]


def test_greedy_stops_once_additions_cost_more_than_the_variance_gain():
    # Identical devices at the global mix without drift: every addition changes U by 0, and the
    # variance gain takes them all (eq. 17's "<= 0").
    p = np.tile([0.25, 0.75], (5, 1))
    assert greedy_select(p, p, np.full(5, 10.0), ONES2, 1, 10, sigma=1.0).tolist() == [0, 1, 2, 3, 4]
    # Global [0.5, 0.5]; devices 2 and 3 sit on it (U = 0, then + 0). Adding device 0 (or 1, a tie
    # that goes to the lower index) makes the mix (200 [.5, .5] + 100 [1, 0]) / 300 = [2/3, 1/3],
    # U + 1/3, against a variance gain of sigma / sqrt(32) (1/sqrt(3) - 1/sqrt(2)) = -0.02295 sigma.
    p = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [0.5, 0.5]])
    samples = np.full(4, 100.0)
    assert greedy_select(p, p, samples, ONES2, 10, 10, sigma=1.0).tolist() == [2, 3]
    # sigma = 15: 0.344 > 1/3 pays for it, and device 1 then restores the global mix (- 1/3).
    assert greedy_select(p, p, samples, ONES2, 10, 10, sigma=15.0).tolist() == [2, 3, 0, 1]
    assert greedy_select(p, p, samples, ONES2, 10, 10, sigma=14.0).tolist() == [2, 3]


def test_greedy_respects_latency_deadline_and_max_count():
    big = 10 * SIGMA_STAR  # eq. 17 admits everything: only the budget stops the greedy
    # Device 2 (the best) is over the deadline: never chosen; a device exactly at it is fine.
    chosen = greedy_select(P3, P3, D3, ONES2, 10, 10, sigma=big, latency_s=[1.0, 0.5, 2.0],
                           deadline_s=1.0)
    assert chosen.tolist() == [1, 0]
    assert greedy_select(P3, P3, D3, ONES2, 10, 10, sigma=big, max_devices=2).tolist() == [2, 1]
    assert greedy_select(P3, P3, D3, ONES2, 10, 10, sigma=big, max_devices=0).tolist() == []
    with pytest.raises(ValueError, match="together"):
        greedy_select(P3, P3, D3, ONES2, 10, 10, latency_s=[1.0, 1.0, 1.0])


def test_greedy_respects_bandwidth_budget():
    big = 10 * SIGMA_STAR
    # Device 2 alone needs more than the total: skipped, the rest fit.
    chosen = greedy_select(P3, P3, D3, ONES2, 10, 10, sigma=big, bandwidth_hz=[1.0, 1.0, 5.0],
                           total_bandwidth_hz=4.0)
    assert chosen.tolist() == [1, 0]
    # 2 then 1 use 6 of 6 Hz; device 0 no longer fits; an infinite need (infeasible) never does.
    chosen = greedy_select(P3, P3, D3, ONES2, 10, 10, sigma=big, bandwidth_hz=[1.0, 1.0, 5.0],
                           total_bandwidth_hz=6.0)
    assert chosen.tolist() == [2, 1]
    chosen = greedy_select(P3, P3, D3, ONES2, 10, 10, sigma=big, bandwidth_hz=[1.0, np.inf, 5.0],
                           total_bandwidth_hz=100.0)
    assert chosen.tolist() == [2, 0]


def test_greedy_never_selects_devices_that_hold_nothing():
    # Device 3 would be the perfect pick but holds nothing (zero row); device 4 has no samples.
    p = np.vstack([P3, [0.0, 0.0], [1 / 3, 2 / 3]])
    samples = np.append(D3, [500.0, 0.0])
    chosen = greedy_select(p, p, samples, ONES2, 10, 10, sigma=10 * SIGMA_STAR)
    assert sorted(chosen.tolist()) == [0, 1, 2]


def test_greedy_with_no_devices():
    assert greedy_select(np.zeros((0, 3)), np.zeros((0, 3)), [], np.ones(3), 1, 10).size == 0
    assert greedy_select([], [], [], [], 1, 10).size == 0
    # Devices that all hold nothing: nobody to schedule either.
    assert greedy_select(np.zeros((4, 2)), np.zeros((4, 2)), np.ones(4), ONES2, 1, 10).size == 0


@pytest.mark.parametrize("bad, match", [
    (dict(p_now=[[np.nan, 1.0]] * 3), "p_now"),
    (dict(p_now=[[np.inf, 1.0]] * 3), "p_now"),
    (dict(p_now=[[-0.1, 1.0]] * 3), "p_now"),
    (dict(p_prev=[[1.0, 0.0, 0.0]] * 3), "p_prev"),
    (dict(samples=[1.0, 2.0]), "samples"),
    (dict(samples=[1.0, -2.0, 1.0]), "samples"),
    (dict(L=[1.0, 1.0, 1.0]), "L"),
    (dict(L=[1.0, np.nan]), "L"),
    (dict(latency_s=[1.0, np.nan, 1.0], deadline_s=1.0), "latency_s"),
    (dict(bandwidth_hz=[1.0, 1.0], total_bandwidth_hz=3.0), "bandwidth_hz"),
    (dict(sigma=-1.0), "sigma"),
    (dict(batch=0), "batch"),
])
def test_greedy_rejects_bad_input(bad, match):
    args = dict(p_now=P3, p_prev=P3, samples=D3, L=ONES2, k=1, K=10)
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        greedy_select(**args)


def test_selection_validation():
    with pytest.raises(ValueError, match="distinct"):
        collective_divergence(P3, D3, ONES2, [0, 0])
    with pytest.raises(ValueError, match="range|\\[0, 3\\)"):
        collective_divergence(P3, D3, ONES2, [3])


# -- eq. 14 ------------------------------------------------------------------------------------------

NOISE_W_PER_HZ = 10 ** (-174 / 10) * 1e-3  # -174 dBm/Hz (paper, sec. V-A)
POWER_W = 10 ** (23 / 10) * 1e-3           # 23 dBm


def direct_solve(model_bits, compute_s, gain, deadline_s):
    """The latency equation itself: t_cp + D_s / (B log2(1 + P|H|^2 / (B N0))) = T_max, in B."""
    def excess_s(b):
        return compute_s + model_bits / (b * math.log2(1 + POWER_W * gain / (b * NOISE_W_PER_HZ))) \
            - deadline_s
    lo, hi = 1.0, 1.0
    while excess_s(lo) <= 0:
        lo /= 2
    while excess_s(hi) > 0:
        hi *= 2
    return brentq(excess_s, lo, hi, xtol=1e-12, rtol=1e-15, maxiter=500)


def test_allocation_matches_direct_solve():
    model_bits, deadline_s = 1.6e6, 1.0
    rng = np.random.default_rng(3)
    compute_s = rng.uniform(0.05, 0.9, size=40)
    # G spread from 1e-6 to 0.999 (near the Lambert W branch point), through the gain.
    big_g = np.concatenate([np.logspace(-6, -0.01, 36), [0.99, 0.995, 0.998, 0.999]])
    gain = model_bits * math.log(2) * NOISE_W_PER_HZ / ((deadline_s - compute_s) * POWER_W * big_g)
    alloc = allocate_bandwidth(model_bits, compute_s, POWER_W, gain, NOISE_W_PER_HZ, deadline_s)
    expected = [direct_solve(model_bits, t, g, deadline_s) for t, g in zip(compute_s, gain)]
    np.testing.assert_allclose(alloc.bandwidth_hz, expected, rtol=1e-9)
    assert alloc.fits  # no total given: fits = every device can make it
    # The paper's closed form (eq. 14, branch k = -1) gives the same away from the branch point.
    g = big_g[:30]
    eq14 = -model_bits * math.log(2) / ((deadline_s - compute_s[:30])
                                        * (lambertw(-g * np.exp(-g), k=-1).real + g))
    np.testing.assert_allclose(alloc.bandwidth_hz[:30], eq14, rtol=1e-7)


def test_allocation_infeasible_devices_and_total():
    # Device 0: fine. 1: compute alone misses the deadline. 2: no channel. 3: G >= 1, the rate cap
    # P|H|^2 / (N0 ln 2) is below D_s / slack, no bandwidth is enough.
    model_bits, deadline_s = 1e6, 1.0
    cap_gain = model_bits * math.log(2) * NOISE_W_PER_HZ / (0.5 * POWER_W)  # G = 1 at slack 0.5 s
    alloc = allocate_bandwidth(model_bits, [0.5, 1.2, 0.5, 0.5], POWER_W,
                               [1e-10, 1e-10, 0.0, cap_gain], NOISE_W_PER_HZ, deadline_s)
    assert np.isfinite(alloc.bandwidth_hz[0]) and alloc.bandwidth_hz[0] > 0
    assert np.isinf(alloc.bandwidth_hz[1:]).all()
    assert not alloc.fits
    one = alloc.bandwidth_hz[0]
    assert allocate_bandwidth(model_bits, [0.5], POWER_W, 1e-10, NOISE_W_PER_HZ, deadline_s,
                              total_bandwidth_hz=one * (1 + 1e-9)).fits
    assert not allocate_bandwidth(model_bits, [0.5, 0.5], POWER_W, 1e-10, NOISE_W_PER_HZ,
                                  deadline_s, total_bandwidth_hz=one * 1.5).fits
    # Nothing to send needs no bandwidth; no devices fit trivially.
    assert allocate_bandwidth(0.0, [0.5], POWER_W, 1e-10, NOISE_W_PER_HZ, 1.0).bandwidth_hz[0] == 0
    empty = allocate_bandwidth(model_bits, [], POWER_W, 1e-10, NOISE_W_PER_HZ, 1.0, 20e6)
    assert empty.fits and empty.bandwidth_hz.size == 0


@pytest.mark.parametrize("bad, match", [
    (dict(model_bits=-1.0), "model_bits"),
    (dict(model_bits=float("nan")), "model_bits"),
    (dict(compute_s=[0.1, float("nan")]), "compute_s"),
    (dict(compute_s=[[0.1, 0.2]]), "compute_s"),
    (dict(channel_gain=[1e-10, 1e-10, 1e-10]), "channel_gain"),
    (dict(tx_power_w=-1.0), "tx_power_w"),
    (dict(noise_psd_w_per_hz=0.0), "noise"),
    (dict(deadline_s=float("inf")), "deadline_s"),
    (dict(total_bandwidth_hz=-5.0), "total_bandwidth_hz"),
])
def test_allocation_rejects_bad_input(bad, match):
    args = dict(model_bits=1e6, compute_s=[0.1, 0.2], tx_power_w=POWER_W, channel_gain=1e-10,
                noise_psd_w_per_hz=NOISE_W_PER_HZ, deadline_s=1.0)
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        allocate_bandwidth(**args)


# -- the vectorized greedy against Algorithm 1 written plainly ------------------------------------------

def naive_greedy(p_now, p_prev, samples, L, k, K, lambda0, sigma, batch, latency_s=None,
                 deadline_s=None, max_devices=None, bandwidth_hz=None, total_bandwidth_hz=None):
    """Algorithm 1 with loops and from-scratch utilities; a device that does not fit is dropped."""
    n_dev, n_cls = len(p_now), len(L)

    def normalize(row):
        total = sum(row)
        return [x / total for x in row] if total > 0 else [0.0] * n_cls

    p = [normalize(list(r)) for r in p_now]
    q = [normalize(list(r)) for r in p_prev]
    weight = [samples[n] if sum(p[n]) > 0 else 0.0 for n in range(n_dev)]
    glob = [sum(weight[n] * p[n][c] for n in range(n_dev)) / sum(weight) for c in range(n_cls)]
    drift = [sum(L[c] * abs(p[n][c] - q[n][c]) for c in range(n_cls)) for n in range(n_dev)]
    lam = lambda0 * max(0.0, 1.0 - k / K)

    def u(s):
        total = sum(weight[n] for n in s)
        if not s:
            return sum(L[c] * glob[c] for c in range(n_cls))
        div = sum(L[c] * abs(sum(weight[n] * p[n][c] for n in s) / total - glob[c])
                  for c in range(n_cls))
        return div - lam * sum(weight[n] * drift[n] for n in s) / total

    pool = [n for n in range(n_dev) if weight[n] > 0
            and (latency_s is None or latency_s[n] <= deadline_s)]
    chosen, used = [], 0.0
    while pool and (max_devices is None or len(chosen) < max_devices):
        now = u(chosen)
        delta, best = min((u(chosen + [n]) - now, n) for n in pool)
        s = len(chosen)
        if s and delta + sigma / math.sqrt(batch) * (1 / math.sqrt(s + 1) - 1 / math.sqrt(s)) > 0:
            break
        pool.remove(best)
        if bandwidth_hz is not None and used + bandwidth_hz[best] > total_bandwidth_hz:
            continue
        chosen.append(best)
        used += 0.0 if bandwidth_hz is None else bandwidth_hz[best]
    return chosen


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("budget", ["none", "latency", "bandwidth", "count"])
def test_vectorized_greedy_equals_naive(seed, budget):
    rng = np.random.default_rng(seed)
    n_dev, n_cls = 30, 5
    p_now = rng.dirichlet(np.full(n_cls, 0.4), size=n_dev) * rng.integers(1, 50, size=(n_dev, 1))
    p_prev = rng.dirichlet(np.full(n_cls, 0.4), size=n_dev)
    p_now[rng.random(n_dev) < 0.1] = 0.0  # some devices hold nothing
    p_prev[rng.random(n_dev) < 0.1] = 0.0  # some have no history
    samples = rng.integers(0, 500, size=n_dev).astype(float)
    L = rng.uniform(0.2, 3.0, size=n_cls)
    k, K = int(rng.integers(0, 11)), 10
    args = dict(k=k, K=K, lambda0=2.0, sigma=float(rng.uniform(0.0, 20.0)), batch=32)
    if budget == "latency":
        args.update(latency_s=rng.uniform(0.1, 2.0, size=n_dev), deadline_s=1.2)
    elif budget == "bandwidth":
        args.update(bandwidth_hz=rng.uniform(0.5, 3.0, size=n_dev), total_bandwidth_hz=8.0)
    elif budget == "count":
        args.update(max_devices=4)
    expected = naive_greedy(p_now.tolist(), p_prev.tolist(), samples.tolist(), L.tolist(), **args)
    chosen = greedy_select(p_now, p_prev, samples, L, **args)
    assert chosen.tolist() == expected
    if expected:
        ref = utility(p_now, p_prev, samples, L, expected, k, K)
        assert utility(p_now, p_prev, samples, L, chosen, k, K) == pytest.approx(ref, abs=1e-12)


def test_random_cases_exercise_longer_selections():
    """Guard the property test against passing trivially: most random cases pick several devices."""
    lengths = []
    for seed in range(8):
        rng = np.random.default_rng(seed)
        p = rng.dirichlet(np.full(5, 0.4), size=30)
        lengths.append(greedy_select(p, rng.dirichlet(np.full(5, 0.4), size=30),
                                     rng.integers(1, 500, size=30), np.ones(5), 9, 10,
                                     sigma=10.0).size)
    assert sum(n >= 3 for n in lengths) >= 4, lengths
