"""The coordinator side of a learning method: a small hook class the core calls, never names.

Hooks are named by when they run and return what the plug-in decided (``Effects``: commands,
events, a model switch, a round size or the devices a round waits for; ``Verdict`` for an update:
a weight factor or withhold, and record fields), which the core applies: a plug-in never writes
into the strategy or queues output for the core to collect. Hooks are called in the methods'
calling order (``streamfl.methods.BUILTIN``), so a plug-in that follows another (CriticalFL
follows the CLP probe) is listed after it and gets it at construction. Every hook has a do-nothing
default: a method implements only what it needs. Hooks do no I/O and must not mutate the updates
or tensors they are shown (they are shared with the strategy, the history and the publisher).
"""
import abc
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Collection, Dict, FrozenSet, List, Mapping, Optional, Tuple, Type, Union

import numpy as np

from streamfl.protocol.extras import Extra
from streamfl.protocol.messages import Command, Update


@dataclass(frozen=True)
class Aggregation:
    """One new global version and the updates it merged (one under FedAsync, a round under FedAvg)."""

    version: int
    merged: Tuple[Update, ...]
    time_s: float
    #: The share the merged update got in the new model where the strategy mixes one update in
    #: (FedAsync's mixing weight); None for a round or a switch.
    mixing_weight: Optional[float] = None
    #: The plug-in whose ``switch_to`` made this version (nothing merged), "" for an aggregation.
    switched_by: str = ""

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
    """What a plug-in may read of the coordinator: who is online, the aggregation strategy's kind,
    the model's class count (0 where a caller does not say) and the current global model's tensors
    (None where a caller does not give them; shared: never change them). Read-only: a plug-in
    changes the fleet only through the ``Effects`` its hooks return."""

    online: Callable[[], Collection[str]]
    num_classes: int = 0
    model: Optional[Callable[[], Dict[str, np.ndarray]]] = None
    #: When a device was last heard from (its Hello, update or telemetry), None if never.
    last_seen_s: Optional[Callable[[str], Optional[float]]] = None
    #: The strategy's registry name (``fedasync``, ``fedavg``).
    strategy: str = ""
    #: True if the strategy shares each aggregation out among its updates (FedAvg normalizes the
    #: weights of a round), False if it mixes each update in as it comes (FedAsync).
    normalizes_weights: bool = False
    #: The strategy's round deadline in seconds if it runs synchronous rounds, None otherwise.
    round_deadline_s: Optional[float] = None

    @property
    def synchronous(self) -> bool:
        """True if the strategy runs rounds: ``Effects.round_size`` and ``expected_devices`` apply."""
        return self.round_deadline_s is not None


@dataclass(frozen=True)
class Effects:
    """What a plug-in decided at one hook, for the core to apply (nothing here is applied by the
    plug-in itself). The default decides nothing."""

    #: Commands for devices, published on their command topics.
    commands: Tuple[Addressed, ...] = ()
    #: Metrics events (each with an ``event`` key) for metrics.jsonl.
    events: Tuple[Dict[str, Any], ...] = ()
    #: A model to make the next version now, with nothing merged (a new session's start).
    switch_to: Optional[Dict[str, np.ndarray]] = None
    #: A synchronous strategy's round size from now on (None: unchanged).
    round_size: Optional[int] = None
    #: The devices a synchronous round should wait for (None: unchanged; empty: no one in
    #: particular, any device's update counts).
    expected_devices: Optional[FrozenSet[str]] = None


NOTHING = Effects()


@dataclass(frozen=True)
class Verdict(Effects):
    """A plug-in's decision on an admitted update: a factor on its share (the core multiplies the
    plug-ins' factors; 1.0 leaves the strategy's weighting), whether to keep it from the strategy
    (a plug-in that runs its own round, or fences another session's off), fields for the update's
    metrics record, and any ``Effects``."""

    weight: float = 1.0
    withhold: bool = False
    fields: Dict[str, Any] = field(default_factory=dict)


ACCEPT = Verdict()

#: A value of the fleet view: plain and JSON-able (a label, a flag, a count or a measure).
Scalar = Union[str, int, float, bool, None]


