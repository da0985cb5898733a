"""The ``power-of-choice`` baseline (FedTeddi paper, V-A (4); Cho et al. 2020 [38]): a random
candidate set drawn by data size, then its highest-loss devices first, taken while they fit the
budget.

"Randomly select a subset of clients and prioritize them with higher local training loss". Choices:

- the candidate set holds d devices drawn without replacement with probability proportional to
  their sample counts D_n (Cho et al.'s p_k), among the devices that could be chosen at all: finite
  cost no larger than the whole budget, and data to train on;
- d is the ``candidates`` option when given, else max(1, ceil(``d_factor`` * m)) with ``d_factor``
  2.0 by default and m = ``Budget.max_devices``, or N // 2 (at least 1) when the round has no cap;
  d is clipped to the number of drawable devices;
- the candidates are ordered by ``loss`` descending, devices that have not reported a loss (NaN)
  last, ties by index, and ``fill`` takes them in that order; devices outside the candidate set are
  never taken, even when budget is left (the paper's m is then simply what fits).
"""
import logging
import math
from typing import Any, Dict

import numpy as np

from streamfl.methods.schedule.policies.base import (
    Budget, Candidates, RoundInfo, SchedulingPolicy, affordable, fill, option_number, order_by,
)

log = logging.getLogger(__name__)


class PowerOfChoicePolicy(SchedulingPolicy):
    """Biased toward high-loss devices for faster convergence, with randomness to keep diversity."""

    name = "power-of-choice"
    defaults = {"candidates": None, "d_factor": 2.0}

    def check_options(self, options: Dict[str, Any]) -> Dict[str, Any]:
        d = options["candidates"]
        if d is not None and (isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1):
            raise ValueError("power-of-choice: candidates must be an integer >= 1 or None, got %r"
                             % (d,))
        factor = option_number("power-of-choice", "d_factor", options["d_factor"], positive=True)
        return {"candidates": None if d is None else int(d), "d_factor": factor}

    def candidate_count(self, num_devices: int, budget: Budget) -> int:
        """d before clipping to the drawable devices."""
        if self.options["candidates"] is not None:
            return self.options["candidates"]
        m = budget.max_devices if budget.max_devices is not None else max(1, num_devices // 2)
        return max(1, int(math.ceil(self.options["d_factor"] * m)))

    def select(self, c: Candidates, budget: Budget, info: RoundInfo) -> np.ndarray:
        drawable = np.flatnonzero(affordable(c, budget))
        if drawable.size == 0:
            return np.zeros(0, dtype=np.int64)
        d = min(self.candidate_count(c.num_devices, budget), drawable.size)
        weight = c.samples[drawable]
        picked = np.sort(self.rng.choice(drawable, size=d, replace=False, p=weight / weight.sum()))
        order = picked[order_by(c.loss[picked], descending=True)]
        return fill(order, c, budget)
