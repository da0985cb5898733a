"""FedCurv on the coordinator (Shoham et al. 2019): U and V, not peers.

Device k's penalty ``(lambda2/2) sum_{k' != k} (theta - theta_k')^T diag(F_k') (theta - theta_k')``
needs only ``U = sum_k F_k`` and ``V = sum_k F_k * theta_k`` over every device's latest update: the
device subtracts its own ``F_k`` and ``F_k * theta_k`` and trains with the gradient
``lambda2 ((U - F_k) * theta - (V - F_k * theta_k))``. So a global model carries two extra tensors
of the model's size however many devices there are.

The sums are float64 and each device's last contribution is kept, so a new update replaces it
exactly (subtract old, add new) without float32 drift over thousands of updates. The
contributions persist across coordinator restarts (``state_tensors``: the state directory's
plugins.safetensors, rewritten at most every 30 s, so a restart loses at most the contributions of
that span, older ones standing in) and the sums are rebuilt from them; saved arrays that are not
finite, not matched in pairs or negative Fisher values are refused whole (the sums then refill as
devices send their next updates).
"""
import logging
import time
from dataclasses import dataclass
from typing import ClassVar, Dict, List, Mapping, Optional, Tuple

import numpy as np

from streamfl.config import bounded
from streamfl.logs import RateLimitedLog
from streamfl.coordinator.plugins.base import ACCEPT, CoordinatorPlugin, FleetView, MethodState, Verdict
from streamfl.coordinator.shares import CappedSum
from streamfl.protocol.extras import Extra
from streamfl.protocol.messages import Tensors, Update
from streamfl.methods.fedcurv.payloads import CurvatureDiagonal, CurvatureTerms

log = logging.getLogger(__name__)

#: Seconds between two warnings that a device's Fisher diagonal counts capped (the ones between go
#: to DEBUG and are counted in the next). A capped device warned on every update it sent, its old
#: diagonal re-weighed each time, and honest totals are heavy-tailed: a 40-device simulated run
#: logged hundreds a minute. The fleet view's ``capped`` and each device's ``counts_x`` say the
#: same at any time.
CAPPED_WARN_INTERVAL_S = 60.0


@dataclass(frozen=True)
class FedCurvConfig:
    """FedCurv's spatial penalty, broadcast to the devices with every global model.

    penalty_strength: the penalty's weight (lambda2, the spatial term's weight in ST-EWC's
      penalty; FedCurv's lambda). Shoham et al. tune it per task and the AdaCLP paper gives none;
      the sum runs over every peer, so the pull grows with the fleet; 1.0 keeps the penalty's
      gradient at a fraction of the cross-entropy's for the HAR models here (a sweep lives in
      docs/results.md once written). Raise it to hold devices closer to what peers learned.
    fisher_samples: windows each device's Fisher diagonal is estimated on (one backward each).
    fisher_every_rounds: a device estimates its diagonal every this many of its rounds (1, the
      paper's eq. 11: every round). In between it sends none and the coordinator keeps its last
      ``F_k`` with the device's newest model (``V``'s ``F_k * theta_k``): the peers pull towards
      where the device is now, weighted by a curvature a few rounds old. Why: on small rounds the
      one-backward-per-window diagonal costs most of a round (bench/bench_stewc.py: 20 windows
      are 90% of a 5-step LSTM round), and a device's Fisher moves slowly within a period.
    max_peer_multiple: a device's Fisher diagonal counts in U and V with its total (the sum of
      its elements) capped at this many times the median of the other devices' totals (4). The
      paper's devices are honest; a diagonal is a claim, and one of 1e30 NaN'd a whole fleet. One
      device then holds at most 4 / (4 + n - 1) of the sums among n similar devices. Honest
      totals are heavy-tailed where classes arrive one at a time (measured on the adaclp-extreme
      scenario: p90 3.4x, p99 180x the peers' median, capped at 8% of contributions; on smoke
      never above 3.7x), and capping them moved FedCurv's mean accuracy there by 0.04 points
      (seed 0, 90 s); in ST-EWC's PermutedMNIST setting (two classes a device) it caps about a
      quarter of the diagonals, and FedCurv's and ST-EWC's figures stayed within their spread over
      3 seeds: the cap costs the honest fleet little. Raise it where the fleet is trusted.
    """

    #: Old key names (the paper's symbols) that files may still use.
    RENAMED: ClassVar[Dict[str, str]] = {"lambda2": "penalty_strength"}

    #: Weight of the spatial penalty (lambda2 of the module docstring's penalty); broadcast as
    #: ``CurvatureTerms.lambda2``.
    penalty_strength: float = bounded(1.0, 0.0, 1e4)
    fisher_samples: int = bounded(20, 1, 65536)
    fisher_every_rounds: int = bounded(1, 1, 10000)
    max_peer_multiple: float = bounded(4.0, 1.0, 1e6)

    def __post_init__(self) -> None:
        if not self.penalty_strength >= 0:
            raise ValueError("penalty_strength must be >= 0, got %r" % (self.penalty_strength,))
        if self.fisher_samples < 1 or self.fisher_every_rounds < 1:
            raise ValueError("fisher_samples and fisher_every_rounds must be >= 1, got %r and %r"
                             % (self.fisher_samples, self.fisher_every_rounds))


