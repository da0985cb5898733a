"""The aggregation-strategy interface the coordinator core drives.

A strategy sees the current global model, its version, and each accepted update; it answers with
an ``Outcome``: what it did with the update and, when it aggregated, the new global tensors (the
core then bumps the version) and the updates they merged. Strategies never mutate the tensors they
are given: the current model is shared with the history and the publisher thread, so every
aggregation builds new arrays.
"""
import abc
from dataclasses import dataclass
from typing import Any, Collection, Dict, Optional, Tuple

from streamfl.protocol.messages import Tensors, Update

#: ``Outcome.kind`` values.
AGGREGATED = "aggregated"  # this update produced a new global model
BUFFERED = "buffered"      # kept for a later aggregation (e.g. a FedAvg round)
STALE = "stale"            # dropped: too old for this strategy


@dataclass(frozen=True)
class Outcome:
    """What a strategy did with an update (or a tick): the new model and what it merged, if any."""

    #: AGGREGATED, BUFFERED or STALE.
    kind: str
    #: The new global tensors when it aggregated, else None.
    model: Optional[Tensors] = None
    #: The updates the aggregation merged (empty when it did not aggregate).
    merged: Tuple[Update, ...] = ()
    #: The share the one merged update got in the new model where the strategy mixes updates in
    #: one at a time (FedAsync's a_t); None for a round (FedAvg) or no aggregation.
    mixing_weight: Optional[float] = None

    def __post_init__(self) -> None:
        if self.kind not in (AGGREGATED, BUFFERED, STALE):
            raise ValueError("strategy outcome kind must be %s, %s or %s, got %r"
                             % (AGGREGATED, BUFFERED, STALE, self.kind))
        if (self.kind == AGGREGATED) != (self.model is not None):
            raise ValueError("a strategy outcome has a model exactly when it aggregated (%s)" % self.kind)

    @property
    def aggregated(self) -> bool:
        """True when this made a new global model."""
        return self.model is not None


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
        #: Updates dropped as too stale (core reports it as ``stale_dropped``).
        self.stale_dropped = 0

    @abc.abstractmethod
    def on_update(self, model: Tensors, version: int, update: Update, now: float,
                  weight: float = 1.0) -> Outcome:
        """Consume one accepted update; the Outcome says whether it aggregated (then with the new
        global tensors and the updates merged), buffered or dropped it as stale.

        ``weight`` is the methods' factor on this update's share of the aggregation (the product of
        the plug-ins' ``weight``; 1.0 leaves the strategy's own weighting as it is)."""

    def on_tick(self, model: Tensors, version: int, now: float) -> Optional[Outcome]:
        """Called periodically (deadlines); an AGGREGATED Outcome (its model set) when a deadline
        closed a round, else None (never a BUFFERED or STALE Outcome)."""
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
