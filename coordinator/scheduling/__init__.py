"""Device scheduling math for the coordinator: FedTeddi's drift- and divergence-aware greedy choice
of who trains each round, under a latency deadline or a shared bandwidth budget (teddi.py).

Pure numpy functions; the coordinator plug-in that feeds them the fleet's reports lives elsewhere.
"""
from streamfl.coordinator.scheduling.teddi import (
    DEFAULT_BATCH, DEFAULT_LAMBDA0, DEFAULT_SIGMA, Allocation, allocate_bandwidth, class_weights,
    collective_divergence, drift_weight, global_distribution, greedy_select, temporal_drift, utility,
)

__all__ = ["DEFAULT_BATCH", "DEFAULT_LAMBDA0", "DEFAULT_SIGMA", "Allocation", "allocate_bandwidth",
           "class_weights", "collective_divergence", "drift_weight", "global_distribution",
           "greedy_select", "temporal_drift", "utility"]
