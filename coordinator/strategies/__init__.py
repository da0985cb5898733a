"""Aggregation strategies (FedAsync, synchronous FedAvg) and the factory that picks one from config."""
from typing import Callable, Collection

from streamfl.coordinator.strategies.base import AGGREGATED, BUFFERED, STALE, Aggregator, Outcome
from streamfl.coordinator.strategies.staleness import staleness_of
from streamfl.coordinator.strategies.fedasync import DEFAULT_ALPHA, FedAsyncAggregator
from streamfl.coordinator.strategies.fedavg import FedAvgAggregator, weighted_average
from streamfl.coordinator.strategies.staleness import STALENESS_NAMES, make_staleness

STRATEGY_NAMES = ("fedasync", "fedavg")


def make_strategy(config, online_devices: Callable[[], Collection[str]] = lambda: ()) -> Aggregator:
    """The strategy a ``CoordinatorConfig`` names; FedAvg asks ``online_devices`` who to wait for."""
    if config.strategy == "fedasync":
        return FedAsyncAggregator(alpha=config.alpha,
                                  staleness_fn=make_staleness(config.staleness, config.staleness_a,
                                                              config.staleness_b),
                                  max_staleness=config.max_staleness)
    if config.strategy == "fedavg":
        return FedAvgAggregator(deadline_s=config.fedavg.deadline_s,
                                min_updates=config.fedavg.min_updates, online_devices=online_devices,
                                clients_per_round=config.fedavg.clients_per_round,
                                combine=config.fedavg.combine, trim_ratio=config.fedavg.trim_ratio)
    raise ValueError("unknown strategy %r (known: %s)" % (config.strategy, ", ".join(STRATEGY_NAMES)))


__all__ = ["AGGREGATED", "BUFFERED", "STALE", "Aggregator", "Outcome", "staleness_of", "DEFAULT_ALPHA",
           "FedAsyncAggregator", "FedAvgAggregator", "weighted_average", "STALENESS_NAMES",
           "make_staleness", "STRATEGY_NAMES", "make_strategy"]
