"""SFedPO's device-side math (SFedPO paper, sec. 5, App. D and F.3): the state oracle, DDS and s_n.

A device moves between latent states m, each a stationary data distribution. Three pieces:

- ``DirichletOracle``: pi_hat_n,m = (alpha0_m + c_n,m) / sum_j (alpha0_j + c_n,j), the posterior
  mean of a Dirichlet(alpha0) prior after the device spent c_n,m windows in state m (App. D).
  We count windows, not visits: pi_n,m is the chance of being in state m at a time step, and a
  window is our time step. Each state's class counts are kept too, for d_m.
- ``dds_rates``: the share alpha_n,m of new windows of state m the buffer admits. Score (eq. 10 in
  the practical form of sec. 5, whose ratio is alpha_n/(1-alpha_n); the two agree at the paper's
  alpha_n = 0.5) ``(w_m - a1 d_m + b1) / (1 + alpha_n/(1-alpha_n) pi_hat_m)``, ReLU, normalized so
  that ``sum_m pi_hat_m alpha_n,m = alpha_n`` (eq. 11), clipped at 1 with the excess budget handed
  to the other states (Algorithm 2).
- ``heterogeneity_score``: eq. 12, s_n = L eta sigma^2 + beta_n/alpha_n (1 - gamma_n)
  + 2 G gamma_n beta'_n / (1 - (1 - alpha_n)^2) + 2 G gamma_n sum_m (pi_m alpha_m / alpha_n - w_m)^2,
  with eq. 7-8: beta_n = sum pi alpha d, beta'_n = 2 sum pi alpha^2 - sum pi^2 alpha^2 + alpha_n^2,
  gamma_n = (1/T) sum_{t=1..T} (1 - alpha_n)^t, T the round's local steps.
- ``replaced_per_step``: the units eq. 12 needs. The paper's alpha_n,m is the share of the local
  data replaced per local step (eq. 1; gamma_n sums (1 - alpha_n)^t over the T steps), ours is the
  chance that an arriving window is admitted. A window offered to a full buffer of C windows is
  admitted with chance alpha_n,m and then replaces one slot, so over a round in which W windows
  were offered the buffer replaces alpha_n,m W / (C T) of its data per local step. s_n is computed
  on these per-step shares: fed the admission chances (about 0.5) it took gamma_n about 0.2 with
  T = 5 where the buffer's measured turnover, about 5% a round, gives about 0.97.

Open values, our choices (all configurable through the plug-ins' settings):

- d_m is the KL divergence of state m's class mix from uniform (App. H.1's surrogate), estimated
  from the class counts the device saw in state m with ``class_prior`` pseudo-windows per class
  (1.0), so that a state seen for a few windows does not look maximally skewed.
- w_m, the state's population frequency, comes from the coordinator (the fleet's state counts)
  where state ids are shared; where they are not (states the device inferred itself) or before
  the coordinator has any, w is uniform over the states known: every state counts the same in the
  global objective (eq. 3).
- The constants L eta sigma^2 and G of eq. 12 are unknown for a real model; they set the scale
  of s_n only relative to eq. 14's a2 and b2. We take ``l_eta_sigma2`` = 0 and ``g`` = 1 (then s_n
  is about 0.5 .. 3, the range the paper's a2 in [0.5, 2] and b2 in [0, 1] act on).
"""
import math
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np

from streamfl.methods.sfedpo.payloads import MAX_STATES

#: Per-step replaced share a round in which no window was offered counts as (and eq. 12's least
#: alpha_n): every term of eq. 12 has a finite limit as alpha_n -> 0 (gamma_n -> 1, only the
#: mismatch terms stay), which 1e-9 reaches to float64 precision.
MIN_REPLACED_PER_STEP = 1e-9


