"""The ``fedcgd`` baseline (FedTeddi paper, V-A (7); Chen et al. 2025 [29]): FedTeddi's greedy with
the temporal-drift term off, i.e. minimizing the collective divergence alone.

"Optimize client selection by minimizing the multi-level collective divergences measured through
the weighted EMD": ``teddi.greedy_select`` with lambda0 = 0, so eq. 15 reduces to eq. 11's
L-weighted EMD of the set's pooled mix from the global one, with the same eq. 17 stopping rule and
budget handling as ``fedteddi`` (sigma and b from ``RoundInfo``). [29]'s other levels (per-layer
gradient divergences) need data the coordinator does not have; the class-level EMD is the one the
FedTeddi paper builds on.
"""
import logging

import numpy as np

from streamfl.methods.schedule.policies.base import Budget, Candidates, RoundInfo, SchedulingPolicy
from streamfl.methods.schedule.policies.fedteddi import teddi_select

log = logging.getLogger(__name__)


class FedCgdPolicy(SchedulingPolicy):
    """Divergence-only greedy: a balanced set, blind to which data is new."""

    name = "fedcgd"

    def select(self, c: Candidates, budget: Budget, info: RoundInfo) -> np.ndarray:
        return teddi_select(c, budget, info, lambda0=0.0)
