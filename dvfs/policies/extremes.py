"""The ``performance`` and ``powersave`` policies: every domain at its top or bottom level.

They are the two baselines a critical-period-aware DVFS policy is compared against (fixed high and
fixed low frequency), and the ends of the ladder ``streamfl-agent dvfs probe`` walks.
"""
import logging
from typing import Dict

from streamfl.dvfs.policies.base import DvfsPolicy, PolicyInput

log = logging.getLogger(__name__)


class PerformancePolicy(DvfsPolicy):
    """Every domain, CPU and GPU, at its highest level every round."""

    name = "performance"

    def plan(self, inp: PolicyInput) -> Dict[str, int]:
        return {d.name: d.top_level for d in inp.domains}


class PowersavePolicy(DvfsPolicy):
    """Every domain, CPU and GPU, at its lowest level (index 0) every round."""

    name = "powersave"

    def plan(self, inp: PolicyInput) -> Dict[str, int]:
        return {d.name: 0 for d in inp.domains}
