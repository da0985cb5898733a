"""CriticalFL (Yan et al. 2023), the AdaCLP paper's baseline: more clients per round inside the CLP.

Synchronous FedAvg rounds close once ``clients_per_round`` devices reported; after each aggregation
the count doubles while the CLP probe (the ``clp`` plug-in, listed before this one) says the model
is in a critical learning period, and halves after it, within ``[clients_min, clients_max]``.
Which devices count is the first to report: every device trains on its own schedule here.
"""
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

from streamfl.config import bounded
from streamfl.coordinator.plugins.base import Aggregation, CoordinatorPlugin, Effects, FleetView, MethodState


@dataclass(frozen=True)
class CriticalFlConfig:
    """clients_min: the floor and the starting count (2: the smallest round that averages);
    clients_max: the cap (null: every device online)."""

    clients_min: int = bounded(2, 1, 10 ** 6)
    clients_max: Optional[int] = bounded(None, 1, 10 ** 6)

    def __post_init__(self) -> None:
        if self.clients_min < 1:
            raise ValueError("clients_min must be >= 1, got %r" % (self.clients_min,))
        if self.clients_max is not None and self.clients_max < self.clients_min:
            raise ValueError("clients_max must be >= clients_min or null, got %r" % (self.clients_max,))


class CriticalFlPlugin(CoordinatorPlugin):
    """Decides the FedAvg round size from the CLP flag after every aggregation."""

    name = "criticalfl"
    Config = CriticalFlConfig
    requires = ("clp",)

    def __init__(self, config: CriticalFlConfig, fleet: FleetView, peers: Mapping[str, CoordinatorPlugin]):
        super().__init__(config, fleet, peers)
        self.probe = peers["clp"]
        self.clients = config.clients_min

    @classmethod
    def check(cls, config: CriticalFlConfig, strategy: str) -> None:
        if strategy != "fedavg":
            raise ValueError("plugins.criticalfl needs strategy fedavg (it sets the round size)")

    def on_start(self, now: float) -> Effects:
        """Rounds start at ``clients_min`` devices (or the size a restart restored)."""
        return Effects(round_size=self.clients)

    def on_model_made(self, aggregation: Aggregation) -> Effects:
        cap = self.config.clients_max or max(self.config.clients_min, len(self.fleet.online()))
        k = self.clients * 2 if self.probe.in_clp else self.clients // 2
        self.clients = max(self.config.clients_min, min(cap, k))
        return Effects(round_size=self.clients)

    def describe(self, now: float) -> MethodState:
        """The round size it set (devices per FedAvg round), its cap now, and the CLP flag it follows."""
        cap = self.config.clients_max or max(self.config.clients_min, len(self.fleet.online()))
        return MethodState(fleet={"round_size": self.clients, "round_size_max": cap,
                                  "in_clp": bool(self.probe.in_clp)})

    def state(self) -> Dict[str, Any]:
        return {"clients_per_round": self.clients}

    def load_state(self, state: Mapping[str, Any]) -> None:
        clients = state.get("clients_per_round")
        if clients is not None:
            if isinstance(clients, bool) or not isinstance(clients, int) or clients < 1:
                raise ValueError("criticalfl clients_per_round must be an integer >= 1, got %r" % (clients,))
            self.clients = clients