@dataclass(frozen=True)
class MethodState:
    """What a method shows an operator of a live fleet (the coordinator's fleet table, its
    dashboard, ``streamfl status`` and Prometheus): fleet-wide values, and each device's own.

    Keys are short column names (``flag``, ``period``, ``session``, ``saw_weight``); values are
    ``Scalar``. The view shows at most ``MAX_STATE_KEYS`` keys of each, so a method keeps to the
    few an operator acts on."""

    fleet: Dict[str, Scalar] = field(default_factory=dict)
    devices: Dict[str, Dict[str, Scalar]] = field(default_factory=dict)


#: Keys of ``MethodState.fleet`` and of each device's row the fleet view keeps per method.
MAX_STATE_KEYS = 8

NO_STATE = MethodState()


class CoordinatorPlugin(abc.ABC):
    """Hooks of one method on the coordinator, named by when they run; subclasses set ``name`` and
    ``Config``. Each hook returns what it decided (``Effects`` or ``Verdict``); the core applies it.

    Lifecycle, in order: ``on_start`` once the coordinator starts or resumes (after
    ``load_state``); then, as inputs come, ``on_device_report`` (a greeted device's telemetry
    carried typed reports), ``before_admission`` (the model an update trained from, where it is
    not a global version), ``on_update_admitted`` (an update passed admission: weigh, withhold,
    describe), ``on_model_made`` (a new global version), ``on_tick`` (about once a second),
    ``on_operator_command``; ``before_publish`` gives the extras of each global model sent, and
    ``describe`` what the fleet view shows of the method (both queries).
    """

    #: The registry name (also the key of its settings under ``plugins:`` in the YAML).
    name: ClassVar[str] = ""
    #: Frozen dataclass of the plug-in's settings (validated like every config).
    Config: ClassVar[Type[Any]]
    #: Names of plug-ins this one needs listed before it (their instances reach ``__init__``).
    requires: ClassVar[Tuple[str, ...]] = ()

    def __init__(self, config: Any, fleet: FleetView, peers: Mapping[str, "CoordinatorPlugin"]):
        self.config = config
        self.fleet = fleet

    @classmethod
    def check(cls, config: Any, strategy: str) -> None:
        """Raise ``ValueError`` if the plug-in cannot run under ``strategy``; called on config load."""

    # ---- lifecycle ----------------------------------------------------------------------------
    def on_start(self, now: float) -> Effects:
        """The coordinator starts, or resumes from its state folder (called after ``load_state``)."""
        return NOTHING

    def on_device_report(self, device_id: str, extras: Mapping[str, Extra], now: float) -> Effects:
        """A greeted device's telemetry carried typed reports (``extras``), e.g. its data's class
        distribution while it skips rounds; well-typed and bounded, not trusted beyond that."""
        return NOTHING

    def before_admission(self, update: Update) -> Optional[Dict[str, np.ndarray]]:
        """A query before an update is admitted: the model it trained from where that is not the
        global version it names (a model the method publishes beside the global one, which the
        update's extras say it trained), or None. Admission measures the update against it and
        an ``int8_delta`` update is added to it; the first plug-in to answer wins. Whatever the
        answer, the update still passes ``on_update_admitted``, where the method withholds it.
        The update's tensors are not yet checked for NaN/Inf here (admission does that, in its
        own pass over them): read its extras, which the decoder has checked."""
        return None

    def on_update_admitted(self, update: Update, now: float) -> Verdict:
        """An update passed admission (deduplicated, of the fleet's model, bounded), before the
        strategy sees it; every plug-in is asked, whatever the others decide."""
        return ACCEPT

    def on_model_made(self, aggregation: Aggregation) -> Effects:
        """A new global version was made (by the strategy, or by a plug-in's ``switch_to``)."""
        return NOTHING

    def on_tick(self, now: float) -> Effects:
        """Called at every tick of the runtime (about once a second)."""
        return NOTHING

    def on_operator_command(self, command: Command, now: float) -> Optional[Effects]:
        """An operator's command to the coordinator (e.g. ``new-session``): ``Effects`` if this
        plug-in handles its kind, None if not (a kind nobody handles is logged and ignored)."""
        return None

    def before_publish(self) -> List[Extra]:
        """Typed payloads for the global model about to be published (a query: no side effects)."""
        return []

    def describe(self, now: float) -> MethodState:
        """What an operator should see of this method now, fleet-wide and per device (a query: no
        side effects; called about once a second from the core's thread)."""
        return NO_STATE

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
