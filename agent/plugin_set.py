"""The methods' plug-ins on one device: which are active under the newest global model, and what
they decide together, so the agent core asks one object and calls no plug-in's hook itself.

A plug-in is active while the newest accepted global model carries an extra of one of its
``activated_by`` kinds (none: always); an active one that a model leaves dormant is replaced at
once by a fresh instance, built and bound as at start, so no state of a method's run survives to
its next. Every hook goes to the active plug-ins in calling order, each asked whatever the others
answer.
"""
import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from torch import nn

from streamfl.agent.buffer_policies import ReplacementPolicy
from streamfl.agent.plugins import AgentPlugin, Penalty, ReportContext, RoundContext, make_plugin, make_plugins
from streamfl.protocol.extras import Extra
from streamfl.protocol.messages import GlobalModel
from streamfl.sensors.window import Window

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelDecisions:
    """What the active plug-ins decided together on a global model: the round's hyper-parameters
    (each plug-in refining the previous one's), whether to empty the buffer (any), and the buffer
    policy to use (the first one named; None: the configured one)."""

    hparams: Dict[str, float]
    forget_windows: bool
    buffer_policy: Optional[ReplacementPolicy]


class DevicePlugins:
    """Every registered method's device plug-in, in calling order, and which of them are active."""

    def __init__(self, configs: Mapping[str, Any], seed: int, num_classes: int):
        self._configs, self._seed, self._num_classes = configs, seed, num_classes
        #: Every registered plug-in, active or dormant, in calling order.
        self.plugins: List[AgentPlugin] = make_plugins(configs, seed, num_classes)
        #: Names of the plug-ins called now: those the newest global model activates, and those
        #: with no ``activated_by`` (always active).
        self._active = {plugin.name for plugin in self.plugins if not plugin.activated_by}
        #: Each active plug-in's critical-period answer to the newest global model.
        self._critical: Dict[str, bool] = {}

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
        """Activate the plug-ins ``gm`` asks for (starting afresh those it leaves dormant) and
        collect their decisions on it."""
        active = self._activated_by(gm)
        refined = dict(hparams)
        forget = False
        lent: Optional[ReplacementPolicy] = None
        critical: Dict[str, bool] = {}
        for plugin in active:
            decision = plugin.on_model_received(gm, refined)
            refined = decision.hparams
            forget = forget or decision.forget_windows
            if lent is None:
                lent = decision.buffer_policy
            critical[plugin.name] = bool(decision.critical_period)
        self._critical = critical
        # Published only now: a plug-in's other hooks never run before it has seen its model.
        self._active = {plugin.name for plugin in active}
        return ModelDecisions(refined, forget, lent)

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
                if stat.extra is not None:
                    extras[stat.extra.KIND] = stat.extra
        return extras, cost

    def reports(self, ctx: ReportContext) -> Dict[str, Extra]:
        """The active plug-ins' cheap reports for telemetry, by kind."""
        return {extra.KIND: extra for plugin in self.active for extra in plugin.before_telemetry(ctx)}
