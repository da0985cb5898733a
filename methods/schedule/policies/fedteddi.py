"""The ``fedteddi`` policy (FedTeddi paper, Algorithm 1): greedy on eq. 15's utility, collective
divergence minus lambda_k times the set's temporal drift, stopped by eq. 17, within the budget.

Runs ``teddi.greedy_select`` (whose docstring lists the paper's open points it settles). Here:

- lambda_k = ``lambda0`` (1 - k/K) with k, K from ``RoundInfo``; ``lambda0`` option, default
  ``teddi.DEFAULT_LAMBDA0`` = 2.0 (section V-B); sigma and b of eq. 17 from ``RoundInfo``;
- the deadline arrives already folded into ``cost`` (inf = cannot make it), so no latency is
  passed; inf-cost devices get zero weight (never eligible) while the target p of eq. 11 stays the
  global distribution over all N devices;
- ``cost`` and ``Budget.total`` are eq. 14's bandwidths and the shared total; an infinite total is
  passed as no bandwidth budget (greedy_select would count inf <= inf as fitting).
"""
import logging
import math
from typing import Any, Dict

import numpy as np

from streamfl.methods.schedule.policies.base import (
    Budget, Candidates, RoundInfo, SchedulingPolicy, option_number,
)
from streamfl.methods.schedule.policies.teddi import (
    DEFAULT_LAMBDA0, global_distribution, greedy_select,
)

log = logging.getLogger(__name__)


def teddi_select(c: Candidates, budget: Budget, info: RoundInfo, lambda0: float) -> np.ndarray:
    """``greedy_select`` on the candidates with the budget mapped as described above."""
    if c.num_devices == 0:
        return np.zeros(0, dtype=np.int64)
    finite = np.isfinite(c.cost)
    if math.isfinite(budget.total):
        bandwidth, total = np.where(finite, c.cost, np.inf), budget.total
    else:
        bandwidth, total = None, None
    return greedy_select(
        c.p_now, c.p_prev, np.where(finite, c.samples, 0.0), c.L, info.k, info.K, lambda0=lambda0,
        sigma=info.sigma, batch=info.batch, max_devices=budget.max_devices, bandwidth_hz=bandwidth,
        total_bandwidth_hz=total, p_global=global_distribution(c.p_now, c.samples),
        given=np.flatnonzero(c.busy))


class FedTeddiPolicy(SchedulingPolicy):
    """Drift- and divergence-aware: new data early in a frame, a balanced set throughout."""

    name = "fedteddi"
    defaults = {"lambda0": DEFAULT_LAMBDA0}

    def check_options(self, options: Dict[str, Any]) -> Dict[str, Any]:
        return {"lambda0": option_number("fedteddi", "lambda0", options["lambda0"])}

    def select(self, c: Candidates, budget: Budget, info: RoundInfo) -> np.ndarray:
        return teddi_select(c, budget, info, self.options["lambda0"])
