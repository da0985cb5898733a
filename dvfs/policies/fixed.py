"""The ``fixed`` policy: the configured domains at configured levels every round, the rest untouched.

Levels are given per domain name, either as an index (``levels: {cpu0: 3}``) or as a frequency that
must be one of the domain's levels (``levels_khz: {gpu: 612000}``). Two keys rather than one guessed
from the number's size, because a small kHz value and a large index cannot be told apart.
"""
import logging
from typing import Dict, Mapping, Optional

from streamfl.dvfs.policies.base import DvfsPolicy, PolicyInput
from streamfl.errors import ConfigError

log = logging.getLogger(__name__)


def _check_mapping(option: str, value: Optional[Mapping[str, int]], minimum: int) -> Dict[str, int]:
    """``value`` as a plain dict of domain name -> int >= ``minimum``; ConfigError naming the bad
    entry otherwise (YAML can hand over strings, floats and booleans)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError("fixed policy: %s must map domain names to numbers, got %r" % (option, value))
    out = {}
    for name, number in value.items():
        if not isinstance(name, str) or not name:
            raise ConfigError("fixed policy: %s has a bad domain name %r" % (option, name))
        if isinstance(number, bool) or not isinstance(number, int):
            raise ConfigError("fixed policy: %s[%s] must be an integer, got %r" % (option, name, number))
        if number < minimum:
            raise ConfigError("fixed policy: %s[%s] must be >= %d, got %d" % (
                option, name, minimum, number))
        out[name] = number
    return out


class FixedPolicy(DvfsPolicy):
    """Pins the configured domains; names and levels are checked against the board at each plan, so
    a profile for another board fails loudly on the first round instead of silently doing nothing."""

    name = "fixed"

    def __init__(self, levels: Optional[Mapping[str, int]] = None,
                 levels_khz: Optional[Mapping[str, int]] = None):
        self.levels = _check_mapping("levels", levels, 0)
        self.levels_khz = _check_mapping("levels_khz", levels_khz, 1)
        both = sorted(set(self.levels) & set(self.levels_khz))
        if both:
            raise ConfigError("fixed policy: %s given in both levels and levels_khz; pick one" % (
                ", ".join(both)))
        if not self.levels and not self.levels_khz:
            raise ConfigError("fixed policy: set levels (index per domain) or levels_khz "
                              "(frequency per domain); use policy none to touch nothing")

    def plan(self, inp: PolicyInput) -> Dict[str, int]:
        known = ", ".join(d.name for d in inp.domains) or "none"
        out = {}
        for name, index in self.levels.items():
            dom = inp.domain(name)
            if dom is None:
                raise ConfigError("fixed policy: levels names domain %r, this board has: %s" % (
                    name, known))
            if index > dom.top_level:
                raise ConfigError("fixed policy: levels[%s] = %d, but %s has levels 0..%d" % (
                    name, index, name, dom.top_level))
            out[name] = index
        for name, khz in self.levels_khz.items():
            dom = inp.domain(name)
            if dom is None:
                raise ConfigError("fixed policy: levels_khz names domain %r, this board has: %s" % (
                    name, known))
            if khz not in dom.levels_khz:
                raise ConfigError("fixed policy: levels_khz[%s] = %d is not a level of %s (%s)" % (
                    name, khz, name, ", ".join(str(f) for f in dom.levels_khz)))
            out[name] = dom.levels_khz.index(khz)
        return out
