"""Periods cut where the devices' inputs move: a real fleet's boundary (the paper leaves it open).

Each device counts the drifts of its own input statistics (``methods/stewc/drift.py``) and reports the
count. A period ends when at least ``quorum`` of the online devices that report have counted a new
drift since the period started, each within the last ``window_s`` seconds, and the period is at
least ``min_period_s`` old. Why a quorum:
one device moving (a board carried to another room) is that device's business, and a single
hostile or broken device must not be able to cut the fleet's periods; why a minimum length: a
signal that flaps cannot consolidate half-learned models every few seconds. A device first heard
mid-period counts from its first report (its older drifts were not this period's), and one whose
count went down (it restarted) is re-based. Why the window: a real move reaches every device
within seconds, while false alarms are spread over the period and must not add up to a quorum;
and a device that notices the move within ``window_s`` after the boundary was cut is counted in
that boundary, not toward the next.
"""
import math
from typing import Any, Collection, Dict, Mapping, Optional

from streamfl.methods.stewc.periods.base import PeriodBoundary
from streamfl.methods.stewc.payloads import DriftSignal


class DriftBoundary(PeriodBoundary):
    """A boundary when a quorum of reporting devices drifted lately, no sooner than ``min_period_s``."""

    name = "drift"

    def __init__(self, quorum: float = 0.5, min_period_s: float = 60.0, window_s: float = 30.0):
        if not 0 < quorum <= 1:
            raise ValueError("drift quorum must be in (0, 1], got %r" % (quorum,))
        if not min_period_s >= 0 or not window_s > 0:
            raise ValueError("min_period_s must be >= 0 and window_s > 0, got %r and %r"
                             % (min_period_s, window_s))
        self.quorum, self.min_period_s, self.window_s = float(quorum), float(min_period_s), float(window_s)
        self._base: Dict[str, int] = {}
        self._latest: Dict[str, int] = {}
        self._changed_s: Dict[str, float] = {}
        self._start_s: Optional[float] = None
        #: When the last boundary was cut (None before the first).
        self._cut_s: Optional[float] = None

    def on_signal(self, device_id: str, signal: DriftSignal, now: float) -> None:
        count = int(signal.drifts)
        if device_id not in self._base or count < self._base[device_id]:
            self._base[device_id] = count
        elif count > self._latest.get(device_id, count):
            self._changed_s[device_id] = float(now)
            if self._cut_s is not None and now - self._cut_s <= self.window_s:
                # A device that noticed the move just after the quorum did: the same boundary.
                self._base[device_id] = count
        self._latest[device_id] = count

    def drifted(self, online: Collection[str], now: float) -> int:
        """Online devices whose count rose since the period started, within the last ``window_s``."""
        return sum(1 for d in online if self._latest.get(d, -1) > self._base.get(d, 0)
                   and now - self._changed_s.get(d, float("-inf")) <= self.window_s)

    def due(self, now: float, online: Collection[str]) -> bool:
        if self._start_s is None:
            self._start_s = float(now)
        if now - self._start_s < self.min_period_s:
            return False
        reporting = [d for d in online if d in self._latest]
        if not reporting:
            return False
        return self.drifted(reporting, now) >= math.ceil(self.quorum * len(reporting) - 1e-9)

    def started(self, now: float) -> None:
        self._start_s = self._cut_s = float(now)
        self._base = dict(self._latest)

    def state(self) -> Dict[str, Any]:
        return {"start_s": self._start_s, "cut_s": self._cut_s, "base": dict(self._base),
                "latest": dict(self._latest), "changed_s": dict(self._changed_s)}

    def load_state(self, state: Mapping[str, Any]) -> None:
        start, base, latest = state.get("start_s"), state.get("base", {}), state.get("latest", {})
        changed = state.get("changed_s", {})
        cut = state.get("cut_s")
        ok = all(v is None or isinstance(v, (int, float)) for v in (start, cut)) and all(
            isinstance(x, dict) for x in (base, latest, changed))
        ok = ok and all(type(v) is int and v >= 0 for v in list(base.values()) + list(latest.values()))
        ok = ok and all(isinstance(v, (int, float)) for v in changed.values())
        if not ok:
            raise ValueError("drift boundary: bad saved state")
        self._start_s = None if start is None else float(start)
        self._cut_s = None if cut is None else float(cut)
        self._base, self._latest = dict(base), dict(latest)
        self._changed_s = {k: float(v) for k, v in changed.items()}
