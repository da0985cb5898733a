"""The device side of a learning method: a small hook class the agent core calls, never names.

Every registered agent plug-in runs on every board, dormant until the coordinator's global model
carries its extra (the coordinator decides the fleet's method; a board needs no per-method
configuration beyond the plug-in's settings). A plug-in sees each accepted global model and the
commands addressed to the device; it refines the round's hyper-parameters, adds penalty terms to
the loss, computes round statistics for the update (and cheap reports while the device skips), says whether the learning is in a critical
period (clock policies follow it) and may veto a round. Hooks are called in the registry's order
(``streamfl.agent.plugins.PLUGINS``); all default to doing nothing. Hooks do no I/O.
"""
import abc
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, List, Optional, Tuple, Type

import numpy as np
import torch
from torch import nn

from streamfl.agent.buffer_policies.base import ReplacementPolicy
from streamfl.protocol.extras import Extra
from streamfl.protocol.messages import Command, GlobalModel
from streamfl.sensors.window import Window

Tensors = Dict[str, np.ndarray]
#: A loss term: ``penalty(model) -> scalar tensor``, added to the round's loss at every step.
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


class AgentPlugin(abc.ABC):
    """Hooks of one method on a device; subclasses set ``name`` and ``Config``."""

    #: The registry name (also the key of its settings under ``plugins:`` in the agent YAML).
    name: ClassVar[str] = ""
    #: Frozen dataclass of the plug-in's settings.
    Config: ClassVar[Type[Any]]

    def __init__(self, config: Any):
        self.config = config

    def bind(self, seed: int, num_classes: int) -> None:
        """Told once, before any window, the device's seed and the model's class count."""

    def on_global_model(self, gm: GlobalModel) -> None:
        """A newer global model of this device's architecture was accepted."""

    def on_window(self, window: Window) -> None:
        """A sensor window is about to be offered to the buffer (called for every one: keep it
        cheap)."""

    def buffer_policy(self) -> Optional[ReplacementPolicy]:
        """The buffer's replacement policy while this method runs (asked after every accepted
        global model; the first plug-in to name one wins), or None to leave the configured one."""
        return None

    def forgets_windows(self) -> bool:
        """True (once) to empty the window buffer after the model just accepted: the windows held
        describe a world that is gone (e.g. a new session). A round in progress is interrupted."""
        return False

    def on_command(self, command: Command) -> bool:
        """A command of a kind the core does not handle; True if this plug-in handled it."""
        return False

    def refine_hparams(self, hparams: Dict[str, float]) -> Dict[str, float]:
        """The round's hyper-parameters from the global model's (``hparams``); default unchanged."""
        return hparams

    def critical_period(self) -> bool:
        """True while the learning is in a critical period (the ``clp-aware`` clocks run low)."""
        return False

    def should_train(self, now: float) -> bool:
        """False to skip the round that would start now."""
        return True

    def penalty(self, model: nn.Module) -> Optional[Penalty]:
        """A term to add to this round's loss, or None."""
        return None

    def statistics(self, ctx: RoundContext) -> List[Statistic]:
        """Typed statistics for this round's update (computed after training)."""
        return []

    def report(self, ctx: ReportContext) -> List[Extra]:
        """Cheap typed statistics for the telemetry of a device that does not train now (e.g. one
        told to skip, so a scheduler still sees its data); field-only extras, no tensors."""
        return []
