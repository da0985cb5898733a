"""FedCurv on the coordinator (Shoham et al. 2019; DESIGN.md s8, "FedCurv / ST-EWC"): U and V, not peers.

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
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np

from streamfl.coordinator.plugins.base import CoordinatorPlugin, FleetView
from streamfl.protocol.extras import Extra
from streamfl.protocol.messages import Tensors, Update
from streamfl.protocol.payloads import CurvatureDiagonal, CurvatureTerms

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FedCurvConfig:
    """FedCurv's spatial penalty, broadcast to the devices with every global model.

    lambda2: penalty strength. Shoham et al. tune it per task and the AdaCLP paper gives none;
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
    """

    lambda2: float = 1.0
    fisher_samples: int = 20
    fisher_every_rounds: int = 1

    def __post_init__(self) -> None:
        if not self.lambda2 >= 0:
            raise ValueError("lambda2 must be >= 0, got %r" % (self.lambda2,))
        if self.fisher_samples < 1 or self.fisher_every_rounds < 1:
            raise ValueError("fisher_samples and fisher_every_rounds must be >= 1, got %r and %r"
                             % (self.fisher_samples, self.fisher_every_rounds))


class CurvatureSums:
    """U = sum_k F_k and V = sum_k F_k * theta_k over each device's latest Fisher-carrying update."""

    def __init__(self) -> None:
        self._last: Dict[str, Tuple[Tensors, Tensors]] = {}
        self._u: Dict[str, np.ndarray] = {}
        self._v: Dict[str, np.ndarray] = {}
        #: ``arrays()`` as last built (None: the contributions changed since).
        self._arrays: Optional[Dict[str, np.ndarray]] = None

    def __len__(self) -> int:
        """Devices whose contribution is in the sums."""
        return len(self._last)

    def on_update(self, update: Update) -> bool:
        """Fold the update's Fisher diagonal in, replacing the device's previous one; an update
        without one moves the device's ``F_k * theta_k`` to its new model under its last ``F_k``
        (devices estimate it every ``fisher_every_rounds``); False if the device has none."""
        diagonal = update.extras.get(CurvatureDiagonal.KIND)
        if isinstance(diagonal, CurvatureDiagonal) and set(diagonal.F) == set(update.tensors):
            f = {k: np.asarray(a, dtype=np.float32) for k, a in diagonal.F.items()}
        elif update.device_id in self._last and set(self._last[update.device_id][0]) == set(update.tensors):
            f = self._last[update.device_id][0]
        else:
            return False
        fw = {k: f[k] * np.asarray(update.tensors[k], dtype=np.float32) for k in f}
        old = self._last.pop(update.device_id, None)
        for name in f:
            u = self._u.setdefault(name, np.zeros(f[name].shape, dtype=np.float64))
            v = self._v.setdefault(name, np.zeros(f[name].shape, dtype=np.float64))
            if old is not None:
                u -= old[0][name]
                v -= old[1][name]
            u += f[name]
            v += fw[name]
        self._last[update.device_id] = (f, fw)
        self._arrays = None
        return True

    def forget(self, device_id: str) -> None:
        """Drop a device's contribution (e.g. it left the fleet for good)."""
        old = self._last.pop(device_id, None)
        if old is not None:
            self._arrays = None
            for name in old[0]:
                self._u[name] -= old[0][name]
                self._v[name] -= old[1][name]

    def sums(self) -> Tuple[Optional[Tensors], Optional[Tensors]]:
        """``(U, V)`` as float32 (U clamped at 0), or ``(None, None)`` before any device reported."""
        if not self._last:
            return None, None
        return ({k: np.maximum(u, 0.0).astype(np.float32) for k, u in self._u.items()},
                {k: v.astype(np.float32) for k, v in self._v.items()})

    def contribution(self, device_id: str) -> Optional[Tuple[Tensors, Tensors]]:
        """The device's ``(F_k, F_k * theta_k)`` in the sums, or None."""
        return self._last.get(device_id)

    def arrays(self) -> Dict[str, np.ndarray]:
        """Every contribution, keyed ``DEVICE_HEX/F/name`` and ``DEVICE_HEX/FW/name`` (the device id
        hex-encoded: any id is a safe key). By reference: contributions are replaced, never changed."""
        if self._arrays is None:
            self._arrays = {}
            for device_id, (f, fw) in self._last.items():
                tag = device_id.encode("utf-8").hex()
                self._arrays.update({"%s/F/%s" % (tag, k): a for k, a in f.items()})
                self._arrays.update({"%s/FW/%s" % (tag, k): a for k, a in fw.items()})
        return self._arrays

    def load(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Replace everything with the contributions ``arrays()`` returned; ValueError (nothing
        changed) unless every device has F and FW for the same tensors and shapes, all finite,
        F >= 0."""
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
        self._last, self._u, self._v, self._arrays = {}, {}, {}, None
        for device_id, (f, fw) in parts.items():
            for name in f:
                self._u[name] = self._u.get(name, 0.0) + f[name].astype(np.float64)
                self._v[name] = self._v.get(name, 0.0) + fw[name].astype(np.float64)
            self._last[device_id] = (f, fw)


class FedCurvPlugin(CoordinatorPlugin):
    """Keeps the sums from every update's Fisher diagonal and broadcasts them with ``lambda2``."""

    name = "fedcurv"
    Config = FedCurvConfig

    def __init__(self, config: FedCurvConfig, fleet: FleetView, peers: Mapping[str, CoordinatorPlugin]):
        super().__init__(config, fleet, peers)
        self.sums = CurvatureSums()

    def on_update(self, update: Update, now: float) -> None:
        self.sums.on_update(update)

    def state_tensors(self) -> Optional[Dict[str, np.ndarray]]:
        return self.sums.arrays() or None

    def load_state_tensors(self, tensors: Mapping[str, np.ndarray]) -> None:
        self.sums.load(tensors)
        log.info("fedcurv: %d devices' contributions restored", len(self.sums))

    def extras(self) -> List[Extra]:
        u, v = self.sums.sums()
        return [CurvatureTerms(lambda2=float(self.config.lambda2),
                               fisher_samples=int(self.config.fisher_samples), U=u, V=v,
                               fisher_every=int(self.config.fisher_every_rounds))]
