"""The device side of a learning method: a small hook class the agent core calls, never names.

Every registered agent plug-in runs on every board, dormant until the coordinator runs its
counterpart: the core calls a plug-in's hooks only while the newest accepted global model carries
an extra of one of its ``activated_by`` kinds (the coordinator decides the fleet's method; a board
needs no per-method configuration beyond the plug-in's settings), and replaces it with a fresh
instance when it goes dormant, so no state of an earlier run survives. The hooks, by their place
in the device's life: ``bind`` (once), ``on_window_arrived`` (every sensor window),
``on_model_received`` (each accepted global model: the round's hyper-parameters and what the
buffer and clocks should do, as a ``ModelDecision``), ``on_round_opportunity`` (once per round
opportunity, when a round is due and the core is ready: the plug-in may veto it),
``round_start_weights`` (other start weights for this round), ``before_round`` (a loss term),
``after_round`` (statistics for the update) and ``before_telemetry`` (cheap reports while the
device does not train). Hooks are called in the registry's order (``streamfl.methods``); all
default to doing nothing. Hooks do no I/O.
"""
import abc
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, List, Optional, Tuple, Type

import numpy as np
import torch
from torch import nn

from streamfl.agent.buffer_policies.base import ReplacementPolicy
from streamfl.protocol.extras import Extra
from streamfl.protocol.messages import GlobalModel
from streamfl.sensors.window import Window

Tensors = Dict[str, np.ndarray]
#: A loss term: ``penalty(model) -> scalar tensor``, added to the round's loss at every step; or
#: one of the forms ``LocalTrainer`` applies its own way: a ``QuadraticPull`` (straight to the
#: gradients) or a ``Distillation`` (given each batch's windows and logits).
Penalty = Callable[[nn.Module], torch.Tensor]


@dataclass
class RoundContext:
    """What a plug-in may use after a round's training to compute its statistics."""

    #: The trained local model (do not change its weights).
    model: nn.Module
    #: Its weights as float32 arrays (the update's tensors).
    tensors: Tensors
    round_index: int
    #: The device's seed: statistics seed their generators from it and ``round_index``.
    seed: int
    #: ``sample(n) -> (X, y)``: n windows drawn from the buffer (under the runtime's lock).
    sample: Callable[[int], Tuple[np.ndarray, np.ndarray]]
    #: Windows currently in the buffer.
    buffer_len: int
    #: The round's mean training loss (None where a runtime does not say).
    loss: Optional[float] = None
    #: The first step's loss: the start weights (the global model, when the round began from
    #: one) on the round's first minibatch, i.e. how well they already fit this device's data.
    start_loss: Optional[float] = None
    #: Classes of the model (ln of it is a chance-level loss, a scale any model shares).
    num_classes: int = 0
    #: ``{class: windows}`` the buffer holds after the round (what the next round trains on).
    buffer_counts: Dict[int, int] = field(default_factory=dict)
    #: The global version the round trained from (-1: none yet; None where a runtime does not say).
    base_version: Optional[int] = None
    #: The agent's pacing between rounds (``round_interval_s``; 0 where a runtime does not say).
    round_interval_s: float = 0.0
    #: SGD steps the round took, T of the papers' local updates (0 where a runtime does not say).
    local_steps: int = 0


@dataclass
class ReportContext:
    """What a plug-in may use for a report while the device does not train (no model access:
    a report costs no backward pass)."""

    #: ``{class: windows}`` the buffer holds.
    buffer_counts: Dict[int, int]
    num_classes: int
    now_s: float


@dataclass(frozen=True)
class Statistic:
    """A round statistic for the update and what it cost, for runtimes that charge the work.

    ``batched_windows``: windows in one batched backward pass; ``per_window_windows``: windows
    each needing a backward pass of their own (the simulator prices the two differently).
    """

    #: None when the computation ran but gave nothing to send (e.g. not finite).
    extra: Optional[Extra]
    batched_windows: int = 0
    per_window_windows: int = 0


