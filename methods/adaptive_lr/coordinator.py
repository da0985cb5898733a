"""Adaptive-FedAvg (Canonaco et al., "Adaptive federated learning in presence of concept drift",
IJCNN 2021) on the coordinator: the devices' learning rate follows how much the global model moves.

The SFedPO paper (sec. 6) runs it as a concept-drift baseline: "Adaptive-FedAvg adjusts
local learning rates to improve model plasticity under concept drift". After every aggregation
t = 1, 2, ... the coordinator keeps Adam-like statistics of the global parameter vector x_t
(float64, every float tensor flattened in name order):

    m_t = b1 m_{t-1} + (1 - b1) x_t                        m^_t = m_t / (1 - b1^t)    (m_0 = 0)
    v_t = b2 v_{t-1} + (1 - b2) mean((x_t - m^_{t-1})^2)   v^_t = v_t / (1 - b2^t)    (a scalar)
    r_t = b3 r_{t-1} + (1 - b3) v^_t / v^_{t-1}            r^_t = r_t / (1 - b3^t)
    lr_t = min(lr0, lr0 r^_t / t)

and devices train the next round with lr_t. The ratio is 1 at t = 1 and wherever v^_{t-1} is 0 or
not finite (or the ratio itself is not finite). A drift makes the model move more than it did
(v^ grows, the ratio exceeds 1) and so raises the rate again; a settled model decays as 1/t.

Defaults b1 = b2 = b3 = 0.5: the paper's text is not at hand; the one public implementation derived
from the authors' code we found (a ``LearningRateUpdater`` in the style of the authors'
NS_FederatedLearning server) hard-codes 0.5 for all three, while a later re-implementation picks
0.9 / 0.99 / 0.9 of its own. 0.5 forgets fast, which is what a drift detector wants.

Our guards, off by default (the paper's rule): over a long streaming run 1/t starves learning, so
``decay_every`` counts that many aggregations as one unit of t in the decay (t / decay_every, at
least 1; the bias corrections keep per-aggregation t), and ``min_lr_ratio`` floors the rate at that
share of lr0. The rate never reaches 0 on the wire (``MIN_SCALE``).

What goes out is the factor lr_t / lr0 (``AdaptiveLr.scale``) and, when the settings name it,
lr0; without ``lr0`` the devices take it from the global model's ``hparams.lr`` (the broadcast
rate), which this plug-in cannot see. m persists in ``state_tensors`` (plugins.safetensors,
rewritten at most every 30 s, so it may be a little older than t after a restart; without it, m^
restarts at the restored model); t, v and r in ``state``.
"""
import logging
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Mapping, Optional

import numpy as np

from streamfl.config import bounded
from streamfl.coordinator.plugins.base import NOTHING, Aggregation, CoordinatorPlugin, Effects, FleetView, MethodState
from streamfl.methods.adaptive_lr.payloads import MAX_LR, MIN_SCALE, AdaptiveLr
from streamfl.protocol.extras import Extra

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdaptiveLrConfig:
    """Adaptive-FedAvg's rule and our two guards.

    mean_decay, variance_decay, ratio_decay: decay of the running mean, variance and variance
      ratio (Adaptive-FedAvg's beta1, beta2, beta3: b1, b2, b3 of the module docstring's
      recurrences), each in [0, 1) (0.5: the value the public code derived from the authors'
      uses; see the module docstring).
    lr0: the starting and largest rate, in (0, 10]; null: the coordinator's ``hparams.lr``.
    decay_every: aggregations per unit of t in the 1/t decay (1: the paper; under FedAsync, where
      every update is an aggregation, about the fleet's size makes t count rounds).
    min_lr_ratio: floor on the rate as a share of lr0, in [0, 1] (0: the paper, no floor).
    """

    #: Old key names (the paper's symbols) that files may still use.
    RENAMED: ClassVar[Dict[str, str]] = {
        "beta1": "mean_decay", "beta2": "variance_decay", "beta3": "ratio_decay"}

    #: Decay of the running mean m_t (Adaptive-FedAvg's beta1).
    mean_decay: float = bounded(0.5, 0.0, 1.0, hi_open=True)
    #: Decay of the running variance v_t (Adaptive-FedAvg's beta2).
    variance_decay: float = bounded(0.5, 0.0, 1.0, hi_open=True)
    #: Decay of the running variance ratio r_t (Adaptive-FedAvg's beta3).
    ratio_decay: float = bounded(0.5, 0.0, 1.0, hi_open=True)
    lr0: Optional[float] = bounded(None, 0.0, MAX_LR, lo_open=True)
    decay_every: int = bounded(1, 1, 10 ** 6)
    min_lr_ratio: float = bounded(0.0, 0.0, 1.0)

    def __post_init__(self) -> None:
        for key in ("mean_decay", "variance_decay", "ratio_decay"):
            value = getattr(self, key)
            if isinstance(value, bool) or not 0 <= value < 1:
                raise ValueError("%s must be in [0, 1), got %r" % (key, value))
        if self.lr0 is not None and (isinstance(self.lr0, bool) or not 0 < self.lr0 <= MAX_LR):
            raise ValueError("lr0 must be in (0, %g] or null, got %r" % (MAX_LR, self.lr0))
        if isinstance(self.decay_every, bool) or not isinstance(self.decay_every, int) or self.decay_every < 1:
            raise ValueError("decay_every must be an integer >= 1, got %r" % (self.decay_every,))
        if isinstance(self.min_lr_ratio, bool) or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError("min_lr_ratio must be in [0, 1], got %r" % (self.min_lr_ratio,))


