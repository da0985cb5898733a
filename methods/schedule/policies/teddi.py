"""FedTeddi's scheduling math (Bai et al., the FedTeddi paper): pure float64 numpy, no I/O.

N devices, C classes. ``p_now`` / ``p_prev`` [N, C] are each device's class distribution in this
frame and the previous one (counts are fine: rows with a positive sum are normalized; a row of
zeros is a device that holds nothing and is never selected). ``samples`` [N] are the sample counts
D_n behind the shares a_n; ``L`` [C] the per-class gradient-norm weights (eq. 18).

Choices made where the paper is open (each is an argument where a caller could want another):

- eq. 11 writes the set's distributions at frame l-1; eq. 12, 13 and 15 use frame l, and the
  round trains on the current data, so the divergence uses ``p_now``;
- the target p of eq. 11 is the global class distribution of section III-A: the sample-weighted
  mean of all N devices' ``p_now`` (devices that hold nothing excluded); ``p_global`` overrides it;
- the empty set's aggregate is the zero vector, so U({}) = sum_c L(c) p(c); only the stopping rule
  at the first step sees it, and there eq. 17's variance term falls from infinity (sigma/sqrt(0)),
  so the first eligible device is always taken: a round needs one device, also when sigma = 0;
- lambda_k = lambda0 (1 - k/K) is clamped to [0, lambda0] for k > K (a frame that runs past its
  planned K rounds stops rewarding drift; it never starts penalising it);
- Algorithm 1 keeps a device that does not fit the budget in the pool and loops forever; here it is
  dropped and the next best one is tried. Budgets only shrink, so that equals filtering the pool to
  the devices that still fit before each argmin (what ``greedy_select`` does);
- sigma (eq. 17) defaults to 1 and b to the paper's 32; Alg. 1 estimates sigma from the devices'
  gradient variance, which the caller passes when it has it, in the units of L;
- L (eq. 18) falls back to what the coordinator last estimated, else to 1 per class, when devices
  send no per-class gradients (``class_weights``);
- eq. 14's root is on the real branch W_{-1}; next to the branch point (1 - G < 1e-3) scipy's W_{-1}
  is inaccurate, so a series starts there, and Newton steps polish both (``allocate_bandwidth``).
"""
import logging
from typing import NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
from scipy.special import lambertw

log = logging.getLogger(__name__)

#: eq. 15's drift weight at the start of a frame (paper, section V-B).
DEFAULT_LAMBDA0 = 2.0
#: Local batch size b of eq. 17 (paper, section V-A).
DEFAULT_BATCH = 32
#: Gradient-noise scale sigma of eq. 17 when the coordinator has no estimate (Alg. 1 line 12 averages
#: the devices' reports). In the units of L: with the uniform fallback L = 1, a unit-scale guess.
DEFAULT_SIGMA = 1.0

Selection = Union[Sequence[int], np.ndarray]


class Allocation(NamedTuple):
    """eq. 14's minimum bandwidth per device (inf: cannot meet the deadline at any bandwidth) and
    whether all of them fit in the total together."""

    bandwidth_hz: np.ndarray
    fits: bool


# -- validation --------------------------------------------------------------------------------------

def _array(name: str, x, ndim: int, allow_inf: bool = False) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != ndim:
        raise ValueError("%s must be %d-dimensional, got shape %s" % (name, ndim, a.shape))
    bad = np.isnan(a) if allow_inf else ~np.isfinite(a)
    if bad.any():
        raise ValueError("%s contains %s" % (name, "NaN" if allow_inf else "NaN or inf"))
    if (a < 0).any():
        raise ValueError("%s must be >= 0, got a minimum of %r" % (name, float(a.min())))
    return a