@dataclass(frozen=True)
class ModelDecision:
    """What a plug-in decides when a global model arrives (``AgentPlugin.on_model_received``)."""

    #: The round's hyper-parameters as this plug-in refines them; the core hands them to the next
    #: plug-in in calling order, and applies the last one's (clamped to the board's limits).
    hparams: Dict[str, float]
    #: True to empty the window buffer: the windows held describe a world that is gone (e.g. a
    #: new session). A round in progress is interrupted.
    forget_windows: bool = False
    #: The buffer's replacement policy while this method runs (the first plug-in to name one
    #: wins), or None to leave the configured one.
    buffer_policy: Optional[ReplacementPolicy] = None
    #: True while the learning is in a critical period (the ``clp-aware`` clocks run low); the
    #: core keeps each plug-in's latest answer until the next global model.
    critical_period: bool = False


class AgentPlugin(abc.ABC):
    """Hooks of one method on a device; subclasses set ``name``, ``Config`` and ``activated_by``."""

    #: The registry name (also the key of its settings under ``plugins:`` in the agent YAML).
    name: ClassVar[str] = ""
    #: Frozen dataclass of the plug-in's settings.
    Config: ClassVar[Type[Any]]
    #: The global-model extra kinds whose presence says the coordinator runs this method's
    #: counterpart: the core calls the hooks below (``bind`` aside) only while the newest accepted
    #: global model carries one of them. Empty: always active, before any global model too.
    activated_by: ClassVar[Tuple[str, ...]] = ()

    def __init__(self, config: Any):
        self.config = config

    def bind(self, seed: int, num_classes: int) -> None:
        """Told once, before any window, the device's seed and the model's class count."""

    def on_window_arrived(self, window: Window) -> Optional[Window]:
        """A sensor window is about to be offered to the buffer (called for every one: keep it
        cheap). Return the window as it should be stored (e.g. with the latent state this method
        resolved; the next plug-in gets it), or None to leave it as it is."""
        return None

    def on_model_received(self, gm: GlobalModel, hparams: Dict[str, float]) -> ModelDecision:
        """A newer global model of this device's architecture was accepted; ``hparams`` are its
        hyper-parameters as the plug-ins before this one refined them. Default: unchanged, and
        nothing else to do."""
        return ModelDecision(hparams)

    def on_round_opportunity(self, now: float) -> bool:
        """An event with a clock, not a query: a round is due at ``now`` and the core is ready
        (``AgentCore.round_opportunity``, once per opportunity), and every active plug-in hears of
        it, whatever the others answer (a plug-in may count opportunities or end a rest here).
        False vetoes the round."""
        return True

    def waits_for_newer_model(self) -> bool:
        """A query, asked whenever the runtime decides whether to listen for models: True while
        this plug-in vetoes rounds until a global model newer than the one held arrives (the
        board then listens for one; it otherwise fetches a model only when a round starts,
        agent/model_feed.py). A plug-in whose veto ends by itself (a rest, a count) answers False."""
        return False

    def round_start_weights(self) -> Optional[Tensors]:
        """A query when a round is planned, before ``before_round``: weights this round trains
        from instead of the global model (a model a method measures beside it), or None. The
        round's update names the global version held as its base (the plug-in marks it in
        ``after_round``), and the next round starts from the newest global model again, so such
        weights never replace the board's own model. The first active plug-in to answer wins."""
        return None

    def before_round(self, model: nn.Module) -> Optional[Penalty]:
        """A term to add to the loss of the round about to train ``model``, or None."""
        return None

    def after_round(self, ctx: RoundContext) -> List[Statistic]:
        """Typed statistics for this round's update (computed after training)."""
        return []

    def before_telemetry(self, ctx: ReportContext) -> List[Extra]:
        """Cheap typed statistics for the telemetry of a device that does not train now (e.g. one
        told to skip, so a scheduler still sees its data); field-only extras, no tensors."""
        return []
