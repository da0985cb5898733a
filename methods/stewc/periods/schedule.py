"""Fixed-length periods: ST-EWC's own setting, where the scenario (or an operator) says when.

Period n ends ``period_s`` after it started; the clock starts at the first tick the source sees,
so a simulator whose data switches every ``period_s`` from time 0 and a coordinator that starts
with it agree. Boundaries are counted from that origin, not from each ``started``, so the periods
keep the schedule's phase however late the announcement goes out.
"""
from typing import Any, Collection, Dict, Mapping, Optional

from streamfl.methods.stewc.periods.base import PeriodBoundary


class ScheduleBoundary(PeriodBoundary):
    """A boundary every ``period_s`` seconds from the first tick."""

    name = "schedule"

    def __init__(self, period_s: float):
        if not period_s > 0:
            raise ValueError("period_s must be > 0, got %r" % (period_s,))
        self.period_s = float(period_s)
        self._origin_s: Optional[float] = None
        self._ended = 0

    def due(self, now: float, online: Collection[str]) -> bool:
        if self._origin_s is None:
            self._origin_s = float(now)
        return now >= self._origin_s + (self._ended + 1) * self.period_s

    def started(self, now: float) -> None:
        self._ended += 1

    def state(self) -> Dict[str, Any]:
        return {"origin_s": self._origin_s, "ended": self._ended}

    def load_state(self, state: Mapping[str, Any]) -> None:
        origin, ended = state.get("origin_s"), state.get("ended", 0)
        if (origin is not None and not isinstance(origin, (int, float))) or type(ended) is not int or ended < 0:
            raise ValueError("schedule boundary: bad saved state %r" % (dict(state),))
        self._origin_s = None if origin is None else float(origin)
        self._ended = ended