class DirichletOracle:
    """Posterior mean of the device's state distribution, and each state's class counts."""

    def __init__(self, num_classes: int, prior: float = 1.0, class_prior: float = 1.0,
                 max_states: int = MAX_STATES):
        if not prior > 0 or not class_prior >= 0 or num_classes < 1 or max_states < 1:
            raise ValueError("oracle needs prior > 0, class_prior >= 0, num_classes >= 1 and "
                             "max_states >= 1, got %r, %r, %r, %r" % (prior, class_prior, num_classes,
                                                                      max_states))
        self.num_classes = int(num_classes)
        self.prior = float(prior)
        self.class_prior = float(class_prior)
        self.max_states = int(max_states)
        #: Windows seen per state.
        self.counts: Dict[int, int] = {}
        #: Windows seen per state and class (plain lists: the cheapest to count into per window).
        self.class_counts: Dict[int, List[int]] = {}
        #: Windows of a state beyond ``max_states`` (not tracked; admitted at the budget).
        self.overflow = 0

    def observe(self, state: int, label: int) -> bool:
        """Count one window of ``state`` with ``label``; False if the state could not be tracked."""
        if state < 0:
            return False
        if state not in self.counts:
            if len(self.counts) >= self.max_states:
                self.overflow += 1
                return False
            self.counts[state] = 0
            self.class_counts[state] = [0] * self.num_classes
        self.counts[state] += 1
        if 0 <= label < self.num_classes:
            self.class_counts[state][label] += 1
        return True

    def states(self, also: Sequence[int] = ()) -> List[int]:
        """The states seen, and ``also`` (e.g. the fleet's), sorted."""
        return sorted(set(self.counts) | {int(s) for s in also})

    def pi_hat(self, states: Sequence[int]) -> np.ndarray:
        """pi_hat over ``states`` (float64, sums to 1): the Dirichlet posterior mean."""
        a = np.asarray([self.prior + self.counts.get(s, 0) for s in states], dtype=np.float64)
        return a / a.sum() if len(a) else a

    def divergence(self, states: Sequence[int]) -> np.ndarray:
        """d_m: KL(state m's smoothed class mix || uniform) per state of ``states`` (0 if unseen)."""
        k = self.num_classes
        zeros = [0] * k
        counts = np.asarray([self.class_counts.get(s, zeros) for s in states], dtype=np.float64)
        if not len(counts):
            return np.zeros(0)
        seen = counts.sum(axis=1, keepdims=True)
        p = (counts + self.class_prior) / np.maximum(seen + self.class_prior * k, 1e-300)
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(p > 0, p * np.log(p * k), 0.0)
        return np.where(seen[:, 0] > 0, terms.sum(axis=1), 0.0)

    def state(self) -> Dict[str, object]:
        """JSON-able counts (a restart keeps what the device learned of its states)."""
        return {"counts": {str(s): n for s, n in self.counts.items()},
                "class_counts": {str(s): list(c) for s, c in self.class_counts.items()}}

    def load_state(self, state: Mapping[str, object]) -> None:
        """Counts from ``state()``; entries of the wrong shape are dropped."""
        self.counts, self.class_counts = {}, {}
        for key, n in dict(state.get("counts", {})).items():
            cc = np.asarray(dict(state.get("class_counts", {})).get(key, []), dtype=np.int64)
            if len(self.counts) < self.max_states and cc.shape == (self.num_classes,) and int(n) >= 0:
                self.counts[int(key)] = int(n)
                self.class_counts[int(key)] = [int(v) for v in cc]


def dds_scores(pi_hat: np.ndarray, w: np.ndarray, d: np.ndarray, budget: float, a1: float,
               b1: float) -> np.ndarray:
    """Eq. 10 (practical form): ``(w - a1 d + b1) / (1 + budget/(1-budget) pi_hat)``."""
    check_budget(budget)
    return (w - a1 * d + b1) / (1.0 + budget / (1.0 - budget) * pi_hat)


def dds_rates(pi_hat: np.ndarray, scores: np.ndarray, budget: float) -> np.ndarray:
    """Algorithm 2: alpha_n,m from eq. 10's ``scores``, with ``sum pi_hat alpha = budget``, each <= 1.

    ReLU, normalize over the states still open, clip the largest at 1 and spend what is left of
    the budget on the others, until none exceeds 1. Where every open score is <= 0 the budget is
    spread evenly (Algorithm 2, line 8). States with pi_hat = 0 get the budget (a state never seen
    is admitted as an average one).
    """
    check_budget(budget)
    pi = np.asarray(pi_hat, dtype=np.float64)
    relu = np.maximum(np.asarray(scores, dtype=np.float64), 0.0)
    alpha = np.full(len(pi), float(budget))
    open_ = pi > 0
    left = float(budget)
    while open_.any():
        mass = float(np.sum(pi[open_] * relu[open_]))
        if mass <= 0:
            alpha[open_] = min(1.0, max(0.0, left) / float(pi[open_].sum()))
            break
        trial = left * relu / mass
        over = open_ & (trial >= 1.0)
        if not over.any():
            alpha[open_] = trial[open_]
            break
        first = int(np.flatnonzero(over)[np.argmax(trial[over])])  # clip the largest, re-solve
        alpha[first] = 1.0
        left -= float(pi[first])
        open_[first] = False
    return np.clip(alpha, 0.0, 1.0)


