"""The methods' plug-ins on one device: which are active under the newest global model, and what
they decide together, so the agent core asks one object and calls no plug-in's hook itself.

A plug-in is active while the newest accepted global model carries an extra of one of its
``activated_by`` kinds (none: always); an active one that a model leaves dormant is replaced at
once by a fresh instance, built and bound as at start, so no state of a method's run survives to
its next. Every hook goes to the active plug-ins in calling order, each asked whatever the others
answer.

The plug-ins' settings and the clock policy are the board's own, or what the coordinator's named
method sets under the newest global model (``streamfl.agent.method_settings``): a plug-in whose
settings change is replaced by a fresh instance with the new ones (logged once, old -> new), and
a changed clock policy is handed to the core (``ModelDecisions.clock_policy``).

When a plug-in replaces a hyper-parameter it was handed (the coordinator's, or the board's own
before any model), that is logged once, ``old -> new``, naming the plug-in: again only when the
value it replaces changes, or after the plug-in went dormant, never per round (a plug-in such as
AdaCLP's eq. 4 moves the rate every model).
"""
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
from torch import nn

from streamfl.agent.buffer_policies import ReplacementPolicy
from streamfl.agent.method_settings import BoardSettings, MethodSettingsGate, describe_change
from streamfl.agent.plugins import AgentPlugin, Penalty, ReportContext, RoundContext, make_plugin, make_plugins
from streamfl.dvfs.config import DvfsConfig
from streamfl.dvfs.policies.base import DvfsPolicy
from streamfl.dvfs.policies.factory import make_policy
from streamfl.errors import ProtocolError
from streamfl.logs import RateLimitedLog
from streamfl.protocol.extras import Extra, check_bounds
from streamfl.protocol.messages import GlobalModel
from streamfl.sensors.window import Window

log = logging.getLogger(__name__)

#: Seconds between two warnings that a plug-in's extra was left out of a message because a value
#: of it lay outside the bounds its kind declares (the rest go to DEBUG and are counted in the
#: next). The coordinator's decoder refuses a whole message that carries such a value, so sending
#: it would lose the update with it: an honest device whose training blew up (FedCurv's Fisher
#: diagonal at lr 0.4 reached 1.4e5 against the declared 1e4) lost every update that way. A
#: method's coordinator side already goes on without an extra (older agents send none).
OUT_OF_BOUNDS_WARN_INTERVAL_S = 60.0

#: Not a value (a hyper-parameter's replaced value may be anything else).
_NOTHING = object()


@dataclass(frozen=True)
class ModelDecisions:
    """What the active plug-ins decided together on a global model: the round's hyper-parameters
    (each plug-in refining the previous one's), whether to empty the buffer (any), and the buffer
    policy to use (the first one named; None: the configured one); and the clock policy to use
    from now on where the settings in force changed it (None: keep the one in use)."""

    hparams: Dict[str, float]
    forget_windows: bool
    buffer_policy: Optional[ReplacementPolicy]
    clock_policy: Optional[DvfsPolicy] = None


