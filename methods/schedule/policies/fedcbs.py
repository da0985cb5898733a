"""The ``fedcbs`` baseline (FedTeddi paper, V-A (6); Zhang et al. 2023 [26]): devices drawn one by
one, each with a probability that favours the draw leaving the set's class mix most balanced.

QCID(S) = sum_c (sum_{n in S} D_n p_n(c) / sum_{n in S} D_n - 1/C)^2, p_n the normalized ``p_now``
row (the quadratic class-imbalance degree of the set's pooled data). Choices:

- the next device is drawn among those that still fit (finite cost within the remaining total, data
  to train on, not yet chosen) with probability proportional to QCID(S + n)^(-beta), ``beta``
  option, default 2.0; the first draw uses the same rule with S empty (FedCBS's separate first-step
  rule is not in the FedTeddi paper), until nothing fits or ``max_devices`` is reached;
- QCID is clamped to at least 1e-12 before the power, so a perfectly balanced set (always the case
  with C = 1) gets a large finite weight instead of a division by zero;
- each draw is O(N C): QCID(S + n) = ||mix||^2 - 1/C from running sums, one matrix-vector product;
- when every eligible device fits at once, the draw cannot change the set: it is skipped and the
  devices are returned in index order (saves the O(N^2 C) draws for an uncapped, unbudgeted round).
"""
import logging
import math
from typing import Any, Dict

import numpy as np

from streamfl.methods.schedule.policies.base import (
    Budget, Candidates, RoundInfo, SchedulingPolicy, affordable, option_number,
)

log = logging.getLogger(__name__)

#: Floor on QCID before it is raised to -beta.
QCID_FLOOR = 1e-12


def qcid(p_now, samples, selected) -> float:
    """QCID of the set ``selected`` (indices): the squared distance of its pooled class mix from
    uniform; 0 for an empty set or one holding nothing."""
    p = np.asarray(p_now, dtype=np.float64)
    total = p.sum(axis=1, keepdims=True)
    p = np.divide(p, total, out=np.zeros_like(p), where=total > 0)
    idx = np.asarray(selected, dtype=np.int64)
    w = np.asarray(samples, dtype=np.float64)[idx] * (total[idx, 0] > 0)
    if p.shape[1] == 0 or w.sum() <= 0:
        return 0.0
    mix = w @ p[idx] / w.sum()
    return float(((mix - 1.0 / p.shape[1]) ** 2).sum())


class FedCbsPolicy(SchedulingPolicy):
    """Class-balanced sampling: sets whose pooled data is close to uniform over the classes."""

    name = "fedcbs"
    defaults = {"beta": 2.0}

    def check_options(self, options: Dict[str, Any]) -> Dict[str, Any]:
        return {"beta": option_number("fedcbs", "beta", options["beta"])}

    def select(self, c: Candidates, budget: Budget, info: RoundInfo) -> np.ndarray:
        limit = c.num_devices if budget.max_devices is None else budget.max_devices
        cand = np.flatnonzero(affordable(c, budget))
        cost = c.cost[cand]
        if cand.size == 0:
            return np.zeros(0, dtype=np.int64)
        if cand.size <= limit and (not math.isfinite(budget.total) or cost.sum() <= budget.total):
            return cand
        num_classes = c.num_classes
        p = c.p_now[cand]
        p = p / p.sum(axis=1, keepdims=True)
        w = c.samples[cand]
        two_w = 2.0 * w
        w2pp = w * w * np.einsum("ij,ij->i", p, p)  # w_n^2 ||p_n||^2
        beta = self.options["beta"]
        busy = np.flatnonzero(c.busy & c.holds_data())  # already in the set: QCID counts them
        p_busy = c.p_now[busy] / c.p_now[busy].sum(axis=1, keepdims=True)
        sum_wp = c.samples[busy] @ p_busy if busy.size else np.zeros(num_classes)
        sum_w, sum_wp_sq = float(c.samples[busy].sum()), float(sum_wp @ sum_wp)
        remaining = budget.total
        alive = np.ones(cand.size, dtype=bool)
        chosen = []
        while len(chosen) < limit and alive.any():
            # QCID(S + n) = ||S + w_n p_n||^2 / (W + w_n)^2 - 1/C, with S = sum_wp, W = sum_w
            q = p @ sum_wp
            q *= two_w
            q += w2pp
            q += sum_wp_sq
            denom = w + sum_w
            denom *= denom
            q /= denom
            q -= 1.0 / num_classes
            np.maximum(q, QCID_FLOOR, out=q)
            q[~alive] = np.inf
            # weight QCID^-beta, scaled by the best QCID^beta so it lies in [0, 1] for any beta
            np.divide(q.min(), q, out=q)
            weight = q * q if beta == 2.0 else np.power(q, beta, out=q)
            weight[~alive] = 0.0  # 0 ** 0 is 1 when beta = 0
            cdf = np.cumsum(weight)
            j = int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right"))
            j = min(j, cand.size - 1)
            if not alive[j]:  # only reachable through rounding at the top end
                j = int(np.flatnonzero(alive)[-1])
            chosen.append(int(cand[j]))
            sum_wp += w[j] * p[j]
            sum_wp_sq = float(sum_wp @ sum_wp)
            sum_w += w[j]
            alive[j] = False
            remaining -= cost[j]
            alive &= cost <= remaining
            if alive.sum() < cand.size // 2:  # drop the dead rows once they are the majority
                cand, p, w, two_w = cand[alive], p[alive], w[alive], two_w[alive]
                w2pp, cost = w2pp[alive], cost[alive]
                alive = np.ones(cand.size, dtype=bool)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("fedcbs: %d devices, QCID %.3g", len(chosen),
                      qcid(c.p_now, c.samples, chosen))
        return np.asarray(chosen, dtype=np.int64)
