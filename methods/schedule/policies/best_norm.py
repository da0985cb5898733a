"""The ``best-norm`` baseline (FedTeddi paper, V-A (3), after [37]): the devices whose latest local
update was largest first, taken while they fit the budget.

"Select clients with the largest L2-norm of local gradient updates": order by ``grad_norm``
descending; a device that has not reported one yet (NaN) comes after every known one; ties go to
the lower index.
"""
import logging

import numpy as np

from streamfl.methods.schedule.policies.base import (
    Budget, Candidates, RoundInfo, SchedulingPolicy, fill, order_by,
)

log = logging.getLogger(__name__)


class BestNormPolicy(SchedulingPolicy):
    """Largest update norm first: the devices whose data moves the model most."""

    name = "best-norm"

    def select(self, c: Candidates, budget: Budget, info: RoundInfo) -> np.ndarray:
        return fill(order_by(c.grad_norm, descending=True), c, budget)