def flat_parameters(tensors: Mapping[str, np.ndarray]) -> np.ndarray:
    """The model's float tensors as one float64 vector, in name order (the paper's x_t)."""
    parts = [np.asarray(tensors[name], dtype=np.float64).ravel() for name in sorted(tensors)
             if np.issubdtype(np.asarray(tensors[name]).dtype, np.floating)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float64)


class DriftStatistics:
    """The running m, v and r of the module docstring, raw (bias corrections on read)."""

    def __init__(self, beta1: float, beta2: float, beta3: float):
        self.b1, self.b2, self.b3 = beta1, beta2, beta3
        #: Aggregations seen.
        self.t = 0
        #: Raw m_t (None: m_0 = 0); replaced, never changed in place (``state_tensors`` shares it).
        self.m: Optional[np.ndarray] = None
        self.v = 0.0
        self.r = 0.0
        #: The newest v^_t / v^_{t-1} (1 where it is not defined).
        self.ratio = 1.0

    def m_hat(self) -> Optional[np.ndarray]:
        """Bias-corrected mean m^_t, None before the first aggregation."""
        if self.t == 0 or self.m is None:
            return None
        return self.m / (1.0 - self.b1 ** self.t)

    def v_hat(self) -> Optional[float]:
        """Bias-corrected variance v^_t, None before the first aggregation."""
        return None if self.t == 0 else self.v / (1.0 - self.b2 ** self.t)

    def r_hat(self) -> Optional[float]:
        """Bias-corrected ratio r^_t, None before the first aggregation."""
        return None if self.t == 0 else self.r / (1.0 - self.b3 ** self.t)

    def reset(self) -> None:
        """Back to t = 0 (a model of another size: nothing learned about this one)."""
        self.t, self.m, self.v, self.r, self.ratio = 0, None, 0.0, 0.0, 1.0

    def update(self, x: np.ndarray) -> bool:
        """Fold in the global model x_t; False (nothing changed) if its spread is not finite."""
        if self.m is not None and self.m.shape != x.shape:
            log.warning("adaptive_lr: the model has %d parameters, the statistics %d; restarting them",
                        x.size, self.m.size)
            self.reset()
        m_hat_prev = self.m_hat()
        diff = x if m_hat_prev is None else x - m_hat_prev
        spread = float(np.mean(np.square(diff))) if x.size else 0.0
        if not math.isfinite(spread):
            log.warning("adaptive_lr: the global model's spread is not finite; statistics kept")
            return False
        v_hat_prev = self.v_hat()
        t = self.t + 1
        m = (1.0 - self.b1) * x if self.m is None else self.b1 * self.m + (1.0 - self.b1) * x
        v = self.b2 * self.v + (1.0 - self.b2) * spread
        v_hat = v / (1.0 - self.b2 ** t)
        ratio = 1.0
        if v_hat_prev is not None and math.isfinite(v_hat_prev) and v_hat_prev > 0:
            ratio = v_hat / v_hat_prev
            if not math.isfinite(ratio):
                ratio = 1.0
        self.t, self.m, self.v, self.ratio = t, m, v, ratio
        self.r = self.b3 * self.r + (1.0 - self.b3) * ratio
        return True


