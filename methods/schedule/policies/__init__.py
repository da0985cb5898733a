"""Device scheduling for the coordinator: FedTeddi's drift- and divergence-aware greedy choice
of who trains each round, under a latency deadline or a shared bandwidth budget (teddi.py), and the
scheduling policies built on it: FedTeddi and the paper's seven baselines, one module each behind
the ``SchedulingPolicy`` interface of base.py, by name through ``make_policy``.

Pure numpy; the coordinator plug-in that feeds them the fleet's reports lives elsewhere.
"""
import logging
from typing import Any, Dict, Mapping, Optional, Type

from streamfl.methods.schedule.policies.base import (
    Budget, Candidates, RoundInfo, SchedulingPolicy, affordable, fill, order_by,
)
from streamfl.methods.schedule.policies.best_channel import BestChannelPolicy
from streamfl.methods.schedule.policies.best_norm import BestNormPolicy
from streamfl.methods.schedule.policies.fedcbs import FedCbsPolicy
from streamfl.methods.schedule.policies.fedcgd import FedCgdPolicy
from streamfl.methods.schedule.policies.fedteddi import FedTeddiPolicy
from streamfl.methods.schedule.policies.power_of_choice import PowerOfChoicePolicy
from streamfl.methods.schedule.policies.pure_drift import PureDriftPolicy
from streamfl.methods.schedule.policies.random_choice import RandomPolicy
from streamfl.methods.schedule.policies.teddi import (
    DEFAULT_BATCH, DEFAULT_LAMBDA0, DEFAULT_SIGMA, Allocation, allocate_bandwidth, class_weights,
    collective_divergence, drift_weight, global_distribution, greedy_select, temporal_drift,
    utility,
)

log = logging.getLogger(__name__)

#: Policy name -> class, in the paper's order (V-A's baselines, then FedTeddi).
POLICIES: Dict[str, Type[SchedulingPolicy]] = {
    cls.name: cls for cls in (
        RandomPolicy, BestChannelPolicy, BestNormPolicy, PowerOfChoicePolicy, PureDriftPolicy,
        FedCbsPolicy, FedCgdPolicy, FedTeddiPolicy)
}


def make_policy(name: str, seed: int = 0, options: Optional[Mapping[str, Any]] = None
                ) -> SchedulingPolicy:
    """A new scheduling policy ``name`` seeded with ``seed`` and configured with ``options``;
    ValueError listing the known names or options when either is unknown, or naming a bad value."""
    try:
        cls = POLICIES[name]
    except (KeyError, TypeError):
        raise ValueError("unknown scheduling policy %r (known: %s)" % (
            name, ", ".join(POLICIES))) from None
    policy = cls(seed=seed, **dict(options or {}))
    log.debug("scheduling policy %r", policy)
    return policy


__all__ = ["DEFAULT_BATCH", "DEFAULT_LAMBDA0", "DEFAULT_SIGMA", "Allocation", "allocate_bandwidth",
           "class_weights", "collective_divergence", "drift_weight", "global_distribution",
           "greedy_select", "temporal_drift", "utility",
           "POLICIES", "make_policy", "Budget", "Candidates", "RoundInfo", "SchedulingPolicy",
           "affordable", "fill", "order_by", "BestChannelPolicy", "BestNormPolicy", "FedCbsPolicy",
           "FedCgdPolicy", "FedTeddiPolicy", "PowerOfChoicePolicy", "PureDriftPolicy",
           "RandomPolicy"]
