"""The typed extra of Adaptive-FedAvg (Canonaco et al., IJCNN 2021): the devices' learning rate.

``AdaptiveLr`` rides in every global model of a fleet running the ``adaptive_lr`` plug-in once the
coordinator aggregated at least once. It carries the factor of the rule
``lr_t = lr0 * min(1, r^_t / t)`` (``scale``, in (0, 1]) and, where the coordinator's settings name
one, ``lr0``; without it ``lr0`` is the global model's own ``hparams.lr`` (the coordinator's
broadcast rate), which the device already has: ``lr_for(base_lr)`` is the rate to train with.

Why a factor and not the rate itself: a coordinator plug-in does not see the broadcast ``hparams``
(``FleetView`` has no such field), while the device reads them from the same global model, so the
rate is exact without the plug-in guessing ``lr0``. Both numbers have declared ranges (``BOUNDS``,
checked by the codec): the factor in [``MIN_SCALE``, 1], ``lr0`` in [``MIN_LR``, ``MAX_LR``]; the
device still clamps the rate to its own ``hparam_limits``.
"""
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

from streamfl.errors import ProtocolError
from streamfl.protocol.extras import Bound, Extra, Tensors, check_keys, get_float, register_extra

#: The largest ``lr0`` a model may announce (the coordinator's settings are bounded alike).
MAX_LR = 10.0
#: The smallest factor the coordinator sends: the wire refuses 0 (a rate of 0 trains nothing).
MIN_SCALE = 1e-12
#: The smallest ``lr0`` a model may announce: a rate must be > 0, and below 1e-12 a float32 weight
#: of any size no longer moves.
MIN_LR = 1e-12


@register_extra
@dataclass(frozen=True)
class AdaptiveLr(Extra):
    """Adaptive-FedAvg's learning rate in a global model: ``scale`` = min(1, r^_t / t) (or its
    floor) and ``lr0`` (None: the model's ``hparams.lr``)."""

    KIND = "adaptive_lr"
    BOUNDS = {
        "scale": Bound(MIN_SCALE, 1.0),     # min(1, r^_t / t), floored at MIN_SCALE by the coordinator
        "lr0": Bound(MIN_LR, MAX_LR),       # a learning rate, > 0 (MIN_LR), at most MAX_LR
    }

    scale: float
    lr0: Optional[float] = None

    def lr_for(self, base_lr: float) -> float:
        """The rate to train with: ``lr0`` (or ``base_lr``, the broadcast rate) times ``scale``."""
        return (self.lr0 if self.lr0 is not None else float(base_lr)) * self.scale

    def fields(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"scale": self.scale}
        if self.lr0 is not None:
            out["lr0"] = self.lr0
        return out

    @classmethod
    def parse(cls, fields: Mapping[str, Any], groups: Mapping[str, Tensors]) -> "AdaptiveLr":
        k = cls.KIND
        check_keys(k, fields, ("scale", "lr0"))
        if groups:
            raise ProtocolError("schema", "extras.%s: carries no tensors" % k)
        if "scale" not in fields:
            raise ProtocolError("schema", "extras.%s.scale: missing" % k)
        lr0 = get_float(k, fields, "lr0") if "lr0" in fields else None
        return cls(scale=get_float(k, fields, "scale"), lr0=lr0)


__all__ = ["AdaptiveLr", "MAX_LR", "MIN_SCALE", "MIN_LR"]
