"""The DVFS policy interface: a sans-I/O object that turns the critical-period flag and the
measured seconds per training sample into a plan of clock levels for the next round.

A policy never touches sysfs: the agent builds a ``PolicyInput`` from its ``DvfsBackend`` before
each round, applies the returned plan with ``FrequencyDomain.set_level`` and reports what the round
measured back through ``observe``. That keeps every policy testable without a board or a fake tree.
"""
import abc
import dataclasses
import math
from typing import Dict, Mapping, Optional, Tuple

from streamfl.dvfs.base import CPU, GPU

#: Domain kinds a view may carry (the same constants as ``streamfl.dvfs.base``).
KINDS = (CPU, GPU)


@dataclasses.dataclass(frozen=True)
class DomainView:
    """What a policy may know of one frequency domain: its name, kind, ladder and current level."""

    name: str
    kind: str
    #: Ascending, kHz for every domain (``FrequencyDomain.levels_khz``).
    levels_khz: Tuple[int, ...]
    #: Index into ``levels_khz`` (``FrequencyDomain.current_level()``).
    current_level: int = 0

    def __post_init__(self):
        if not self.name:
            raise ValueError("a DomainView needs a name")
        if self.kind not in KINDS:
            raise ValueError("domain %s: kind %r is not one of %s" % (
                self.name, self.kind, ", ".join(KINDS)))
        levels = tuple(self.levels_khz)
        object.__setattr__(self, "levels_khz", levels)
        if not levels:
            raise ValueError("domain %s has no levels" % self.name)
        if any(b <= a for a, b in zip(levels, levels[1:])):
            raise ValueError("domain %s: levels_khz must be strictly ascending, got %s" % (
                self.name, list(levels)))
        if not 0 <= self.current_level < len(levels):
            raise ValueError("domain %s: current_level %d is outside 0..%d" % (
                self.name, self.current_level, len(levels) - 1))

    @property
    def top_level(self) -> int:
        """Index of the highest level."""
        return len(self.levels_khz) - 1


@dataclasses.dataclass(frozen=True)
class PolicyInput:
    """Everything a policy decides from: the critical-period flag, the domains and the timings
    measured so far."""

    #: Whether training is in a critical learning period, as the agent's plug-ins judge it from
    #: the latest global model (false while no plug-in says so).
    critical_period: bool
    domains: Tuple[DomainView, ...]
    #: Seconds per training sample by (domain name, level index), averaged by the agent over recent
    #: rounds at that level; may be empty or cover only some levels.
    seconds_per_sample: Mapping[Tuple[str, int], float] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        domains = tuple(self.domains)
        object.__setattr__(self, "domains", domains)
        names = [d.name for d in domains]
        if len(set(names)) != len(names):
            raise ValueError("duplicate domain names in %s" % names)
        for key, value in self.seconds_per_sample.items():
            check_seconds_per_sample(key[0], key[1], value)

    def domain(self, name: str) -> Optional[DomainView]:
        """The view called ``name``, or None."""
        for dom in self.domains:
            if dom.name == name:
                return dom
        return None


def check_seconds_per_sample(domain: str, level: int, seconds_per_sample: float) -> float:
    """``seconds_per_sample`` as a float if it is a usable timing (finite, above zero); ValueError
    otherwise, since a zero or negative time per sample is a measuring bug, not a fast board."""
    value = float(seconds_per_sample)
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError("seconds per sample for %s level %s must be finite and > 0, got %r" % (
            domain, level, seconds_per_sample))
    return value


class DvfsPolicy(abc.ABC):
    """Decides, before each round, which level each domain it controls runs at."""

    #: The name ``make_policy`` knows it by (``dvfs.policy`` in the agent config).
    name = ""

    @abc.abstractmethod
    def plan(self, inp: PolicyInput) -> Dict[str, int]:
        """Domain name -> level index for the next round, only for the domains to set; an empty
        dict means touch nothing. Call once per round: stateful policies advance on each call."""

    def observe(self, domain: str, level: int, seconds_per_sample: float) -> None:
        """A round ran ``domain`` at ``level`` and took ``seconds_per_sample``; ignored by default,
        stateful policies learn from it."""
