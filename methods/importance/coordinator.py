"""The importance-sampling baseline on the coordinator: tells the fleet to run it (``ImportanceTerms``).

The selection itself is the devices' (``streamfl.methods.importance.agent``); the coordinator only
sets the budget (0.5, SFedPO's alpha_n, so the two select the same share of windows), how many
random slots an eviction compares (8), and whether the devices score windows by class (streamfl's
variant, the default) or one by one (``per_window``: the paper's IS, after Li et al. 2021).
"""
from dataclasses import dataclass
from typing import List

from streamfl.config import bounded
from streamfl.coordinator.plugins.base import CoordinatorPlugin, MethodState
from streamfl.protocol.extras import Extra
from streamfl.methods.importance.payloads import ImportanceTerms


@dataclass(frozen=True)
class ImportanceConfig:
    """budget: mean admission probability of a window once the buffer is full;
    candidates: random slots an eviction compares; per_window: score each window by itself (a
    forward pass per window offered) instead of by its class's mean."""

    budget: float = bounded(0.5, 0.0, 1.0, lo_open=True)
    candidates: int = bounded(8, 1, 1024)
    per_window: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < self.budget <= 1.0:
            raise ValueError("budget must be in (0, 1], got %r" % (self.budget,))
        if not 1 <= self.candidates <= 1024:
            raise ValueError("candidates must be in [1, 1024], got %r" % (self.candidates,))


class ImportancePlugin(CoordinatorPlugin):
    """Broadcasts the importance-sampling terms."""

    name = "importance"
    Config = ImportanceConfig

    def before_publish(self) -> List[Extra]:
        return [ImportanceTerms(self.config.budget, self.config.candidates, self.config.per_window)]

    def describe(self, now: float) -> MethodState:
        """What every model tells the devices: the admission budget and the eviction sample. The
        per-window weights are the devices' own (their buffers); the coordinator keeps none."""
        return MethodState(fleet={"budget": float(self.config.budget),
                                  "candidates": int(self.config.candidates),
                                  "per_window": bool(self.config.per_window)})
