"""When a session ends: the set of present devices changed by more than a fraction, or an
operator asked for a new session (at the earliest ``min_session_s`` into it) (the paper leaves it open).

A device is present while the registry has it online (from its Hello until its last will or clean
offline) and, with ``silence_s`` > 0, it was heard from within ``silence_s`` (a board that stays
connected but stops working). The change is ``|S_ref xor S_now| / max(1, |S_ref|)``: devices gone
plus devices new, over the session's reference set. Guards against thrashing:

- ``settle_s``: a change must last that long before it counts (boards of a shift leave over a few
  seconds: one boundary, not several), and devices that arrive within ``settle_s`` of a session's
  start join its reference set (a fleet booting, or the stragglers of a shift change);
- ``min_session_s``: no boundary from membership before a session is that old (a flapping device
  cannot thrash the fleet). The ``sessions`` plug-in holds every boundary, an operator's
  ``new-session`` too, until the session has also trained its own model (its auxiliary rounds
  done) that long.
"""
from typing import Any, Collection, Dict, FrozenSet, Mapping, Optional


class Membership:
    """Tracks the reference set of the running session and says when it changed enough."""

    def __init__(self, change_fraction: float, min_session_s: float, settle_s: float):
        self.change_fraction = float(change_fraction)
        self.min_session_s = float(min_session_s)
        self.settle_s = float(settle_s)
        self.reference: FrozenSet[str] = frozenset()
        self.started_s: Optional[float] = None
        self._changed_since: Optional[float] = None

    def change(self, present: Collection[str]) -> float:
        """The share of the reference set that changed (gone plus new over its size)."""
        now_set = frozenset(present)
        return len(self.reference ^ now_set) / float(max(1, len(self.reference)))

    def due(self, now: float, present: Collection[str]) -> bool:
        """True if the running session ended (a change beyond the fraction that lasted ``settle_s``)."""
        if self.started_s is None:
            return False
        age_s = now - self.started_s
        if age_s < self.settle_s:
            self.reference = self.reference | frozenset(present)  # arrivals join the session
            return False
        if self.change(present) <= self.change_fraction:
            self._changed_since = None
            return False
        if self._changed_since is None:
            self._changed_since = now
        return age_s >= self.min_session_s and now - self._changed_since >= self.settle_s

    def start(self, now: float, present: Collection[str]) -> None:
        """A session began at ``now`` with ``present`` online."""
        self.reference = frozenset(present)
        self.started_s = now
        self._changed_since = None

    # ---- persistence (times are the process's: a restart restarts the session's clock) --------
    def state(self) -> Dict[str, Any]:
        return {"reference": sorted(self.reference)}

    def load_state(self, state: Mapping[str, Any]) -> None:
        ref = state.get("reference") or []
        if not isinstance(ref, list) or not all(isinstance(d, str) for d in ref):
            raise ValueError("sessions: reference must be a list of device ids")
        self.reference = frozenset(ref)
        self.started_s = None  # set again at the first tick after the restart
        self._changed_since = None
