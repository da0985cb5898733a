"""The buffer's replacement policies, by name (``buffer_policy`` in the agent YAML).

The generic ones live here; a method lends its own through its package (``buffer_policies`` in
its ``MethodPackage``). ``tests/test_buffer_policy_contract.py`` runs the contract over every one.
"""
from typing import Dict, Type

from streamfl.agent.buffer_policies.base import ReplacementPolicy
from streamfl.agent.buffer_policies.fifo import FifoPolicy
from streamfl.agent.buffer_policies.reservoir import ReservoirPolicy

#: The policies that belong to no method.
GENERIC: Dict[str, Type[ReplacementPolicy]] = {cls.name: cls for cls in (FifoPolicy, ReservoirPolicy)}


def policies() -> Dict[str, Type[ReplacementPolicy]]:
    """Every policy by name: the generic ones, then the methods'."""
    from streamfl import methods
    return dict(GENERIC, **methods.buffer_policies())


def make_buffer_policy(name: str, seed: int = 0) -> ReplacementPolicy:
    """The policy called ``name``; ``ValueError`` naming the known ones otherwise."""
    known = GENERIC if name in GENERIC else policies()
    try:
        return known[name](seed)
    except KeyError:
        raise ValueError("unknown buffer policy %r (known: %s)" % (name, ", ".join(known))) from None


__all__ = ["GENERIC", "policies", "ReplacementPolicy", "FifoPolicy", "ReservoirPolicy", "make_buffer_policy"]