def replaced_per_step(admission: np.ndarray, windows_offered: int, buffer_windows: int,
                      local_steps: int) -> np.ndarray:
    """The share of a full buffer of ``buffer_windows`` that each state's windows replace per local
    step, for admission chances ``admission`` and ``windows_offered`` windows offered to it over a
    round of ``local_steps`` steps: eq. 1's alpha_n,m, in the units eq. 7, 8 and 12 use."""
    if buffer_windows < 1:
        raise ValueError("buffer_windows must be >= 1, got %r" % (buffer_windows,))
    per_step = max(0, int(windows_offered)) / (float(buffer_windows) * max(1, int(local_steps)))
    per_step = max(per_step, MIN_REPLACED_PER_STEP)  # none offered: eq. 12's limit, shares kept
    return np.minimum(np.asarray(admission, dtype=np.float64) * per_step, 1.0)


def heterogeneity_score(pi_hat: np.ndarray, alpha: np.ndarray, d: np.ndarray, w: np.ndarray,
                        local_steps: int, g: float = 1.0, l_eta_sigma2: float = 0.0) -> float:
    """Eq. 12's s_n for the device's pi_hat and per-step replaced shares ``alpha`` (eq. 1's
    alpha_n,m: ``replaced_per_step``, not admission chances). A buffer that did not turn over at
    all (alpha_n = 0) is eq. 12's limit: gamma_n = 1, only the mismatch terms count."""
    pi = np.asarray(pi_hat, dtype=np.float64)
    a = np.asarray(alpha, dtype=np.float64)
    held = float(np.sum(pi * a))
    shares = pi * a / held if held > 0 else np.zeros_like(pi)  # what the buffer mixes, by state
    alpha_n = max(held, MIN_REPLACED_PER_STEP)
    beta = float(np.sum(pi * a * np.asarray(d, dtype=np.float64)))
    beta_p = 2.0 * float(np.sum(pi * a * a)) - float(np.sum(pi * pi * a * a)) + alpha_n ** 2
    steps = max(1, int(local_steps))
    gamma = sum((1.0 - alpha_n) ** t for t in range(1, steps + 1)) / steps
    mix = float(np.sum((shares - np.asarray(w, dtype=np.float64)) ** 2))
    s = (l_eta_sigma2 + beta / alpha_n * (1.0 - gamma)
         + 2.0 * g * gamma * beta_p / (1.0 - (1.0 - alpha_n) ** 2) + 2.0 * g * gamma * mix)
    return float(s) if math.isfinite(s) else 0.0


def population_weights(states: Sequence[int], fleet: Optional[Mapping[int, float]]) -> np.ndarray:
    """w over ``states``: the fleet's frequencies (renormalized over them), or uniform without them."""
    n = len(states)
    if not n:
        return np.zeros(0)
    if fleet:
        w = np.asarray([max(0.0, float(fleet.get(s, 0.0))) for s in states], dtype=np.float64)
        if w.sum() > 0:
            return w / w.sum()
    return np.full(n, 1.0 / n)


def check_budget(budget: float) -> None:
    """alpha_n must be in (0, 1): eq. 10 divides by 1 - alpha_n, eq. 12 by alpha_n."""
    if not 0.0 < budget < 1.0:
        raise ValueError("the sampling budget alpha_n must be in (0, 1), got %r" % (budget,))


__all__ = ["DirichletOracle", "dds_scores", "dds_rates", "heterogeneity_score", "population_weights",
           "replaced_per_step", "check_budget", "MAX_STATES"]
