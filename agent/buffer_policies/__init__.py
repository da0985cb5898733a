"""The buffer's replacement policies, by name (``buffer_policy`` in the agent YAML).

Adding one: a file here with a ``ReplacementPolicy`` subclass (constructor ``(seed)``) and a line
in ``POLICIES``; ``tests/test_buffer_policy_contract.py`` runs the contract over every entry.
"""
from typing import Dict, Type

from streamfl.agent.buffer_policies.base import ReplacementPolicy
from streamfl.agent.buffer_policies.dds import DdsPolicy
from streamfl.agent.buffer_policies.fifo import FifoPolicy
from streamfl.agent.buffer_policies.importance import ImportancePolicy
from streamfl.agent.buffer_policies.reservoir import ReservoirPolicy

POLICIES: Dict[str, Type[ReplacementPolicy]] = {cls.name: cls for cls in (FifoPolicy, ReservoirPolicy, DdsPolicy,
                                                                           ImportancePolicy)}


def make_buffer_policy(name: str, seed: int = 0) -> ReplacementPolicy:
    """The policy called ``name``; ``ValueError`` naming the known ones otherwise."""
    try:
        return POLICIES[name](seed)
    except KeyError:
        raise ValueError("unknown buffer policy %r (known: %s)" % (name, ", ".join(POLICIES))) from None


__all__ = ["POLICIES", "ReplacementPolicy", "FifoPolicy", "ReservoirPolicy", "DdsPolicy", "ImportancePolicy",
           "make_buffer_policy"]
