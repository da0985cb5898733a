"""The coordinator's decisions without any I/O: fed decoded messages and the time, it keeps the model.

``CoordinatorCore`` owns the device registry, the global model and its version counter T (+1 per
aggregation), a bounded history, duplicate suppression (an agent's outbox may resend an update),
the aggregation strategy and the methods' plug-ins (``streamfl.coordinator.plugins``), which it
calls but never names. Every input returns a ``Step`` saying what it did: the new version and what
it merged, the commands to send, the records to log. The daemon (``server.py``) and the simulator
drive the same object, always from one thread, and only do the I/O a ``Step`` asks for.
"""
import itertools
import logging
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from streamfl.coordinator.admission import UpdateAdmission
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.deltas import full_update
from streamfl.coordinator.history import ModelHistory
from streamfl.coordinator.persistence import PLUGIN_TENSORS, read_initial_model
from streamfl.coordinator.plugins import Addressed, Aggregation, CoordinatorPlugin, FleetView, make_plugins
from streamfl.coordinator.plugins.base import Effects, Verdict
from streamfl.coordinator.registry import DeviceRegistry
from streamfl.coordinator.strategies import STALE, Aggregator, make_strategy, staleness_of
from streamfl.logs import RateLimitedLog
from streamfl.protocol.messages import Command, GlobalModel, Hello, Message, Offline, Telemetry, Tensors, Update

log = logging.getLogger(__name__)

COUNTER_NAMES = ("updates_received", "aggregated", "duplicates", "rejected", "stale_dropped",
                 "future_base", "hellos", "offlines", "telemetry", "ignored", "withheld", "switches",
                 "operator_commands", "duplicate_device_id")

#: Outcomes of an update besides the strategy's (aggregated / buffered / stale).
DUPLICATE = "duplicate"
REJECTED = "rejected"
#: A plug-in kept the update from the strategy (it runs its own round, or fences off updates
#: trained from a model it replaced).
WITHHELD = "withheld"

#: A device whose rounds keep diverging is reported at most this often (seconds).
DIVERGENCE_LOG_S = 600.0
#: A device id two agent processes share is reported (ERROR) at most this often per device
#: (seconds); every occurrence is counted and recorded in metrics.jsonl regardless.
DUPLICATE_ID_LOG_S = 600.0

#: How many recent update ids go into state.json (the in-memory window may be larger).
PERSISTED_IDS = 1024
#: Versions whose making times a saved state keeps (a float each in state.json): the rate limit
#: asks when the base of a board's backlog was made; 1000 versions cover an outage of about an
#: hour of a 30-board fleet at one update per board every two minutes, and a base older than that
#: counts as made at the restart (its backlog beyond the burst is dropped as rejected_rate).
SAVED_VERSION_TIMES = 1000


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
    #: aggregated | buffered | stale | duplicate | rejected | withheld
    outcome: str
    #: What the round cost on the device and the clock level of each of its domains.
    energy_j: Optional[float] = None
    clock_levels: Dict[str, int] = field(default_factory=dict)
    seconds_per_sample: Optional[float] = None
    #: Fields the plug-ins add (``CoordinatorPlugin.record_fields``).
    fields: Dict[str, Any] = field(default_factory=dict)

    def as_event(self) -> Dict[str, Any]:
        event = {"event": "update", "time_s": self.time_s, "device": self.device,
                 "update_id": self.update_id, "base_version": self.base_version, "version": self.version,
                 "staleness": self.staleness, "loss": self.loss, "num_samples": self.num_samples,
                 "aggregated": self.aggregated, "outcome": self.outcome,
                 "energy_j": self.energy_j, "clock_levels": dict(self.clock_levels),
                 "seconds_per_sample": self.seconds_per_sample}
        event.update(self.fields)
        return event


@dataclass
class Step:
    """What one input made the core do; the runtime publishes, sends and logs accordingly."""

    #: The new global versions made, oldest first (at most one today), with what each merged.
    aggregations: List[Aggregation] = field(default_factory=list)
    #: Commands the plug-ins addressed to devices, to publish on their command topics.
    commands: List[Addressed] = field(default_factory=list)
    #: The update's record, for an update.
    update: Optional[UpdateRecord] = None
    #: The plug-ins' metrics events for the aggregations (each with an ``event`` key).
    events: List[Dict[str, Any]] = field(default_factory=list)
    #: For an operator's command: the plug-ins that handled it (empty: nobody did).
    handled_by: Optional[List[str]] = None

    @property
    def new_version(self) -> Optional[int]:
        """The newest version this step made, None if none."""
        return self.aggregations[-1].version if self.aggregations else None

    def records(self) -> List[Dict[str, Any]]:
        """Every metrics line of this step, the update's first."""
        return ([self.update.as_event()] if self.update is not None else []) + list(self.events)


