"""The aggregation-strategy interface the coordinator core drives (DESIGN.md section 5).

A strategy sees the current global model, its version, and each accepted update; it answers with
new global tensors when it aggregates (the core then bumps the version) or None when it only
buffered or dropped the update. Strategies never mutate the tensors they are given: the current
model is shared with the history and the publisher thread, so every aggregation builds new arrays.
"""
import abc
from typing import Any, Dict, List, Optional

from streamfl.protocol.messages import Tensors, Update

#: ``last_outcome`` values after ``on_update``.
AGGREGATED = "aggregated"  # this update produced a new global model
BUFFERED = "buffered"      # kept for a later aggregation (e.g. a FedAvg round)
STALE = "stale"            # dropped: too old for this strategy


def staleness_of(version: int, update: Update) -> int:
    """``t - tau`` clamped at 0 (a base version from the future means the coordinator lost state)."""
    return max(0, int(version) - int(update.base_version))


class Aggregator(abc.ABC):
    """Turns updates into new global models; owns its own per-strategy state and counters."""

    #: Config name of the strategy.
    name = "base"

    def __init__(self) -> None:
        #: What the last ``on_update`` did with its update: AGGREGATED, BUFFERED or STALE.
        self.last_outcome = BUFFERED
        #: The updates the newest aggregation merged (what the CLP probe reads of it).
        self.last_aggregated: List[Update] = []
        #: Updates dropped as too stale (core reports it as ``stale_dropped``).
        self.stale_dropped = 0

    @abc.abstractmethod
    def on_update(self, model: Tensors, version: int, update: Update, now: float) -> Optional[Tensors]:
        """Consume one accepted update; new global tensors if it aggregated, else None."""

    def on_clp(self, in_clp: bool) -> None:
        """The CLP flag after an aggregation (AdaCLP's probe); strategies that follow it override."""

    def on_tick(self, model: Tensors, version: int, now: float) -> Optional[Tensors]:
        """Called periodically (deadlines); new global tensors if it aggregated, else None."""
        return None

    def state(self) -> Dict[str, Any]:
        """JSON-able strategy state for the state directory."""
        return {"stale_dropped": self.stale_dropped}

    def load_state(self, state: Dict[str, Any]) -> None:
        """Restore what ``state()`` returned (missing keys keep their defaults)."""
        self.stale_dropped = int(state.get("stale_dropped", 0))