class CurvatureSums:
    """U = sum_k s_k F_k and V = sum_k s_k F_k * theta_k over each device's latest Fisher-carrying
    update, where ``s_k`` caps device k's Fisher total at ``max_peer_multiple`` times the median
    of the other devices' totals (``streamfl.coordinator.shares``): no device owns the sums."""

    def __init__(self, max_peer_multiple: float = 4.0, clock=time.monotonic) -> None:
        self._sums = CappedSum(max_peer_multiple)
        self._capped_log = RateLimitedLog(log, CAPPED_WARN_INTERVAL_S, clock)
        #: ``arrays()`` as last built (None: the contributions changed since).
        self._arrays: Optional[Dict[str, np.ndarray]] = None
        #: Each contributing device's Fisher total (the trace of its diagonal F_k, before its cap).
        self.totals: Dict[str, float] = {}

    def __len__(self) -> int:
        """Devices whose contribution is in the sums."""
        return len(self._sums)

    def on_update(self, update: Update) -> bool:
        """Fold the update's Fisher diagonal in, replacing the device's previous one; an update
        without one moves the device's ``F_k * theta_k`` to its new model under its last ``F_k``
        (devices estimate it every ``fisher_every_rounds``); False if the device has none."""
        diagonal = update.extras.get(CurvatureDiagonal.KIND)
        last = self._sums.part(update.device_id)
        if isinstance(diagonal, CurvatureDiagonal) and set(diagonal.F) == set(update.tensors):
            f = {k: np.asarray(a, dtype=np.float32) for k, a in diagonal.F.items()}
        elif last is not None and set(last["F"]) == set(update.tensors):
            f = last["F"]
        else:
            return False
        fw = {k: f[k] * np.asarray(update.tensors[k], dtype=np.float32) for k in f}
        self._put(update.device_id, f, fw)
        return True

    def _put(self, device_id: str, f: Tensors, fw: Tensors) -> None:
        total = float(sum(float(a.sum(dtype=np.float64)) for a in f.values()))
        self._sums.put(device_id, total, {"F": f, "FW": fw})
        self.totals[device_id] = total
        scale = self._sums.scale(device_id)
        if scale < 1.0:
            self._capped_log.event(
                "capped Fisher diagonals", logging.WARNING, "fedcurv: %s's Fisher diagonal (total "
                "%.4g) counts x%.3g: capped at %g times the other devices' median", device_id, total,
                scale, self._sums.multiple)
        self._arrays = None

    def forget(self, device_id: str) -> None:
        """Drop a device's contribution (e.g. it left the fleet for good)."""
        if device_id in self._sums:
            self._sums.remove(device_id)
            self.totals.pop(device_id, None)
            self._arrays = None

    def sums(self) -> Tuple[Optional[Tensors], Optional[Tensors]]:
        """``(U, V)`` as float32 (U clamped at 0), or ``(None, None)`` before any device reported."""
        if not len(self._sums):
            return None, None
        sums = self._sums.sums()
        return ({k: np.maximum(u, 0.0).astype(np.float32) for k, u in sums["F"].items()},
                {k: v.astype(np.float32) for k, v in sums["FW"].items()})

    def contribution(self, device_id: str) -> Optional[Tuple[Tensors, Tensors]]:
        """The device's ``(F_k, F_k * theta_k)`` as it sent them (before its cap), or None."""
        part = self._sums.part(device_id)
        return None if part is None else (part["F"], part["FW"])

    def scale(self, device_id: str) -> float:
        """The factor the device's contribution counts with (1: not capped)."""
        return self._sums.scale(device_id)

    def arrays(self) -> Dict[str, np.ndarray]:
        """Every contribution, keyed ``DEVICE_HEX/F/name`` and ``DEVICE_HEX/FW/name`` (the device id
        hex-encoded: any id is a safe key). By reference: contributions are replaced, never changed."""
        if self._arrays is None:
            self._arrays = {}
            for device_id, part in self._sums.items():
                tag = device_id.encode("utf-8").hex()
                self._arrays.update({"%s/F/%s" % (tag, k): a for k, a in part["F"].items()})
                self._arrays.update({"%s/FW/%s" % (tag, k): a for k, a in part["FW"].items()})
        return self._arrays

    def load(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Replace everything with the contributions ``arrays()`` returned (each capped against its
        peers again); ValueError (nothing changed) unless every device has F and FW for the same
        tensors and shapes, all finite, F >= 0."""
        parts: Dict[str, Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray]]] = {}
        for key, a in arrays.items():
            tag, kind, name = (key.split("/", 2) + ["", ""])[:3]
            try:
                device_id = bytes.fromhex(tag).decode("utf-8")
            except ValueError:
                raise ValueError("fedcurv: bad array key %r" % key) from None
            if kind not in ("F", "FW") or not name:
                raise ValueError("fedcurv: bad array key %r" % key)
            a = np.asarray(a, dtype=np.float32)
            if not np.isfinite(a).all() or (kind == "F" and (a < 0).any()):
                raise ValueError("fedcurv: %s is not finite%s" % (key, " and >= 0" if kind == "F" else ""))
            parts.setdefault(device_id, ({}, {}))[kind == "FW"][name] = a
        names = None
        for device_id, (f, fw) in parts.items():
            shapes = {k: v.shape for k, v in f.items()}
            if shapes != {k: v.shape for k, v in fw.items()} or (names is not None and shapes != names):
                raise ValueError("fedcurv: %s's saved F and F*theta do not match" % device_id)
            names = shapes
        self._sums.clear()
        self.totals = {}
        self._arrays = None
        for device_id, (f, fw) in parts.items():
            self._put(device_id, f, fw)


class FedCurvPlugin(CoordinatorPlugin):
    """Keeps the sums from every update's Fisher diagonal and broadcasts them with ``lambda2``."""

    name = "fedcurv"
    Config = FedCurvConfig

    def __init__(self, config: FedCurvConfig, fleet: FleetView, peers: Mapping[str, CoordinatorPlugin]):
        super().__init__(config, fleet, peers)
        self.sums = CurvatureSums(config.max_peer_multiple)
        #: When each contributing device's last update moved its part of the sums (not saved).
        self._updated_s: Dict[str, float] = {}
        #: ... and when its last Fisher diagonal came with it (not saved).
        self._diagonal_s: Dict[str, float] = {}

    def on_update_admitted(self, update: Update, now: float) -> Verdict:
        if self.sums.on_update(update):
            self._updated_s[update.device_id] = now
            diagonal = update.extras.get(CurvatureDiagonal.KIND)
            if isinstance(diagonal, CurvatureDiagonal) and set(diagonal.F) == set(update.tensors):
                self._diagonal_s[update.device_id] = now
        return ACCEPT

    def describe(self, now: float) -> MethodState:
        """Peers in U and V and how many count capped; per contributing device its Fisher total
        (the trace of its diagonal), the factor it counts with (1: not capped), and the age in
        seconds of its last contribution and of its last Fisher diagonal (devices send one every
        ``fisher_every_rounds``; None: not since the coordinator started)."""
        def age(seen: Dict[str, float], device_id: str) -> Optional[float]:
            t = seen.get(device_id)
            return None if t is None else round(max(0.0, now - t), 1)

        scales = {d: float(self.sums.scale(d)) for d in self.sums.totals}
        return MethodState(
            fleet={"peers": len(self.sums), "capped": sum(1 for s in scales.values() if s < 1.0)},
            devices={d: {"fisher_total": float(total), "counts_x": round(scales[d], 4),
                         "update_age_s": age(self._updated_s, d), "fisher_age_s": age(self._diagonal_s, d)}
                     for d, total in self.sums.totals.items()})

    def state_tensors(self) -> Optional[Dict[str, np.ndarray]]:
        return self.sums.arrays() or None

    def load_state_tensors(self, tensors: Mapping[str, np.ndarray]) -> None:
        self.sums.load(tensors)
        log.info("fedcurv: %d devices' contributions restored", len(self.sums))

    def before_publish(self) -> List[Extra]:
        u, v = self.sums.sums()
        return [CurvatureTerms(lambda2=float(self.config.penalty_strength),
                               fisher_samples=int(self.config.fisher_samples), U=u, V=v,
                               fisher_every=int(self.config.fisher_every_rounds))]
