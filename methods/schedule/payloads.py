"""FedTeddi's typed extras: the scheduler's request on the global model and a device's scheduling
statistics (in updates and in the telemetry of a device told to skip).

Registered with the codec (``register_extra``) when the method loads; every number carries its
range (``BOUNDS``, checked by the codec).
"""
import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple


from streamfl.errors import ProtocolError
from streamfl.protocol.extras import (
    Bound, Extra, Tensors, check_keys, get_bool, get_float, get_int, register_extra,
)
from streamfl.protocol.bounds import COUNTER


#: Most classes a scheduling report may list (a report is bounded whatever its sender claims).
MAX_REPORT_CLASSES = 4096


def _float_list(kind: str, fields: Mapping[str, Any], key: str, integers: bool = False) -> Tuple[Any, ...]:
    """A list of finite numbers (integers when ``integers``), at most MAX_REPORT_CLASSES long."""
    value = fields.get(key, [])
    if not isinstance(value, list) or len(value) > MAX_REPORT_CLASSES:
        raise ProtocolError("schema", "extras.%s.%s: expected a list of at most %d numbers"
                            % (kind, key, MAX_REPORT_CLASSES))
    out = []
    for x in value:
        ok = type(x) is int if integers else type(x) in (int, float)
        try:
            ok = ok and (integers or math.isfinite(x))
        except OverflowError:  # an integer beyond float range
            ok = False
        if not ok:
            raise ProtocolError("schema", "extras.%s.%s: expected %s, got %r"
                                % (kind, key, "integers" if integers else "finite numbers", x))
        out.append(int(x) if integers else float(x))
    return tuple(out)


@register_extra
@dataclass(frozen=True)
class ScheduleRequest(Extra):
    """In a global model: a scheduler picks who trains, so devices report their statistics
    (``ScheduleStats``) with every update and, while told to skip, in their telemetry;
    ``class_gradients`` asks for the per-class gradient norms too (a few backward passes)."""

    KIND = "schedule"

    class_gradients: bool = True

    def fields(self) -> Dict[str, Any]:
        return {"class_gradients": self.class_gradients}

    @classmethod
    def parse(cls, fields: Mapping[str, Any], groups: Mapping[str, Tensors]) -> "ScheduleRequest":
        check_keys(cls.KIND, fields, ("class_gradients",))
        if groups:
            raise ProtocolError("schema", "extras.%s carries no tensors" % cls.KIND)
        return cls(class_gradients=get_bool(cls.KIND, fields, "class_gradients", True))


@register_extra
@dataclass(frozen=True)
class ScheduleStats(Extra):
    """A device's scheduling statistics (FedTeddi Alg. 1 lines 5-11): its buffer's class counts now
    and at its previous frame, its frame number, and, from its last trained round, per-class
    gradient norms (eq. 18; empty when not computed), the gradient variance and norm, the start
    loss, and its channel's P|H|^2/N0 in Hz where the board knows it."""

    KIND = "schedule_stats"
    BOUNDS = {
        "counts": Bound(0, 10 ** 7),        # windows per class in a board's buffer (thousands)
        "prev_counts": Bound(0, 10 ** 7),   # the same at the previous frame
        "frame": COUNTER,                   # frames counted from 0
        "class_grad_norms": Bound(0.0, 1e6),  # L2 norms (eq. 18); honest ones are below 1e3
        "grad_var": Bound(0.0, 1e12),       # a variance of gradients: the norm's cap squared
        "grad_norm": Bound(0.0, 1e6),       # an L2 norm of the round's gradient
        "loss": Bound(0.0, 1e6),            # a cross-entropy: ln(classes) at start, >= 0
        # P|H|^2/N0 in Hz: a 1 W radio 1 m from its receiver over -174 dBm/Hz noise is ~3e16
        "snr_hz": Bound(0.0, 1e18),
    }

    counts: Tuple[int, ...]
    prev_counts: Tuple[int, ...]
    frame: int = 0
    class_grad_norms: Tuple[float, ...] = ()
    grad_var: Optional[float] = None
    grad_norm: Optional[float] = None
    loss: Optional[float] = None
    snr_hz: Optional[float] = None

    def fields(self) -> Dict[str, Any]:
        out = {"counts": list(self.counts), "prev_counts": list(self.prev_counts), "frame": self.frame,
               "class_grad_norms": list(self.class_grad_norms)}
        for key in ("grad_var", "grad_norm", "loss", "snr_hz"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    @classmethod
    def parse(cls, fields: Mapping[str, Any], groups: Mapping[str, Tensors]) -> "ScheduleStats":
        k = cls.KIND
        check_keys(k, fields, ("counts", "prev_counts", "frame", "class_grad_norms", "grad_var",
                               "grad_norm", "loss", "snr_hz"))
        if groups:
            raise ProtocolError("schema", "extras.%s carries no tensors" % k)
        counts = _float_list(k, fields, "counts", integers=True)
        prev = _float_list(k, fields, "prev_counts", integers=True)
        norms = _float_list(k, fields, "class_grad_norms")
        if len(prev) != len(counts) or (norms and len(norms) != len(counts)):
            raise ProtocolError("schema", "extras.%s: counts, prev_counts and class_grad_norms differ "
                                          "in length" % k)
        optional = {key: get_float(k, fields, key, optional=True)
                    for key in ("grad_var", "grad_norm", "loss", "snr_hz")}
        return cls(counts=counts, prev_counts=prev, frame=get_int(k, fields, "frame"),
                   class_grad_norms=norms, **optional)
