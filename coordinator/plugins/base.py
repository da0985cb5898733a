"""The coordinator side of a learning method: a small hook class the core calls, never names.

A plug-in sees every accepted update, every aggregation and the clock; it adds typed extras to the
global model, may address commands to devices, adds fields to update records, and saves and loads
its state with the coordinator's. Hooks are called in the registry's order (``PLUGINS`` in
``streamfl.coordinator.plugins``), so a plug-in that follows another (CriticalFL follows the CLP
probe) is listed after it and gets it at construction. Every hook has a do-nothing default: a
method implements only what it needs. Hooks do no I/O and must not mutate the updates or tensors
they are shown (they are shared with the strategy, the history and the publisher).
"""
import abc
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Collection, Dict, List, Mapping, Optional, Tuple, Type

import numpy as np

from streamfl.protocol.extras import Extra
from streamfl.protocol.messages import Command, Update


@dataclass(frozen=True)
class Aggregation:
    """One new global version and the updates it merged (one under FedAsync, a round under FedAvg)."""

    version: int
    merged: Tuple[Update, ...]
    time_s: float

    @property
    def base_version(self) -> int:
        """The oldest version the merged updates trained from (``version - 1`` if none)."""
        return min((u.base_version for u in self.merged), default=self.version - 1)


@dataclass(frozen=True)
class Addressed:
    """A command for one device (the runtime publishes it on that device's command topic)."""

    device_id: str
    command: Command


@dataclass(frozen=True)
class FleetView:
    """What a plug-in may read of the coordinator: who is online, the aggregation strategy, the
    model's class count (0 where a caller does not say) and the current global model's tensors
    (None where a caller does not give them; shared: never change them)."""

    online: Callable[[], Collection[str]]
    strategy: Any
    num_classes: int = 0
    model: Optional[Callable[[], Dict[str, np.ndarray]]] = None
    #: When a device was last heard from (its Hello, update or telemetry), None if never.
    last_seen_s: Optional[Callable[[str], Optional[float]]] = None


class CoordinatorPlugin(abc.ABC):
    """Hooks of one method on the coordinator; subclasses set ``name`` and ``Config``."""

    #: The registry name (also the key of its settings under ``plugins:`` in the YAML).
    name: ClassVar[str] = ""
    #: Frozen dataclass of the plug-in's settings (validated like every config).
    Config: ClassVar[Type[Any]]
    #: Names of plug-ins this one needs listed before it (their instances reach ``__init__``).
    requires: ClassVar[Tuple[str, ...]] = ()

    def __init__(self, config: Any, fleet: FleetView, peers: Mapping[str, "CoordinatorPlugin"]):
        self.config = config
        self.fleet = fleet
        self._commands: List[Addressed] = []

    @classmethod
    def check(cls, config: Any, strategy: str) -> None:
        """Raise ``ValueError`` if the plug-in cannot run under ``strategy``; called on config load."""

    # ---- inputs -------------------------------------------------------------------------------
    def on_update(self, update: Update, now: float) -> None:
        """An accepted update (deduplicated, of the fleet's model), before the strategy sees it."""

    def on_report(self, device_id: str, extras: Mapping[str, Extra], now: float) -> None:
        """A greeted device's telemetry carried typed reports (``extras``), e.g. its data's class
        distribution while it skips rounds; well-typed, but not trusted beyond that."""

    def on_aggregation(self, aggregation: Aggregation) -> None:
        """A new global version was made."""

    def on_tick(self, now: float) -> None:
        """Called at every tick of the runtime (about once a second)."""

    def on_operator(self, command: Command, now: float) -> bool:
        """An operator's command to the coordinator (e.g. ``new-session``); True if this plug-in
        handled its kind (a kind nobody handles is logged and ignored)."""
        return False

    def withholds(self, update: Update, now: float) -> bool:
        """True to keep ``update`` from the strategy (called after ``on_update``): a plug-in that
        runs its own rounds (session-init's auxiliary round) or fences off another session's."""
        return False

    def weight(self, update: Update, now: float) -> float:
        """A factor on ``update``'s share of the aggregation (called after ``on_update``; the core
        multiplies the plug-ins' factors; 1.0 leaves the strategy's weighting unchanged)."""
        return 1.0

    # ---- outputs ------------------------------------------------------------------------------
    def extras(self) -> List[Extra]:
        """Typed payloads for the current global model."""
        return []

    def record_fields(self, update: Update) -> Dict[str, Any]:
        """Fields this plug-in adds to the metrics record of ``update`` (JSON-able)."""
        return {}

    def events(self, aggregation: Aggregation) -> List[Dict[str, Any]]:
        """Metrics events to log for an aggregation (each with an ``event`` key)."""
        return []

    def take_events(self) -> List[Dict[str, Any]]:
        """Metrics events of this plug-in's own decisions since the last call (e.g. a session
        boundary), each with an ``event`` key; the core drains them after every input, aggregation
        or not."""
        return []

    def switch_model(self) -> Optional[Dict[str, np.ndarray]]:
        """A model to put in place of the current one now (a new session's starting model), or
        None; the core makes it the next version, with nothing merged. Called after every input."""
        return None

    def send(self, device_id: str, command: Command) -> None:
        """Queue a command for ``device_id``; the core hands it to the runtime with its next output."""
        self._commands.append(Addressed(device_id, command))

    def take_commands(self) -> List[Addressed]:
        """The commands queued since the last call (the core drains them after every input)."""
        out, self._commands = self._commands, []
        return out

    # ---- persistence --------------------------------------------------------------------------
    def state(self) -> Optional[Dict[str, Any]]:
        """JSON-able state for the state directory; None if there is nothing worth keeping."""
        return None

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore what ``state()`` returned; ``ValueError`` if it is malformed."""

    def state_tensors(self) -> Optional[Dict[str, np.ndarray]]:
        """Arrays to keep across restarts beside ``state()`` (the state directory's
        ``plugins.safetensors``), None if none. Handed out by reference, so a snapshot copies
        nothing: a plug-in never changes an array it returned in place (it replaces it)."""
        return None

    def load_state_tensors(self, tensors: Mapping[str, np.ndarray]) -> None:
        """Restore what ``state_tensors()`` returned; ``ValueError`` if it is malformed (the core
        then logs it and the plug-in starts without them)."""