class AdaptiveLrPlugin(CoordinatorPlugin):
    """Updates the drift statistics at every aggregation and broadcasts the next round's rate."""

    name = "adaptive_lr"
    Config = AdaptiveLrConfig

    def __init__(self, config: AdaptiveLrConfig, fleet: FleetView, peers: Mapping[str, CoordinatorPlugin]):
        super().__init__(config, fleet, peers)
        if fleet.model is None:
            raise ValueError("adaptive_lr needs the fleet's model (FleetView.model)")
        self.stats = DriftStatistics(config.mean_decay, config.variance_decay, config.ratio_decay)

    # ---- inputs -------------------------------------------------------------------------------
    def on_model_made(self, aggregation: Aggregation) -> Effects:
        self.stats.update(flat_parameters(self.fleet.model()))
        scale = self.scale()
        if scale is None:
            return NOTHING
        return Effects(events=({"event": "adaptive_lr", "version": aggregation.version,
                                "time_s": aggregation.time_s, "t": self.stats.t, "scale": scale,
                                "lr": self.lr(), "ratio": self.stats.ratio,
                                "variance": self.stats.v_hat()},))

    # ---- outputs ------------------------------------------------------------------------------
    def scale(self) -> Optional[float]:
        """lr_t / lr0 after the newest aggregation (floored), None before the first."""
        r_hat = self.stats.r_hat()
        if r_hat is None:
            return None
        units = max(1.0, self.stats.t / float(self.config.decay_every))
        scale = min(1.0, r_hat / units)
        if not math.isfinite(scale):
            scale = 1.0
        return max(scale, float(self.config.min_lr_ratio), MIN_SCALE)

    def lr(self) -> Optional[float]:
        """lr_t where lr0 is set here, None otherwise (the devices apply the broadcast rate)."""
        scale = self.scale()
        return None if scale is None or self.config.lr0 is None else float(self.config.lr0) * scale

    def describe(self, now: float) -> MethodState:
        """The learning-rate factor lr_t / lr0 the devices train with (None before the first
        aggregation), lr_t where lr0 is set here, the aggregations counted (t) and the newest
        variance ratio (above 1: the model moves more than it did, a drift)."""
        return MethodState(fleet={"lr_factor": self.scale(), "lr": self.lr(), "aggregations": self.stats.t,
                                  "variance_ratio": float(self.stats.ratio)})

    def before_publish(self) -> List[Extra]:
        scale = self.scale()
        if scale is None:
            return []
        lr0 = None if self.config.lr0 is None else float(self.config.lr0)
        return [AdaptiveLr(scale=float(scale), lr0=lr0)]

    # ---- persistence --------------------------------------------------------------------------
    def state(self) -> Optional[Dict[str, Any]]:
        return {"t": self.stats.t, "v": self.stats.v, "r": self.stats.r, "ratio": self.stats.ratio}

    def load_state(self, state: Mapping[str, Any]) -> None:
        t = state.get("t", 0)
        if type(t) is not int or t < 0:
            raise ValueError("adaptive_lr: saved t must be an integer >= 0, got %r" % (t,))
        values = {}
        for key in ("v", "r", "ratio"):
            value = state.get(key, 1.0 if key == "ratio" else 0.0)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise ValueError("adaptive_lr: saved %s must be a finite number >= 0, got %r" % (key, value))
            values[key] = float(value)
        self.stats.t, self.stats.v, self.stats.r = t, values["v"], values["r"]
        self.stats.ratio = values["ratio"]
        # Until the saved m arrives (load_state_tensors), m^_t is the restored model itself.
        self.stats.m = None if t == 0 else flat_parameters(self.fleet.model()) * (1.0 - self.stats.b1 ** t)

    def state_tensors(self) -> Optional[Dict[str, np.ndarray]]:
        return None if self.stats.m is None else {"m": self.stats.m}

    def load_state_tensors(self, tensors: Mapping[str, np.ndarray]) -> None:
        if set(tensors) != {"m"}:
            raise ValueError("adaptive_lr: expected one array 'm', got %s" % sorted(tensors))
        m = np.array(tensors["m"], dtype=np.float64)
        size = flat_parameters(self.fleet.model()).size
        if m.shape != (size,) or not np.isfinite(m).all():
            raise ValueError("adaptive_lr: saved m must be %d finite values, got shape %s" % (size, m.shape))
        if self.stats.t == 0:
            raise ValueError("adaptive_lr: a saved m without a saved aggregation count")
        self.stats.m = m
        log.info("adaptive_lr: statistics of %d aggregations restored", self.stats.t)
