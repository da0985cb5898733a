"""The coordinator's decisions without any I/O: fed decoded messages and the time, it keeps the model.

``CoordinatorCore`` owns the device registry, the global model and its version counter T (+1 per
aggregation), a bounded history, duplicate suppression (an agent's outbox may resend an update),
and the aggregation strategy. The daemon (``server.py``) and the simulator drive the same object
(DESIGN.md section 2), always from one thread.
"""
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from streamfl.coordinator.clp import ClpProbe
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.fedcurv import CurvatureSums
from streamfl.coordinator.history import ModelHistory
from streamfl.coordinator.registry import DeviceRegistry
from streamfl.coordinator.strategies import AGGREGATED, STALE, Aggregator, make_strategy
from streamfl.protocol.messages import GlobalModel, Hello, Message, Offline, Telemetry, Tensors, Update

log = logging.getLogger(__name__)

COUNTER_NAMES = ("updates_received", "aggregated", "duplicates", "rejected", "stale_dropped",
                 "future_base", "hellos", "offlines", "telemetry", "ignored")

#: Outcomes of an update besides the strategy's (aggregated / buffered / stale).
DUPLICATE = "duplicate"
REJECTED = "rejected"

#: How many recent update ids go into state.json (the in-memory window may be larger).
PERSISTED_IDS = 1024


@dataclass
class UpdateRecord:
    """What happened to one received update: one ``update`` line of metrics.jsonl."""

    time_s: float
    device: str
    update_id: str
    base_version: int
    #: The global version after handling the update.
    version: int
    staleness: int
    loss: float
    num_samples: int
    #: True if this update produced a new global version.
    aggregated: bool
    #: aggregated | buffered | stale | duplicate | rejected
    outcome: str
    #: What the round cost on the device and the clock level of each of its domains.
    energy_j: Optional[float] = None
    clock_levels: Dict[str, int] = field(default_factory=dict)
    seconds_per_sample: Optional[float] = None
    fisher_trace: Optional[float] = None
    #: The CLP probe's state after this update (empty while the probe is off).
    clp: Dict[str, Any] = field(default_factory=dict)

    def as_event(self) -> Dict[str, Any]:
        return {"event": "update", "time_s": self.time_s, "device": self.device,
                "base_version": self.base_version, "version": self.version,
                "staleness": self.staleness, "loss": self.loss, "num_samples": self.num_samples,
                "aggregated": self.aggregated, "outcome": self.outcome,
                "energy_j": self.energy_j, "clock_levels": dict(self.clock_levels),
                "seconds_per_sample": self.seconds_per_sample, "fisher_trace": self.fisher_trace,
                "clp": dict(self.clp)}


def initial_model(config: CoordinatorConfig) -> Tensors:
    """The version-0 model: ``build_model(spec, seed=config.seed)`` as float32 arrays."""
    from streamfl.models import build_model, model_to_arrays
    return model_to_arrays(build_model(config.model, seed=config.seed))


