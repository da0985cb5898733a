"""FedAsync (Xie et al. 2019): mix every update into the global model as it arrives.

``x <- (1 - a_t) x + a_t x_new`` with ``a_t = alpha * s(t - tau)`` (FedAsync, Xie et al. 2019). One
update = one aggregation = version + 1. The arithmetic is float32, with one fresh output array
per tensor (the old model stays intact for the history and the publisher).

The mix is one of the coordinator's kernels (``coordinator/kernels``): one compiled loop with numba,
block-wise numpy passes without it. Either computes every element by the same three float32
operations in the same order (two products, their sum; no fused multiply-add), so the model is
the same bit for bit.
"""
import logging
from typing import Any, Dict, Optional

import numpy as np

from streamfl.coordinator.kernels import Kernels, default_kernels
from streamfl.coordinator.strategies.base import AGGREGATED, STALE, Aggregator, Outcome
from streamfl.coordinator.strategies.staleness import StalenessFn, constant, staleness_of
from streamfl.protocol.messages import Tensors, Update

log = logging.getLogger(__name__)

#: Default mixing weight; public implementations use 0.6-0.9.
DEFAULT_ALPHA = 0.6


class FedAsyncAggregator(Aggregator):
    """Per-update mixing with staleness-decayed weight; optionally drops updates beyond max_staleness.

    A plug-in's weight factor multiplies a_t, capped at 1 (the update replaces the model)."""

    name = "fedasync"

    def __init__(self, alpha: float = DEFAULT_ALPHA, staleness_fn: StalenessFn = constant,
                 max_staleness: Optional[int] = None, kernels: Optional[Kernels] = None):
        """``kernels``: the loop that mixes (None: ``default_kernels()``)."""
        super().__init__()
        if not 0.0 < alpha <= 1.0:
            raise ValueError("fedasync alpha must be in (0, 1], got %r" % alpha)
        if max_staleness is not None and max_staleness < 0:
            raise ValueError("max_staleness must be >= 0, got %r" % max_staleness)
        self.alpha = float(alpha)
        self.staleness_fn = staleness_fn
        self.max_staleness = max_staleness
        #: The mixing weight a_t of the last aggregation: kept only for the saved state.
        self._last_weight = 0.0
        self.kernels = kernels if kernels is not None else default_kernels()

    def mixing_weight(self, staleness: int) -> float:
        """a_t = alpha * s(t - tau)."""
        return self.alpha * float(self.staleness_fn(max(0, staleness)))

    def on_update(self, model: Tensors, version: int, update: Update, now: float,
                  weight: float = 1.0) -> Outcome:
        staleness = staleness_of(version, update.base_version)
        if self.max_staleness is not None and staleness > self.max_staleness:
            self.stale_dropped += 1
            log.debug("dropping update %s of %s: staleness %d > max %d", update.update_id,
                      update.device_id, staleness, self.max_staleness)
            return Outcome(STALE)
        weight = min(1.0, self.mixing_weight(staleness) * max(0.0, float(weight)))
        self._last_weight = weight
        return Outcome(AGGREGATED, self.mix(model, update.tensors, weight), (update,), float(weight))

    def mix(self, model: Tensors, new: Tensors, weight: float) -> Tensors:
        """``(1 - weight) * model + weight * new`` in float32, into new arrays."""
        keep = np.float32(1.0 - weight)
        take = np.float32(weight)
        out: Tensors = {}
        for name, x in model.items():
            x_new = new[name]
            if x_new.dtype != np.float32:
                x_new = x_new.astype(np.float32)
            result = np.empty(x.shape, dtype=np.float32)
            self.kernels.mix_into(result.reshape(-1), x.reshape(-1), x_new.reshape(-1), keep, take)
            out[name] = result
        return out

    def state(self) -> Dict[str, Any]:
        state = super().state()
        state["last_weight"] = self._last_weight
        return state

    def load_state(self, state: Dict[str, Any]) -> None:
        super().load_state(state)
        self._last_weight = float(state.get("last_weight", 0.0))
