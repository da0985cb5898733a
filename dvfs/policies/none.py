"""The ``none`` policy: the agent leaves every clock as the governor and the user set it."""
import logging
from typing import Dict

from streamfl.dvfs.policies.base import DvfsPolicy, PolicyInput

log = logging.getLogger(__name__)


class NonePolicy(DvfsPolicy):
    """Never sets a level, so ``dvfs.policy: none`` behaves as if streamfl had no DVFS at all."""

    name = "none"

    def plan(self, inp: PolicyInput) -> Dict[str, int]:
        return {}