class CoordinatorCore:
    """Registry + versioned global model + strategy; single-threaded, time passed in."""

    def __init__(self, config: CoordinatorConfig, strategy: Optional[Aggregator] = None, now: float = 0.0,
                 tensors: Optional[Tensors] = None):
        self.config = config
        self.arch_id = config.model.arch_id
        self.registry = DeviceRegistry()
        self.strategy = strategy if strategy is not None else make_strategy(config, self.registry.online)
        self.clp = ClpProbe(config.clp)
        self.curv = CurvatureSums(config.fedcurv)
        self.version = 0
        self._model: Tensors = tensors if tensors is not None else initial_model(config)
        self.history = ModelHistory(config.history_size)
        self.history.add(self.version, self._model, now)
        self.counters: Dict[str, int] = {name: 0 for name in COUNTER_NAMES}
        self._seen: "OrderedDict[str, None]" = OrderedDict()
        self._future_warned = set()

    # ---- inputs -------------------------------------------------------------------------------
    def on_message(self, msg: Message, now: float) -> Optional[UpdateRecord]:
        """Handle one decoded message; an ``UpdateRecord`` for updates, else None."""
        if isinstance(msg, Update):
            return self.on_update(msg, now)
        if isinstance(msg, Hello):
            self.counters["hellos"] += 1
            if msg.arch_id != self.arch_id:
                log.warning("device %s runs model %s, the fleet runs %s: its updates will be rejected",
                            msg.device_id, msg.arch_id, self.arch_id)
            self.registry.on_hello(msg, now)
        elif isinstance(msg, Offline):
            self.counters["offlines"] += 1
            self.registry.on_offline(msg, now)
        elif isinstance(msg, Telemetry):
            self.counters["telemetry"] += 1
            self.registry.seen(msg.device_id, now)
        else:
            self.counters["ignored"] += 1
            log.debug("ignoring %s message", type(msg).__name__)
        return None

    def on_update(self, update: Update, now: float) -> UpdateRecord:
        """Dedup, check, hand to the strategy; bump the version if it aggregated."""
        self.counters["updates_received"] += 1
        info = self.registry.seen(update.device_id, now)
        staleness = self.version - update.base_version
        if update.update_id in self._seen:
            self.counters["duplicates"] += 1
            log.debug("duplicate update %s from %s dropped", update.update_id, update.device_id)
            return self._record(update, now, max(0, staleness), False, DUPLICATE)
        self._remember(update.update_id)
        if update.arch_id != self.arch_id or set(update.tensors) != set(self._model):
            self.counters["rejected"] += 1
            log.warning("rejected update %s from %s: model %s does not match the fleet's %s",
                        update.update_id, update.device_id, update.arch_id, self.arch_id)
            return self._record(update, now, max(0, staleness), False, REJECTED)
        if staleness < 0:
            self.counters["future_base"] += 1
            if update.device_id not in self._future_warned:
                self._future_warned.add(update.device_id)
                log.warning("update from %s trained from version %d, newer than ours (%d): the "
                            "coordinator lost its state? treating it as staleness 0",
                            update.device_id, update.base_version, self.version)
            staleness = 0
        info.updates += 1
        if self.config.fedcurv.enabled:
            self.curv.on_update(update)
        new = self.strategy.on_update(self._model, self.version, update, now)
        outcome = self.strategy.last_outcome
        if outcome == STALE:
            self.counters["stale_dropped"] += 1
        if new is not None:
            self._install(new, now)
            outcome = AGGREGATED
        return self._record(update, now, staleness, new is not None, outcome)

    def _probe_clp(self) -> None:
        """Feed AdaCLP's probe (eq. 2-3) with what the aggregation that made ``version`` merged:
        its base version and sample-weighted Fisher trace (one update under FedAsync, a round
        under FedAvg)."""
        merged = [u for u in self.strategy.last_aggregated if u.fisher_trace is not None]
        base = min((u.base_version for u in self.strategy.last_aggregated), default=self.version - 1)
        trace = None
        if merged:
            weights = [max(1, u.num_samples) for u in merged]
            trace = sum(w * float(u.fisher_trace) for w, u in zip(weights, merged)) / sum(weights)
        self.clp.on_aggregation(self.version, base, trace)
        self.strategy.on_clp(bool(self.clp.current().in_clp))

    def tick(self, now: float) -> bool:
        """Drive time-based strategy decisions (FedAvg deadline); True if a new version was made."""
        new = self.strategy.on_tick(self._model, self.version, now)
        if new is None:
            return False
        self._install(new, now)
        return True

    # ---- outputs ------------------------------------------------------------------------------
    def global_model(self) -> GlobalModel:
        """The current global model message (tensors are shared, never mutated afterwards)."""
        return GlobalModel(version=self.version, arch_id=self.arch_id, tensors=self._model,
                           hparams=self.config.hparams.as_dict(), clp=self.clp_state(),
                           ewc=self.curv.ewc_terms())

    def clp_state(self) -> Dict[str, Any]:
        """What every global model carries of the CLP probe; empty while it is off."""
        if not self.config.clp.enabled:
            return {}
        state = self.clp.current().as_dict()
        if not self.config.clp.refine_hparams:
            state["regulating"] = False   # the flag is broadcast, devices keep the coordinator's hparams
        return state

    @property
    def model(self) -> Tensors:
        return self._model

    def online(self) -> List[str]:
        return self.registry.online()

    def devices(self):
        return self.registry.devices()

    # ---- persistence --------------------------------------------------------------------------
    def state(self) -> Dict[str, Any]:
        """JSON-able state for ``state.json`` (the tensors go to model.safetensors separately)."""
        return {"version": self.version, "arch_id": self.arch_id,
                "history_versions": self.history.versions(), "strategy": self.strategy.name,
                "strategy_state": self.strategy.state(), "clp": self.clp.state(),
                "recent_update_ids": list(self._seen)[-PERSISTED_IDS:],
                "counters": dict(self.counters)}

    def restore(self, tensors: Tensors, state: Dict[str, Any], now: float) -> None:
        """Continue from a saved state: same version, same model, same counters."""
        self.version = int(state["version"])
        self._model = tensors
        self.history = ModelHistory(self.config.history_size)
        self.history.add(self.version, tensors, now)
        if state.get("strategy") == self.strategy.name:
            self.strategy.load_state(dict(state.get("strategy_state") or {}))
        if state.get("clp"):
            self.clp.load_state(state["clp"])
        for key, value in (state.get("counters") or {}).items():
            if key in self.counters:
                self.counters[key] = int(value)
        self._seen.clear()
        for update_id in state.get("recent_update_ids") or []:
            self._remember(str(update_id))

    # ---- internals ----------------------------------------------------------------------------
    def _install(self, tensors: Tensors, now: float) -> None:
        self.version += 1
        self._model = tensors
        self.history.add(self.version, tensors, now)
        self.counters["aggregated"] += 1
        if self.config.clp.enabled:
            self._probe_clp()

    def _remember(self, update_id: str) -> None:
        self._seen[update_id] = None
        while len(self._seen) > self.config.dedup_window:
            self._seen.popitem(last=False)

    def _record(self, update: Update, now: float, staleness: int, aggregated: bool,
                outcome: str) -> UpdateRecord:
        return UpdateRecord(time_s=now, device=update.device_id, update_id=update.update_id,
                            base_version=update.base_version, version=self.version,
                            staleness=staleness, loss=float(update.loss),
                            num_samples=int(update.num_samples), aggregated=aggregated, outcome=outcome,
                            energy_j=update.energy_j, clock_levels=dict(update.clock_levels),
                            seconds_per_sample=float(update.seconds_per_sample),
                            fisher_trace=update.fisher_trace, clp=self.clp_state())