def _distributions(name: str, p, num_classes: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Rows normalized to sum 1 and the mask of rows that hold anything (all-zero rows stay zero)."""
    p = _array(name, p, 2)
    if num_classes is not None and p.shape[1] != num_classes:
        raise ValueError("%s has %d classes, expected %d" % (name, p.shape[1], num_classes))
    total = p.sum(axis=1)
    held = total > 0
    out = np.zeros_like(p)
    np.divide(p, total[:, None], out=out, where=held[:, None])
    return out, held


def _vector(name: str, x, n: int, allow_inf: bool = False) -> np.ndarray:
    """A length-n vector; a scalar is broadcast."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 0:
        a = np.full(n, float(a))
    a = _array(name, a, 1, allow_inf)
    if a.shape[0] != n:
        raise ValueError("%s has length %d, expected %d" % (name, a.shape[0], n))
    return a


def _inputs(p_now, samples, L):
    p, held = _distributions("p_now", p_now)
    n, c = p.shape
    L = _vector("L", L, c)
    weight = _vector("samples", samples, n) * held  # a device that holds nothing has share 0
    return p, weight, L


def _selection(selected: Selection, n: int) -> np.ndarray:
    idx = np.asarray(selected)
    if idx.dtype == bool:
        if idx.shape != (n,):
            raise ValueError("selection mask has shape %s, expected (%d,)" % (idx.shape, n))
        return np.flatnonzero(idx)
    idx = idx.astype(np.int64).reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ValueError("selection indices must be in [0, %d)" % n)
    if np.unique(idx).size != idx.size:
        raise ValueError("selection indices must be distinct")
    return idx


# -- eq. 9, 11, 15, 18 -------------------------------------------------------------------------------

def global_distribution(p_now, samples) -> np.ndarray:
    """The global class distribution p of sec. III-A: sum_n D_n p_n / sum_n D_n over all devices."""
    p, held = _distributions("p_now", p_now)
    weight = _vector("samples", samples, p.shape[0]) * held
    total = weight.sum()
    if total <= 0:
        return np.zeros(p.shape[1])
    return weight @ p / total


def class_weights(num_classes: int, class_grad_norms=None, diff_norms=None, p=None, p_global=None,
                  previous=None, default: float = 1.0) -> np.ndarray:
    """eq. 18's L(c): the largest per-class gradient norm among the reporting (scheduled) devices,
    an upper estimate so the convergence bound of eq. 12 stays valid.

    Two forms of report, rows = devices, 0 = no report for that class:

    - ``class_grad_norms`` [S, C]: ||grad E_{x|y=c} f|| measured on each device's class-c samples,
      the quantity eq. 18 estimates (its single-class derivation reduces to exactly this);
    - ``diff_norms`` [S, C] with ``p`` [S, C] and ``p_global`` [C]: eq. 18 literally,
      ||grad F_n(D_n^c) - grad F(D^c)|| / ||p_n - p||_1 (a device matching p gives no estimate).

    Fallback, for classes without a positive estimate and when devices send no per-class gradients:
    ``previous`` (the estimate the coordinator holds from earlier rounds) if given, else ``default``
    (uniform weights 1: eq. 9 and 11 become plain L1 distances, the EMD of the paper's remark).
    """
    if num_classes < 0:
        raise ValueError("num_classes must be >= 0, got %r" % (num_classes,))
    if not np.isfinite(default) or default < 0:
        raise ValueError("default must be finite and >= 0, got %r" % (default,))
    fallback = (np.full(num_classes, float(default)) if previous is None
                else _vector("previous", previous, num_classes))
    estimate = np.zeros(num_classes)
    if class_grad_norms is not None:
        g = _array("class_grad_norms", class_grad_norms, 2)
        if g.shape[1] != num_classes:
            raise ValueError("class_grad_norms has %d classes, expected %d" % (g.shape[1], num_classes))
        if g.shape[0]:
            estimate = np.maximum(estimate, g.max(axis=0))
    if diff_norms is not None:
        if p is None or p_global is None:
            raise ValueError("diff_norms needs p (the devices' distributions) and p_global")
        d = _array("diff_norms", diff_norms, 2)
        pn, _ = _distributions("p", p, num_classes)
        if d.shape != pn.shape:
            raise ValueError("diff_norms has shape %s, p has %s" % (d.shape, pn.shape))
        pg = _vector("p_global", p_global, num_classes)
        l1 = np.abs(pn - pg).sum(axis=1)  # eq. 18's denominator, the whole vector's L1 distance
        ok = l1 > 1e-12
        if ok.any():
            estimate = np.maximum(estimate, (d[ok] / l1[ok, None]).max(axis=0))
    return np.where(estimate > 0, estimate, fallback)


def temporal_drift(p_now, p_prev, L) -> np.ndarray:
    """eq. 9: each device's L-weighted L1 (EMD) change of class distribution since the last frame.

    A class new this frame has previous share 0 (the paper's rule); so does every class of a device
    that held nothing before."""
    p, _ = _distributions("p_now", p_now)
    q, _ = _distributions("p_prev", p_prev)
    if q.shape != p.shape:
        raise ValueError("p_prev has shape %s, p_now has %s (pad new classes with 0)"
                         % (q.shape, p.shape))
    L = _vector("L", L, p.shape[1])
    return np.abs(p - q) @ L


def collective_divergence(p_now, samples, L, selected: Selection, p_global=None) -> float:
    """eq. 11: how far the set's sample-weighted class mix is from the global one, L-weighted."""
    p, weight, L = _inputs(p_now, samples, L)
    target = (global_distribution(p, weight) if p_global is None
              else _vector("p_global", p_global, p.shape[1]))
    idx = _selection(selected, p.shape[0])
    total = weight[idx].sum()
    mix = weight[idx] @ p[idx] / total if total > 0 else np.zeros(p.shape[1])
    return float(np.abs(mix - target) @ L)


def drift_weight(k: float, K: float, lambda0: float = DEFAULT_LAMBDA0) -> float:
    """eq. 15's lambda_k = lambda0 (1 - k/K): reward drift early in a frame, less as it ages."""
    if not K > 0:
        raise ValueError("K (rounds in the frame) must be > 0, got %r" % (K,))
    if not k >= 0:
        raise ValueError("k (round in the frame) must be >= 0, got %r" % (k,))
    if not (np.isfinite(lambda0) and lambda0 >= 0):
        raise ValueError("lambda0 must be finite and >= 0, got %r" % (lambda0,))
    return float(lambda0 * min(1.0, max(0.0, 1.0 - float(k) / float(K))))


def utility(p_now, p_prev, samples, L, selected: Selection, k: float, K: float,
            lambda0: float = DEFAULT_LAMBDA0, p_global=None) -> float:
    """eq. 15: U(S) = divergence(S) - lambda_k sum_{n in S} a_n drift_n (a_n normalized over S)."""
    p, weight, L = _inputs(p_now, samples, L)
    drift = temporal_drift(p, p_prev, L)
    idx = _selection(selected, p.shape[0])
    total = weight[idx].sum()
    mean_drift = weight[idx] @ drift[idx] / total if total > 0 else 0.0
    return (collective_divergence(p, weight, L, idx, p_global)
            - drift_weight(k, K, lambda0) * float(mean_drift))


# -- eq. 14 ------------------------------------------------------------------------------------------

def _spectral_efficiency(big_g: np.ndarray, newton_steps: int) -> np.ndarray:
    """y = x / B* for 0 < G < 1: the root of ln(1 + y) / y = G, which is eq. 14 rewritten
    (y = -(W_{-1}(-G e^-G) + G) / G).

    scipy's W_{-1} loses digits next to its branch point -1/e (G -> 1: at G = 0.99991 it is off by
    a factor 2 in W + G), so there the series y = 2e + 8/3 e^2 + 28/9 e^3 (e = 1 - G) starts
    instead; Newton steps on ln(1 + y) / y = G (convex, decreasing) finish both to float64.
    """
    eps = 1.0 - big_g
    near = eps < 1e-3
    y = np.empty_like(big_g)
    g = big_g[~near]
    y[~near] = -(lambertw(-g * np.exp(-g), k=-1).real + g) / g
    e = eps[near]
    y[near] = e * (2.0 + e * (8.0 / 3.0 + e * 28.0 / 9.0))
    for _ in range(max(0, int(newton_steps))):
        f = np.log1p(y) / y - big_g
        slope = (y / (1.0 + y) - np.log1p(y)) / (y * y)  # < 0
        step = np.divide(f, slope, out=np.zeros_like(f), where=slope < 0)
        y = np.where(y - step > 0, y - step, 0.5 * y)
    return y


def allocate_bandwidth(model_bits: float, compute_s, tx_power_w, channel_gain,
                       noise_psd_w_per_hz: float, deadline_s: float,
                       total_bandwidth_hz: Optional[float] = None, newton_steps: int = 2) -> Allocation:
    """eq. 14: the least bandwidth B_n with which device n uploads ``model_bits`` in the time its
    compute leaves before the deadline, ``B log2(1 + P|H|^2 / (B N0)) = D_s / (T_max - t_cp)``.

    B* = -D_s ln2 / ((T_max - t_cp) (W_{-1}(-G e^-G) + G)), G = N0 D_s ln2 / ((T_max - t_cp) P|H|^2).
    The rate is capped at P|H|^2 / (N0 ln2) as B grows, so G >= 1 (or t_cp >= T_max, or no gain)
    means no bandwidth suffices: inf. For G < 1 the nontrivial root is on the real branch k = -1
    (W = -G, on branch 0, is the trivial B = inf). ``newton_steps`` Newton steps on the equation
    itself polish W's rounding, worst near its branch point (G -> 1, -G e^-G -> -1/e).
    """
    compute_s = _array("compute_s", compute_s, 1, allow_inf=True)
    n = compute_s.shape[0]
    power = _vector("tx_power_w", tx_power_w, n)
    gain = _vector("channel_gain", channel_gain, n)
    for name, value in (("model_bits", model_bits), ("noise_psd_w_per_hz", noise_psd_w_per_hz),
                        ("deadline_s", deadline_s)):
        if not (np.isfinite(value) and value >= 0):
            raise ValueError("%s must be finite and >= 0, got %r" % (name, value))
    if not noise_psd_w_per_hz > 0:
        raise ValueError("noise_psd_w_per_hz must be > 0 (a noiseless channel has no finite answer)")
    if total_bandwidth_hz is not None and not (total_bandwidth_hz >= 0):
        raise ValueError("total_bandwidth_hz must be >= 0, got %r" % (total_bandwidth_hz,))

    bandwidth = np.full(n, np.inf)
    slack_s = deadline_s - compute_s
    snr_hz = power * gain / noise_psd_w_per_hz  # x = P|H|^2 / N0: the rate's cap times ln 2
    ok = (slack_s > 0) & (snr_hz > 0)
    rate = np.zeros(n)  # r = D_s ln2 / slack, nats per second
    rate[ok] = model_bits * np.log(2.0) / slack_s[ok]
    big_g = np.full(n, np.inf)
    big_g[ok] = rate[ok] / snr_hz[ok]
    ok &= big_g < 1.0
    bandwidth[ok & ((rate == 0) | (big_g == 0))] = 0.0  # nothing to send, or an unbounded rate
    solve = ok & (rate > 0) & (big_g > 0)
    if solve.any():
        # G below 1e-300 (an SNR beyond 1e300) would overflow y; B* ~ r / ln(1/G) is then ~0 anyway.
        y = _spectral_efficiency(np.maximum(big_g[solve], 1e-300), newton_steps)
        bandwidth[solve] = rate[solve] / np.log1p(y)  # B = x / y = r / ln(1 + y): no overflow
    used = float(bandwidth.sum()) if n else 0.0
    fits = bool(np.isfinite(used) and (total_bandwidth_hz is None or used <= total_bandwidth_hz))
    return Allocation(bandwidth, fits)


# -- greedy (Algorithm 1, eq. 17) ---------------------------------------------------------------------

def greedy_select(p_now, p_prev, samples, L, k: float, K: float, lambda0: float = DEFAULT_LAMBDA0,
                  sigma: float = DEFAULT_SIGMA, batch: int = DEFAULT_BATCH, latency_s=None,
                  deadline_s: Optional[float] = None, max_devices: Optional[int] = None,
                  bandwidth_hz=None, total_bandwidth_hz: Optional[float] = None,
                  p_global=None, given: Selection = ()) -> np.ndarray:
    """Algorithm 1: add the device with the smallest U(S+n) - U(S) while eq. 17 holds and the
    budget holds; the chosen device indices, in the order they were added.

    Budgets: real boards pass their measured round ``latency_s`` [N] and the ``deadline_s`` T_max
    (a device over it is never chosen: the round waits for its slowest device, eq. 5-6);
    a simulated shared channel passes eq. 14's ``bandwidth_hz`` [N] (``allocate_bandwidth``) and
    ``total_bandwidth_hz``; ``max_devices`` caps the set. Each step scores every remaining candidate
    at once, O(N C), from running sums of D_n (p_n - p), D_n and D_n drift_n; ties go to the lower
    index. The number of steps is the set's size, bounded by eq. 17, the budget and ``max_devices``.

    ``given``: devices already in the set (FedAsync's in-flight cohort, say). The greedy starts from
    them: eq. 15's sums and eq. 17's |S| count them, they are never chosen again, and the budgets
    and ``max_devices`` are what is left beside them (the caller subtracts what they hold).
    """
    if np.asarray(p_now).size == 0 and len(np.shape(p_now)) in (1, 2):
        return np.zeros(0, dtype=np.int64)  # no devices: nothing to schedule
    p, weight, L = _inputs(p_now, samples, L)
    n, c = p.shape
    drift = temporal_drift(p, p_prev, L)
    lam = drift_weight(k, K, lambda0)
    if not (np.isfinite(sigma) and sigma >= 0):
        raise ValueError("sigma must be finite and >= 0, got %r" % (sigma,))
    if not batch >= 1:
        raise ValueError("batch must be >= 1, got %r" % (batch,))
    if max_devices is not None and max_devices < 0:
        raise ValueError("max_devices must be >= 0, got %r" % (max_devices,))
    eligible = weight > 0
    if (latency_s is None) != (deadline_s is None):
        raise ValueError("latency_s and deadline_s go together")
    if latency_s is not None:
        if not (np.isfinite(deadline_s) and deadline_s >= 0):
            raise ValueError("deadline_s must be finite and >= 0, got %r" % (deadline_s,))
        eligible &= _vector("latency_s", latency_s, n, allow_inf=True) <= deadline_s
    if (bandwidth_hz is None) != (total_bandwidth_hz is None):
        raise ValueError("bandwidth_hz and total_bandwidth_hz go together")
    remaining_hz = np.inf
    if bandwidth_hz is not None:
        bandwidth = _vector("bandwidth_hz", bandwidth_hz, n, allow_inf=True)
        if not total_bandwidth_hz >= 0:
            raise ValueError("total_bandwidth_hz must be >= 0, got %r" % (total_bandwidth_hz,))
        remaining_hz = float(total_bandwidth_hz)
        eligible &= bandwidth <= remaining_hz
    target = global_distribution(p, weight) if p_global is None else _vector("p_global", p_global, c)
    limit = n if max_devices is None else min(n, int(max_devices))
    fixed = _selection(given, n)
    fixed = fixed[weight[fixed] > 0]  # a given device that holds nothing adds nothing to the set
    eligible[fixed] = False

    # Candidates in ascending index order (ties go to the lower index). With E_n = D_n (p_n - p),
    # the divergence of S+n is sum_c L(c) |E_S(c) + E_n(c)| / (D_S + D_n): one pass over [R, C].
    cand = np.flatnonzero(eligible)
    excess = weight[cand, None] * (p[cand] - target)
    w, wdrift = weight[cand], weight[cand] * drift[cand]
    bw = bandwidth[cand] if bandwidth_hz is not None else None
    alive = np.ones(cand.size, dtype=bool)
    n_alive = cand.size
    sum_excess = (weight[fixed, None] * (p[fixed] - target)).sum(axis=0)
    sum_w, sum_wdrift = float(weight[fixed].sum()), float(weight[fixed] @ drift[fixed])
    current = (float(np.abs(sum_excess) @ L - lam * sum_wdrift) / sum_w if fixed.size
               else float(target @ L))  # U(given); U({}) with the empty aggregate at 0
    noise = sigma / np.sqrt(float(batch))
    chosen = []
    scratch = np.empty_like(excess)
    while len(chosen) < limit and n_alive:
        np.add(excess, sum_excess, out=scratch)
        np.abs(scratch, out=scratch)
        score = scratch @ L
        score -= lam * (sum_wdrift + wdrift)
        score /= sum_w + w  # U(S+n) for every candidate
        score[~alive] = np.inf
        j = int(np.argmin(score))
        s = len(chosen) + fixed.size
        if s and score[j] - current + noise * (1.0 / np.sqrt(s + 1.0) - 1.0 / np.sqrt(s)) > 0:
            break  # eq. 17: the best addition no longer pays for itself
        chosen.append(int(cand[j]))
        sum_excess += excess[j]
        sum_w += w[j]
        sum_wdrift += wdrift[j]
        current = float(score[j])
        alive[j] = False
        n_alive -= 1
        if bw is not None:
            remaining_hz -= bw[j]
            alive &= bw <= remaining_hz
            n_alive = int(alive.sum())
        if n_alive < cand.size // 2:  # drop the dead rows once they are the majority
            cand, excess, w, wdrift = cand[alive], excess[alive], w[alive], wdrift[alive]
            bw = bw[alive] if bw is not None else None
            alive = np.ones(cand.size, dtype=bool)
            scratch = np.empty_like(excess)
    log.debug("greedy: %d of %d devices chosen (%d eligible), U = %.6g", len(chosen), n,
              int(eligible.sum()), current)
    return np.asarray(chosen, dtype=np.int64)
