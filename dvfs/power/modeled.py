"""A power meter computed from a board profile's power model, for the simulator and the demo.

Power is the board's idle draw plus, while training runs, each domain's watts at its current level
(the ``watts per level`` of the board profile, ``configs/boards/*.yaml``). It measures nothing on
real hardware.
"""
import logging
import math
from typing import Callable, Dict, Mapping, Sequence, Tuple

from streamfl.dvfs.base import DvfsError, FrequencyDomain
from streamfl.dvfs.power.base import PowerError, PowerMeter

log = logging.getLogger(__name__)

IDLE_RAIL = "idle"


class ModeledMeter(PowerMeter):
    """``idle_w`` always, plus ``watts_per_level[domain][domain.current_level()]`` while ``busy()``."""

    kind = "modeled"
    measured = False

    def __init__(self, domains: Sequence[FrequencyDomain],
                 watts_per_level: Mapping[str, Sequence[float]], idle_w: float,
                 busy: Callable[[], bool]):
        if not math.isfinite(idle_w) or idle_w < 0:
            raise ValueError("idle_w must be a finite non-negative number, got %r" % (idle_w,))
        self._domains = list(domains)
        self._watts: Dict[str, Tuple[float, ...]] = {}
        for dom in self._domains:
            if dom.name == IDLE_RAIL:
                raise ValueError("a domain may not be called %r, the idle rail's name" % IDLE_RAIL)
            if dom.name not in watts_per_level:
                raise ValueError("no watts per level for domain %r" % dom.name)
            watts = tuple(float(w) for w in watts_per_level[dom.name])
            if len(watts) != len(dom.levels_khz):
                raise ValueError("domain %r has %d levels but %d watts per level"
                                 % (dom.name, len(dom.levels_khz), len(watts)))
            if any(not math.isfinite(w) or w < 0 for w in watts):
                raise ValueError("watts per level of %r must be finite and >= 0" % dom.name)
            self._watts[dom.name] = watts
        self._idle_w = float(idle_w)
        self._busy = busy

    @property
    def rails(self) -> Tuple[str, ...]:
        return (IDLE_RAIL,) + tuple(d.name for d in self._domains)

    def read_w(self) -> Dict[str, float]:
        busy = bool(self._busy())
        watts = {IDLE_RAIL: self._idle_w}
        for dom in self._domains:
            if not busy:
                watts[dom.name] = 0.0
                continue
            try:
                level = dom.current_level()
            except PowerError:
                raise
            except DvfsError as exc:
                raise PowerError("cannot read the level of %s: %s" % (dom.name, exc),
                                 exc.errno) from exc
            watts[dom.name] = self._watts[dom.name][level]
        return watts
