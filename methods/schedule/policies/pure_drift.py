"""The ``pure-drift`` baseline (FedTeddi paper, V-A (5)): the devices whose data changed most since
the last frame first, taken while they fit the budget.

"Rank and select clients purely based on the magnitude of their data distribution drift": the
drift is eq. 9 (``teddi.temporal_drift``, the L-weighted L1 change of the normalized class mix from
``p_prev`` to ``p_now``), ordered descending, ties to the lower index. Unlike FedTeddi there is no
divergence term and no eq. 17 stopping rule: it takes as many devices as the budget allows.
"""
import logging

import numpy as np

from streamfl.methods.schedule.policies.base import (
    Budget, Candidates, RoundInfo, SchedulingPolicy, fill, order_by,
)
from streamfl.methods.schedule.policies.teddi import temporal_drift

log = logging.getLogger(__name__)


class PureDriftPolicy(SchedulingPolicy):
    """Largest temporal drift first: learns new data fast, ignores the balance of the set."""

    name = "pure-drift"

    def select(self, c: Candidates, budget: Budget, info: RoundInfo) -> np.ndarray:
        if c.num_devices == 0:
            return np.zeros(0, dtype=np.int64)
        return fill(order_by(temporal_drift(c.p_now, c.p_prev, c.L), descending=True), c, budget)