def initial_model(config: CoordinatorConfig) -> Tensors:
    """The version-0 model as float32 arrays: ``config.initial_model_file``'s tensors, checked
    against ``config.model`` (ConfigError naming the file otherwise), or else
    ``build_model(spec, seed=config.seed)``."""
    from streamfl.models import build_model, model_to_arrays
    if config.initial_model_file is None:
        return model_to_arrays(build_model(config.model, seed=config.seed))
    return read_initial_model(Path(config.initial_model_file), config.model)



class CoordinatorCore:
    """Registry + versioned global model + strategy + plug-ins; single-threaded, time passed in."""

    def __init__(self, config: CoordinatorConfig, strategy: Optional[Aggregator] = None, now: float = 0.0,
                 tensors: Optional[Tensors] = None, run_id: str = ""):
        self.config = config
        #: The identity of this coordinator's state folder, named in every global model ("" in
        #: the simulator): agents compare versions only within one run.
        self.run_id = run_id
        self.arch_id = config.model.arch_id
        self.num_classes = config.model.num_classes
        self.registry = DeviceRegistry()
        self.strategy = strategy if strategy is not None else make_strategy(config, self.registry.online_ids)
        self.plugins = make_plugins(config.plugins, FleetView(
            self.registry.online, self.num_classes, lambda: self._model, self._last_seen_s,
            strategy=self.strategy.name, normalizes_weights=self.strategy.normalizes_weights,
            round_deadline_s=getattr(self.strategy, "deadline_s", None) if self.strategy.runs_rounds else None))
        self.version = 0
        self._model: Tensors = tensors if tensors is not None else initial_model(config)
        self.history = ModelHistory(config.history_size)
        self.history.add(self.version, self._model, now)
        self.counters: Dict[str, int] = {name: 0 for name in COUNTER_NAMES}
        #: Bounds every update before a plug-in or the strategy sees it.
        self.admission = UpdateAdmission(config.admission)
        self._seen: "OrderedDict[str, None]" = OrderedDict()
        self._future_warned = set()
        #: Each greeted device's diverged-round count from its telemetry.
        self._diverged: Dict[str, int] = {}
        self._divergence_log = RateLimitedLog(log, DIVERGENCE_LOG_S)
        #: device -> (the time its duplicate id was last logged, occurrences held back since).
        self._duplicate_logged: Dict[str, Tuple[float, int]] = {}
        #: What the plug-ins decided while the current input is handled, per plug-in, in order.
        self._decided: Dict[str, List[Effects]] = {}
        self._start_plugins(now)

    # ---- inputs -------------------------------------------------------------------------------
    def on_message(self, msg: Message, now: float) -> Step:
        """Handle one decoded message."""
        if isinstance(msg, Update):
            return self.on_update(msg, now)
        step = Step()
        if isinstance(msg, Hello):
            self.counters["hellos"] += 1
            if msg.arch_id != self.arch_id:
                log.warning("device %s runs model %s, the fleet runs %s: its updates will be rejected",
                            msg.device_id, msg.arch_id, self.arch_id)
            if self.registry.on_hello(msg, now):
                step.events.append(self._duplicate_id(msg.device_id, now))
        elif isinstance(msg, Offline):
            self.counters["offlines"] += 1
            self.registry.on_offline(msg, now)
        elif isinstance(msg, Telemetry):
            self.counters["telemetry"] += 1
            if self.registry.greeted(msg.device_id):
                self.registry.seen(msg.device_id, now)
                self._note_divergence(msg)
                if msg.extras:  # only greeted devices' reports reach the methods
                    for plugin in self.plugins:
                        self._apply(plugin, plugin.on_device_report(msg.device_id, msg.extras, now))
        else:
            self.counters["ignored"] += 1
            log.debug("ignoring %s message", type(msg).__name__)
        return self._step(step, now)

    def _duplicate_id(self, device_id: str, now: float) -> Dict[str, Any]:
        """A second agent process under ``device_id`` (``DeviceRegistry.on_hello``): counted,
        logged at most every ``DUPLICATE_ID_LOG_S`` per device, and its metrics event."""
        self.counters["duplicate_device_id"] += 1
        info = self.registry.get(device_id)
        count = info.duplicate_id if info is not None else 0
        instances = info.duplicate_id_instances if info is not None else 0
        last, held = self._duplicate_logged.get(device_id, (None, 0))
        if last is not None and now - last < DUPLICATE_ID_LOG_S:
            self._duplicate_logged[device_id] = (last, held + 1)
        else:
            self._duplicate_logged[device_id] = (now, 0)
            log.error("device id %s is used by %d agent processes (their Hellos alternate: %d "
                      "returns to an earlier process so far%s): two boards share it, probably flashed from one image "
                      "(the hostname is the default id). They take the broker connection from "
                      "each other, so both lose rounds and their updates mix under one name; give "
                      "each board its own device_id (and broker account)", device_id,
                      max(2, instances), count,
                      ", %d not logged" % held if held else "")
        return {"event": "duplicate_device_id", "time_s": now, "device": device_id,
                "count": count, "instances": max(2, instances)}

    def on_update(self, update: Update, now: float) -> Step:
        """Dedup, check, admit, show the plug-ins, hand to the strategy; a new version if it aggregated."""
        self.counters["updates_received"] += 1
        staleness = staleness_of(self.version, update.base_version)
        step = Step()
        greeted = self.registry.greeted(update.device_id)
        if not self.admission.known(update.device_id, greeted):
            return self._reject(update, now, staleness, self.admission.check(update, self._model, greeted, now))
        info = self.registry.seen(update.device_id, now)
        if update.update_id in self._seen:
            self.counters["duplicates"] += 1
            log.debug("duplicate update %s from %s dropped", update.update_id, update.device_id)
            step.update = self._record(update, now, staleness, False, DUPLICATE)
            return self._step(step, now)
        self._remember(update.update_id)
        trained_from = self._trained_from(update)  # a model a plug-in publishes beside the global one
        update, refused = full_update(update, self.history, trained_from)  # int8_delta: base + delta
        if refused is not None:
            return self._reject(update, now, staleness, refused)
        if update.arch_id != self.arch_id or set(update.tensors) != set(self._model):
            self.counters["rejected"] += 1
            log.warning("rejected update %s from %s: model %s does not match the fleet's %s",
                        update.update_id, update.device_id, update.arch_id, self.arch_id)
            step.update = self._record(update, now, staleness, False, REJECTED, reason="wrong_arch")
            return self._step(step, now)
        if any(not 0 <= c < self.num_classes for c in update.class_counts):
            # Plug-ins weigh updates by their classes: an id the model cannot output is a forgery.
            self.counters["rejected"] += 1
            log.warning("rejected update %s from %s: class counts name classes outside 0..%d",
                        update.update_id, update.device_id, self.num_classes - 1)
            step.update = self._record(update, now, staleness, False, REJECTED, reason="classes")
            return self._step(step, now)
        if trained_from is None:
            base = self.history.get(update.base_version)
            trained_from = base.tensors if base is not None else self._model
        verdict = self.admission.check(update, trained_from, greeted,
                                        now, fleet_size=self.registry.online_count(),
                                        base_made_s=self.history.made_s(update.base_version))
        if verdict.update is None:
            return self._reject(update, now, staleness, verdict)
        update = verdict.update
        if update.base_version > self.version:
            self.counters["future_base"] += 1
            if update.device_id not in self._future_warned:
                self._future_warned.add(update.device_id)
                log.warning("update from %s trained from version %d, newer than ours (%d): the "
                            "coordinator lost its state? treating it as staleness 0",
                            update.device_id, update.base_version, self.version)
        info.updates += 1
        verdicts: List[Verdict] = []
        for plugin in self.plugins:  # every plug-in is asked, whatever the others decide
            verdict_of = plugin.on_update_admitted(update, now)
            self._apply(plugin, verdict_of)
            verdicts.append(verdict_of)
        fields: Dict[str, Any] = {}
        for verdict_of in verdicts:
            fields.update(verdict_of.fields)
        if any(v.withhold for v in verdicts):
            self.counters["withheld"] += 1
            step.update = self._record(update, now, staleness, False, WITHHELD, fields=fields)
            return self._step(step, now)
        weight = 1.0
        for plugin, verdict_of in zip(self.plugins, verdicts):
            factor = verdict_of.weight
            if not (math.isfinite(factor) and factor >= 0.0):
                raise ValueError("plug-in %s gave update %s the weight factor %r (must be finite, >= 0)"
                                 % (plugin.name, update.update_id, factor))
            weight *= factor
        if not self.strategy.normalizes_weights:
            # A strategy that mixes each update in as it comes (FedAsync) would let a factor above
            # 1 push one update's weight to 1, replacing the model: a method may lower an
            # update's share there, never raise it above the strategy's own. (FedAvg shares a
            # round out among its updates, where the plug-ins' caps bound each share.)
            weight = min(weight, 1.0)
        outcome = self.strategy.on_update(self._model, self.version, update, now, weight=weight)
        if outcome.kind == STALE:
            self.counters["stale_dropped"] += 1
        if outcome.model is not None:
            self._install(outcome.model, now, step, merged=outcome.merged, mixing_weight=outcome.mixing_weight)
        step.update = self._record(update, now, staleness, outcome.model is not None, outcome.kind,
                                   clipped=verdict.clipped, delta_norm=verdict.delta_norm, fields=fields)
        return self._step(step, now)

    def _trained_from(self, update: Update) -> Optional[Tensors]:
        """The model a plug-in says ``update`` trained from (``before_admission``), None for the
        global version it names; checked like an update's tensors: the fleet's names and shapes."""
        for plugin in self.plugins:
            model = plugin.before_admission(update)
            if model is None:
                continue
            if set(model) != set(self._model) or any(
                    np.shape(model[k]) != np.shape(v) for k, v in self._model.items()):
                raise ValueError("plug-in %s named a base for update %s that is not a model of the "
                                 "fleet's architecture" % (plugin.name, update.update_id))
            return model
        return None

    def _reject(self, update: Update, now: float, staleness: int, verdict) -> Step:
        self.counters["rejected"] += 1
        step = Step(update=self._record(update, now, staleness, False, REJECTED, reason=verdict.reason,
                                        delta_norm=verdict.delta_norm))
        return self._step(step, now)

    def on_operator(self, command: Command, now: float) -> Step:
        """An operator's command to the coordinator (its own command topic): the plug-ins act on
        the kinds they know; the step names them (``handled_by``, empty for a kind nobody knows,
        which is logged; the server answers the operator either way)."""
        self.counters["operator_commands"] += 1
        handled = []
        for plugin in self.plugins:
            effects = plugin.on_operator_command(command, now)
            if effects is not None:
                handled.append(plugin.name)
                self._apply(plugin, effects)
        if handled:
            log.info("operator command %r handled by %s", command.kind, ", ".join(handled))
        else:
            log.warning("operator command %r ignored: no running plug-in handles it", command.kind)
        return self._step(Step(handled_by=handled), now)

    def tick(self, now: float) -> Step:
        """Drive time-based decisions (FedAvg's deadline, plug-ins' timers)."""
        step = Step()
        outcome = self.strategy.on_tick(self._model, self.version, now)
        if outcome is not None and outcome.model is not None:
            self._install(outcome.model, now, step, merged=outcome.merged, mixing_weight=outcome.mixing_weight)
        for plugin in self.plugins:
            self._apply(plugin, plugin.on_tick(now))
        return self._step(step, now)

    # ---- outputs ------------------------------------------------------------------------------
    def global_model(self) -> GlobalModel:
        """The current global model message (tensors are shared, never mutated afterwards)."""
        extras = {}
        for plugin in self.plugins:
            for extra in plugin.before_publish():
                extras[extra.KIND] = extra
        if self.config.method_settings is not None:  # the named method's agent side
            extras[self.config.method_settings.KIND] = self.config.method_settings
        return GlobalModel(version=self.version, arch_id=self.arch_id, tensors=self._model,
                           hparams=self.config.hparams.as_dict(self.version), extras=extras, run_id=self.run_id)

    @property
    def model(self) -> Tensors:
        return self._model

    def online(self) -> List[str]:
        return self.registry.online()

    def plugin(self, name: str) -> Optional[CoordinatorPlugin]:
        """The running plug-in called ``name``, None if the config does not list it."""
        return next((p for p in self.plugins if p.name == name), None)

    def devices(self):
        return self.registry.devices()

    def _note_divergence(self, msg: Telemetry) -> None:
        """Say when a device reports rounds that diverged (it sends no update for them), with the
        cause it gives: once when it starts, then at most every ``DIVERGENCE_LOG_S`` per device."""
        before = self._diverged.get(msg.device_id, 0)
        self._diverged[msg.device_id] = msg.diverged_rounds
        if msg.diverged_rounds > before and msg.divergence:
            self._divergence_log.event(msg.device_id, logging.WARNING,
                                       "device %s: %d rounds diverged (none sent); cause: %.300s",
                                       msg.device_id, msg.diverged_rounds, msg.divergence)

    def _last_seen_s(self, device_id: str) -> Optional[float]:
        info = self.registry.get(device_id)
        return None if info is None else info.last_seen_s

    # ---- persistence --------------------------------------------------------------------------
    def state(self) -> Dict[str, Any]:
        """State for the state directory: JSON-able but for ``PLUGIN_TENSORS`` (the plug-ins'
        arrays, by reference, for plugins.safetensors; the model goes to model.safetensors)."""
        plugins, arrays = {}, {}
        for plugin in self.plugins:
            saved = plugin.state()
            if saved is not None:
                plugins[plugin.name] = saved
            tensors = plugin.state_tensors()
            if tensors:
                arrays[plugin.name] = tensors
        return {"version": self.version, "arch_id": self.arch_id,
                "history_versions": self.history.versions(), "strategy": self.strategy.name,
                "strategy_state": self.strategy.state(), "plugins": plugins,
                "recent_update_ids": self._recent_ids(),
                "counters": dict(self.counters), "run_id": self.run_id,
                "known_devices": self.registry.greeted_ids(), "admission": self.admission.state(),
                "version_times": self._version_times(), PLUGIN_TENSORS: arrays}

    def _version_times(self) -> Dict[str, Any]:
        """When the last ``SAVED_VERSION_TIMES`` versions were made, relative to the newest, so a
        restarted coordinator's rate limit still knows how old the base of a board's backlog is."""
        newest = self.history.made_s(self.version)
        return {} if newest is None else self.history.times_since(newest, SAVED_VERSION_TIMES)

    def restore(self, tensors: Tensors, state: Dict[str, Any], now: float,
                saved_ago_s: float = 0.0) -> None:
        """Continue from a saved state: same version, same model, same counters, same plug-ins.
        ``saved_ago_s``: how long ago the state was saved (the runtime's wall clock): the saved
        version counts as made that long before ``now``, so the backlog boards trained from it
        while the coordinator was down has that time to pay with in the rate limit (counted as
        made ``now``, half of a restart's backlog was dropped as ``rejected_rate``)."""
        self.version = int(state["version"])
        self._model = tensors
        self.history = ModelHistory(self.config.history_size)
        made = now - max(0.0, float(saved_ago_s))
        self.history.seed_times(state.get("version_times"), made, below=self.version)
        self.history.add(self.version, tensors, made)
        if state.get("strategy") == self.strategy.name:
            self.strategy.load_state(dict(state.get("strategy_state") or {}))
        saved = state.get("plugins") or {}
        arrays = state.get(PLUGIN_TENSORS) or {}
        for plugin in self.plugins:
            if isinstance(saved.get(plugin.name), dict):
                plugin.load_state(saved[plugin.name])
            if arrays.get(plugin.name):
                try:
                    plugin.load_state_tensors(arrays[plugin.name])
                except ValueError as exc:
                    log.error("%s: saved arrays ignored (%s); it starts without them", plugin.name, exc)
        for key, value in (state.get("counters") or {}).items():
            if key in self.counters:
                self.counters[key] = int(value)
        self._seen.clear()
        for update_id in state.get("recent_update_ids") or []:
            self._remember(str(update_id))
        self.registry.restore_greeted(state.get("known_devices") or [])
        if isinstance(state.get("admission"), dict):
            self.admission.load_state(state["admission"])
        if isinstance(state.get("run_id"), str):
            self.run_id = state["run_id"]
        self._start_plugins(now)

    # ---- internals ----------------------------------------------------------------------------
    def _install(self, tensors: Tensors, now: float, step: Step, switched_by: str = "",
                 merged: Tuple[Update, ...] = (), mixing_weight: Optional[float] = None) -> None:
        """Make ``tensors`` the next version: the strategy's aggregation (``switched_by`` empty:
        of ``merged``, one update's share ``mixing_weight`` where it mixes one in) or the model a
        plug-in switched to (nothing merged)."""
        self.version += 1
        self._model = tensors
        self.history.add(self.version, tensors, now)
        self.counters["switches" if switched_by else "aggregated"] += 1
        if switched_by:
            aggregation = Aggregation(self.version, (), now, switched_by=switched_by)
        else:
            aggregation = Aggregation(self.version, tuple(merged), now,
                                      mixing_weight=None if mixing_weight is None else float(mixing_weight))
        made = []
        for plugin in self.plugins:
            effects = plugin.on_model_made(aggregation)
            self._apply(plugin, effects, events=False)
            made.append(effects)
        for effects in made:
            step.events.extend(effects.events)
        step.aggregations.append(aggregation)

    def _apply(self, plugin: CoordinatorPlugin, effects: Effects, events: bool = True) -> None:
        """Keep what ``plugin`` decided for the end of this input, and set the strategy's round
        as it asks (before the strategy sees anything else)."""
        if not isinstance(effects, Effects):
            raise TypeError("plug-in %s returned %r instead of Effects" % (plugin.name, effects))
        if effects.round_size is not None:
            self.strategy.set_round_size(effects.round_size)
        if effects.expected_devices is not None:
            self.strategy.expect(effects.expected_devices or None)
        if not events and effects.events:
            effects = Effects(commands=effects.commands, switch_to=effects.switch_to)
        if effects.commands or effects.events or effects.switch_to is not None:
            self._decided.setdefault(plugin.name, []).append(effects)

    def _start_plugins(self, now: float) -> None:
        """Tell the plug-ins the coordinator (re)starts; what they decide applies at the next input."""
        for plugin in self.plugins:
            self._apply(plugin, plugin.on_start(now))

    def _step(self, step: Step, now: float) -> Step:
        """Put in place a model a plug-in switched to, and collect the commands and events the
        plug-ins decided while handling this input (each plug-in's in order, plug-ins in calling
        order)."""
        for plugin in self.plugins:
            for effects in list(self._decided.get(plugin.name, ())):
                tensors = effects.switch_to
                if tensors is None:
                    continue
                if {n: a.shape for n, a in tensors.items()} != {n: a.shape for n, a in self._model.items()}:
                    raise ValueError("plug-in %s switched to a model of other tensors" % plugin.name)
                self._install(tensors, now, step, switched_by=plugin.name)
        decided, self._decided = self._decided, {}
        for plugin in self.plugins:
            for effects in decided.get(plugin.name, ()):
                step.commands.extend(effects.commands)
        for plugin in self.plugins:
            for effects in decided.get(plugin.name, ()):
                step.events.extend(effects.events)
        return step

    def _recent_ids(self) -> List[str]:
        """The newest ``PERSISTED_IDS`` ids of the dedup window, oldest first, without listing the
        whole window (4096 by default) at every snapshot."""
        newest = list(itertools.islice(reversed(self._seen), PERSISTED_IDS))
        newest.reverse()
        return newest

    def _remember(self, update_id: str) -> None:
        self._seen[update_id] = None
        while len(self._seen) > self.config.dedup_window:
            self._seen.popitem(last=False)

    def _record(self, update: Update, now: float, staleness: int, aggregated: bool,
                outcome: str, reason: str = "", clipped: bool = False,
                delta_norm: Optional[float] = None, fields: Optional[Dict[str, Any]] = None) -> UpdateRecord:
        plugin_fields, fields = fields or {}, {}
        if reason:
            fields["reason"] = reason
        if clipped:
            fields["clipped"] = True
        if delta_norm is not None:
            fields["delta_norm"] = round(delta_norm, 6)
        fields.update(plugin_fields)
        return UpdateRecord(time_s=now, device=update.device_id, update_id=update.update_id,
                            base_version=update.base_version, version=self.version,
                            staleness=staleness, loss=float(update.loss),
                            num_samples=int(update.num_samples), aggregated=aggregated, outcome=outcome,
                            energy_j=update.energy_j, clock_levels=dict(update.clock_levels),
                            seconds_per_sample=float(update.seconds_per_sample), fields=fields)