class DevicePlugins:
    """Every registered method's device plug-in, in calling order, and which of them are active."""

    def __init__(self, configs: Mapping[str, Any], seed: int, num_classes: int,
                 dvfs: Optional[DvfsConfig] = None):
        self._seed, self._num_classes = seed, num_classes
        #: The settings of the newest model's method laid over the board's own (``configs``,
        #: ``dvfs``; None: this runtime sets no clocks).
        self.settings_gate = MethodSettingsGate(configs, dvfs)
        #: The plug-in settings in force (a dormant plug-in restarts with these).
        self._configs: Dict[str, Any] = dict(self.settings_gate.own.plugins)
        #: The clock config in force.
        self._dvfs = dvfs
        #: Every registered plug-in, active or dormant, in calling order.
        self.plugins: List[AgentPlugin] = make_plugins(self._configs, seed, num_classes)
        #: Names of the plug-ins called now: those the newest global model activates, and those
        #: with no ``activated_by`` (always active).
        self._active = {plugin.name for plugin in self.plugins if not plugin.activated_by}
        #: Each active plug-in's critical-period answer to the newest global model.
        self._critical: Dict[str, bool] = {}
        #: ``(plug-in, hyper-parameter)`` -> the value it replaced when that was last logged.
        self._replaced: Dict[Tuple[str, str], Any] = {}
        #: Extras left out of messages for a value outside their declared bounds, by kind.
        self.out_of_bounds: Counter = Counter()
        self._bounds_log = RateLimitedLog(log, OUT_OF_BOUNDS_WARN_INTERVAL_S)

    @property
    def active(self) -> List[AgentPlugin]:
        """The plug-ins whose hooks are called now, in calling order."""
        return [plugin for plugin in self.plugins if plugin.name in self._active]

    def get(self, name: str) -> Optional[AgentPlugin]:
        """The plug-in called ``name`` (active or dormant), None if there is none."""
        return next((p for p in self.plugins if p.name == name), None)

    @property
    def critical_period(self) -> bool:
        """True while an active plug-in said, on the newest global model, that the learning is in
        a critical period."""
        return any(self._critical.values())

    def model_received(self, gm: GlobalModel, hparams: Mapping[str, float]) -> ModelDecisions:
        """Take the settings in force under ``gm`` (its method's or the board's own), activate the
        plug-ins it asks for (starting afresh those it leaves dormant) and collect their
        decisions on it."""
        settings = self.settings_gate.resolve(gm)
        self._use_plugin_settings(settings, gm.version)
        clock_policy = self._use_clocks(settings, gm.version)
        active = self._activated_by(gm)
        refined = dict(hparams)
        forget = False
        lent: Optional[ReplacementPolicy] = None
        critical: Dict[str, bool] = {}
        for plugin in active:
            decision = plugin.on_model_received(gm, refined)
            self._note_replaced(plugin.name, refined, decision.hparams, gm.version)
            refined = decision.hparams
            forget = forget or decision.forget_windows
            if lent is None:
                lent = decision.buffer_policy
            critical[plugin.name] = bool(decision.critical_period)
        self._critical = critical
        # Published only now: a plug-in's other hooks never run before it has seen its model.
        self._active = {plugin.name for plugin in active}
        return ModelDecisions(refined, forget, lent, clock_policy)

    def _use_plugin_settings(self, settings: BoardSettings, version: int) -> None:
        """Replace each plug-in whose settings in force changed by a fresh instance with them."""
        for i, plugin in enumerate(self.plugins):
            new = settings.plugins.get(plugin.name)
            old = self._configs.get(plugin.name)
            if new is None or new == old:
                continue
            self._configs[plugin.name] = new
            self.plugins[i] = make_plugin(plugin.name, self._configs, self._seed, self._num_classes)
            self._forget_replaced(plugin.name)
            log.info("plug-in %s settings from global model v%d (%s): %s; started afresh", plugin.name,
                     version, "method %s" % settings.method if settings.method else "this board's own",
                     ", ".join(describe_change(old, new)) if old is not None else new)

    def _use_clocks(self, settings: BoardSettings, version: int) -> Optional[DvfsPolicy]:
        """A new clock policy where the clock config in force changed, else None."""
        if settings.dvfs is None or settings.dvfs == self._dvfs:
            return None
        old, self._dvfs = self._dvfs, settings.dvfs
        log.info("clock policy from global model v%d (%s): %s %s -> %s %s", version,
                 "method %s" % settings.method if settings.method else "this board's own",
                 old.policy if old else None, dict(old.policy_options) if old else {},
                 settings.dvfs.policy, dict(settings.dvfs.policy_options))
        return make_policy(settings.dvfs.policy, **settings.dvfs.policy_kwargs())

    def _note_replaced(self, name: str, given: Mapping[str, float], decided: Mapping[str, float],
                       version: int) -> None:
        """Log once when plug-in ``name`` replaces a hyper-parameter it was given: again only when
        the value it replaces changes (module docstring)."""
        for key, value in decided.items():
            before = given.get(key)
            if before is None or before == value:
                continue
            if self._replaced.get((name, key), _NOTHING) == before:
                continue
            self._replaced[(name, key)] = before
            log.info("plug-in %s replaces the hyper-parameter %s from global model v%d: %r -> %r "
                     "(the plug-in sets it from now on; said again only when the value it replaces "
                     "changes)", name, key, version, before, value)

    def _forget_replaced(self, name: str) -> None:
        for pair in [pair for pair in self._replaced if pair[0] == name]:
            del self._replaced[pair]

    def _activated_by(self, gm: GlobalModel) -> List[AgentPlugin]:
        """The plug-ins active under ``gm``, in calling order; each active one ``gm`` leaves
        dormant is replaced by a fresh instance."""
        active = []
        for i, plugin in enumerate(self.plugins):
            if not plugin.activated_by or any(
                    isinstance(gm.extras.get(kind), Extra) and gm.extras[kind].KIND == kind
                    for kind in plugin.activated_by):
                if plugin.name not in self._active:
                    log.debug("plug-in %s active from global model v%d", plugin.name, gm.version)
                active.append(plugin)
            elif plugin.name in self._active:
                self._active.discard(plugin.name)
                self.plugins[i] = make_plugin(plugin.name, self._configs, self._seed, self._num_classes)
                self._forget_replaced(plugin.name)
                log.info("plug-in %s dormant from global model v%d (its coordinator side does not "
                         "run): started afresh", plugin.name, gm.version)
        return active

    def window_arrived(self, window: Window) -> Window:
        """The window as the active plug-ins say it should be stored (each may resolve more of it)."""
        for plugin in self.active:
            window = plugin.on_window_arrived(window) or window
        return window

    def round_opportunity(self, now: float) -> bool:
        """Tell every active plug-in of a round opportunity; True if none declines it."""
        answers = [plugin.on_round_opportunity(now) for plugin in self.active]
        return all(answers)

    def waits_for_newer_model(self) -> bool:
        """True if an active plug-in vetoes rounds until a newer global model arrives."""
        return any(plugin.waits_for_newer_model() for plugin in self.active)

    def round_start_weights(self) -> Optional[Dict[str, np.ndarray]]:
        """The first active plug-in's start weights for the round being planned, None if none asks."""
        for plugin in self.active:
            weights = plugin.round_start_weights()
            if weights is not None:
                return weights
        return None

    def penalties(self, model: nn.Module) -> List[Tuple[str, Optional[Penalty]]]:
        """Each active plug-in's loss term for the round about to train (None: none), by name."""
        return [(plugin.name, plugin.before_round(model)) for plugin in self.active]

    def statistics(self, ctx: RoundContext) -> Tuple[Dict[str, Extra], Dict[str, int]]:
        """The active plug-ins' statistics of a trained round, by kind, and the windows they
        cost (``batched`` in one backward pass, ``per_window`` a backward each)."""
        extras: Dict[str, Extra] = {}
        cost: Dict[str, int] = {}
        for plugin in self.active:
            for stat in plugin.after_round(ctx):
                for key, n in (("batched", stat.batched_windows), ("per_window", stat.per_window_windows)):
                    if n:
                        cost[key] = cost.get(key, 0) + n
                if stat.extra is not None and self._within_bounds(stat.extra):
                    extras[stat.extra.KIND] = stat.extra
        return extras, cost

    def reports(self, ctx: ReportContext) -> Dict[str, Extra]:
        """The active plug-ins' cheap reports for telemetry, by kind."""
        return {extra.KIND: extra for plugin in self.active for extra in plugin.before_telemetry(ctx)
                if self._within_bounds(extra)}

    def _within_bounds(self, extra: Extra) -> bool:
        """True if every value of ``extra`` is inside its kind's declared bounds; else it is
        counted, logged (rate-limited) and left out of the message
        (``OUT_OF_BOUNDS_WARN_INTERVAL_S`` says why)."""
        try:
            check_bounds(extra)
        except ProtocolError as exc:
            self.out_of_bounds[extra.KIND] += 1
            self._bounds_log.event(extra.KIND, logging.WARNING, "%s left out of the message, which "
                                   "goes without it: %s", extra.KIND, exc)
            return False
        return True
