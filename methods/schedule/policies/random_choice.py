"""The ``random`` baseline (FedTeddi paper, V-A (1)): devices in a uniformly random order, taken while
they fit the budget.

"Randomly select clients uniformly at random under bandwidth constraints": a permutation from the
policy's own generator, then ``fill`` (devices that cannot meet the deadline or hold no data are
skipped, so a random draw never wastes a slot on them).
"""
import logging

import numpy as np

from streamfl.methods.schedule.policies.base import (
    Budget, Candidates, RoundInfo, SchedulingPolicy, fill,
)

log = logging.getLogger(__name__)


class RandomPolicy(SchedulingPolicy):
    """Uniform random scheduling: the reference every other policy must beat."""

    name = "random"

    def select(self, c: Candidates, budget: Budget, info: RoundInfo) -> np.ndarray:
        return fill(self.rng.permutation(c.num_devices), c, budget)
