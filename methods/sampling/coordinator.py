"""Random client sampling: after every aggregation, a fresh random subset of the online devices
trains and the rest sit the next round out (McMahan et al. 2017's fraction C, by command).

The coordinator tells each online device what to do over its command topic: ``train`` (start a
round now) for the chosen ones, ``skip`` (``skip_rounds`` round intervals) for the others. It cuts
the fleet's compute and energy per version; with FedAvg the round size follows ``clients_per_round``
so a round does not wait for the devices told to skip.
"""
from dataclasses import dataclass
from typing import Any, Dict, Mapping

import numpy as np

from streamfl.config import SEED_MAX, bounded
from streamfl.coordinator.plugins.base import NOTHING, Addressed, Aggregation, CoordinatorPlugin, Effects, FleetView, \
    MethodState
from streamfl.protocol.messages import Command


@dataclass(frozen=True)
class SamplingConfig:
    """clients_per_round: devices told to train after each aggregation (all, if fewer are online);
    skip_rounds: round intervals the others skip (1: they are back for the next choice);
    seed: the choice's random stream (reproducible runs)."""

    clients_per_round: int = bounded(2, 1, 10 ** 6)
    skip_rounds: int = bounded(1, 1, 10000)
    seed: int = bounded(0, 0, SEED_MAX)

    def __post_init__(self) -> None:
        if self.clients_per_round < 1:
            raise ValueError("clients_per_round must be >= 1, got %r" % (self.clients_per_round,))
        if self.skip_rounds < 1:
            raise ValueError("skip_rounds must be >= 1, got %r" % (self.skip_rounds,))


class SamplingPlugin(CoordinatorPlugin):
    """Commands ``train`` to a random ``clients_per_round`` of the online devices, ``skip`` to the rest."""

    name = "sampling"
    Config = SamplingConfig

    def __init__(self, config: SamplingConfig, fleet: FleetView, peers: Mapping[str, CoordinatorPlugin]):
        super().__init__(config, fleet, peers)
        self._rng = np.random.default_rng(config.seed)
        self.rounds = 0
        #: The last choice: each device online then, True if told to train (not saved: the next
        #: aggregation chooses again).
        self.selected: Dict[str, bool] = {}

    def on_start(self, now: float) -> Effects:
        """A synchronous round waits for the sampled devices only."""
        return Effects(round_size=self.config.clients_per_round) if self.fleet.synchronous else NOTHING

    def on_model_made(self, aggregation: Aggregation) -> Effects:
        online = sorted(self.fleet.online())
        if not online:
            return NOTHING
        k = min(self.config.clients_per_round, len(online))
        chosen = set(self._rng.choice(len(online), size=k, replace=False).tolist())
        self.rounds += 1
        self.selected = {device: i in chosen for i, device in enumerate(online)}
        return Effects(commands=tuple(
            Addressed(device, Command("train") if i in chosen
                      else Command("skip", {"rounds": self.config.skip_rounds}))
            for i, device in enumerate(online)))

    def describe(self, now: float) -> MethodState:
        """Choices made, and each device of the last choice: told to train (selected) or to skip."""
        return MethodState(fleet={"rounds": self.rounds, "selected": sum(self.selected.values()),
                                  "clients_per_round": self.config.clients_per_round},
                           devices={d: {"selected": s} for d, s in self.selected.items()})

    def state(self) -> Dict[str, Any]:
        return {"rounds": self.rounds}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.rounds = int(state.get("rounds", 0))
