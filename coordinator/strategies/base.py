"""The aggregation-strategy interface the coordinator core drives.

A strategy sees the current global model, its version, and each accepted update; it answers with
new global tensors when it aggregates (the core then bumps the version) or None when it only
buffered or dropped the update. Strategies never mutate the tensors they are given: the current
model is shared with the history and the publisher thread, so every aggregation builds new arrays.
"""
import abc
from typing import Any, Collection, Dict, List, Optional

from streamfl.protocol.messages import Tensors, Update

#: ``last_outcome`` values after ``on_update``.
AGGREGATED = "aggregated"  # this update produced a new global model
BUFFERED = "buffered"      # kept for a later aggregation (e.g. a FedAvg round)
STALE = "stale"            # dropped: too old for this strategy


class Aggregator(abc.ABC):
    """Turns updates into new global models; owns its own per-strategy state and counters."""

    #: Config name of the strategy.
    name = "base"
    #: True when the updates merged together (a round) share out their weight factors among
    #: themselves, so only the factors' ratios matter (FedAvg), not their scale (FedAsync).
    normalizes_weights = False
    #: True for a strategy of synchronous rounds (FedAvg): the methods may then set the round's
    #: size and the devices it waits for (``set_round_size``, ``expect``) through their Effects.
    runs_rounds = False

    def __init__(self) -> None:
        #: What the last ``on_update`` did with its update: AGGREGATED, BUFFERED or STALE.
        self.last_outcome = BUFFERED
        #: The updates the newest aggregation merged (the core hands them to the plug-ins).
        self.last_aggregated: List[Update] = []
        #: Updates dropped as too stale (core reports it as ``stale_dropped``).
        self.stale_dropped = 0

    @abc.abstractmethod
    def on_update(self, model: Tensors, version: int, update: Update, now: float,
                  weight: float = 1.0) -> Optional[Tensors]:
        """Consume one accepted update; new global tensors if it aggregated, else None.

        ``weight`` is the methods' factor on this update's share of the aggregation (the product of
        the plug-ins' ``weight``; 1.0 leaves the strategy's own weighting as it is)."""

    def on_tick(self, model: Tensors, version: int, now: float) -> Optional[Tensors]:
        """Called periodically (deadlines); new global tensors if it aggregated, else None."""
        return None

    def set_round_size(self, clients: Optional[int]) -> None:
        """Make rounds wait for ``clients`` devices (None: every online one); rounds only."""
        raise TypeError("strategy %s runs no rounds: it has no round size" % self.name)

    def expect(self, devices: Optional[Collection[str]]) -> None:
        """Make rounds wait for ``devices`` (None: every online one); rounds only."""
        raise TypeError("strategy %s runs no rounds: it waits for no devices" % self.name)

    def state(self) -> Dict[str, Any]:
        """JSON-able strategy state for the state directory."""
        return {"stale_dropped": self.stale_dropped}

    def load_state(self, state: Dict[str, Any]) -> None:
        """Restore what ``state()`` returned (missing keys keep their defaults)."""
        self.stale_dropped = int(state.get("stale_dropped", 0))
