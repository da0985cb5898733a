"""Builds a DVFS policy from its configured name and options (``dvfs.policy`` in the agent config).

The options a policy accepts are its constructor's keyword parameters, so the list in an error
message is always the real one.
"""
import functools
import inspect
import logging
from typing import Dict, List, Tuple, Type

from streamfl.dvfs.policies.base import DvfsPolicy
from streamfl.dvfs.policies.clp_aware import ClpAwarePolicy
from streamfl.dvfs.policies.extremes import PerformancePolicy, PowersavePolicy
from streamfl.dvfs.policies.fixed import FixedPolicy
from streamfl.dvfs.policies.none import NonePolicy
from streamfl.errors import ConfigError

log = logging.getLogger(__name__)

#: Policy name -> class, in the order they are listed to users.
POLICIES: Dict[str, Type[DvfsPolicy]] = {
    NonePolicy.name: NonePolicy,
    PerformancePolicy.name: PerformancePolicy,
    PowersavePolicy.name: PowersavePolicy,
    FixedPolicy.name: FixedPolicy,
    ClpAwarePolicy.name: ClpAwarePolicy,
}


def policy_options(name: str) -> List[str]:
    """The option names policy ``name`` accepts (its constructor's parameters)."""
    return list(_constructor_options(_policy_class(name)))


@functools.lru_cache(maxsize=None)
def _constructor_options(cls: Type[DvfsPolicy]) -> Tuple[str, ...]:
    """A policy class's keyword parameters, read once per class (``inspect.signature`` of a
    builtin ``__init__`` parses its text signature, about a millisecond each device)."""
    params = inspect.signature(cls.__init__).parameters
    return tuple(p for p in params if p != "self" and params[p].kind == params[p].POSITIONAL_OR_KEYWORD)


def make_policy(name: str, **options) -> DvfsPolicy:
    """A new policy ``name`` configured with ``options``; ConfigError listing the valid names or
    options when either is unknown, or naming the bad value."""
    cls = _policy_class(name)
    valid = policy_options(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ConfigError("DVFS policy %s: unknown option%s %s (valid: %s)" % (
            name, "s" if len(unknown) > 1 else "", ", ".join(unknown), ", ".join(valid) or "none"))
    policy = cls(**options)
    log.debug("DVFS policy %s with %s", name, options)
    return policy


def _policy_class(name: str) -> Type[DvfsPolicy]:
    try:
        return POLICIES[name]
    except (KeyError, TypeError):
        raise ConfigError("unknown DVFS policy %r (valid: %s)" % (name, ", ".join(POLICIES))) from None
