"""The typed extras of today's plug-ins: AdaCLP's CLP state and Fisher trace, FedCurv's curvature,
the device scheduler's request and the devices' scheduling statistics.

Each is registered with the codec (``register_extra``) so that every side decodes it to the same
class; the plug-ins that produce and consume them live in ``coordinator/plugins`` and
``agent/plugins``. Formulas: DESIGN.md section 8 (AdaCLP eq. 1-6; FedCurv's U/V sums).
"""
import math
from dataclasses import asdict, dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from streamfl.errors import ProtocolError
from streamfl.protocol.extras import (
    Extra, Tensors, check_keys, get_bool, get_float, get_int, register_extra,
)


@register_extra
@dataclass(frozen=True)
class ClpState(Extra):
    """The coordinator's CLP probe after an aggregation (AdaCLP eq. 2-3, sec. 3.2), in every model.

    ``regulating`` False tells devices to keep the coordinator's hyper-parameters (after R_end, or
    when only the flag is broadcast, as for CriticalFL); ``in_clp`` drives CLP-aware clocks.
    """

    KIND = "clp"

    version: int
    fisher_global: Optional[float]
    fisher_global_prev: Optional[float]
    in_clp: bool
    segment: int
    segment_start_version: int
    regulating: bool
    #: F_G when the current segment started (first traced value if it started untraced).
    fisher_segment_start: Optional[float] = None
    #: F_G's warm-up reference: its mean over the run's first traced aggregations (the scale
    #: eq. 4-5 can read F_G against, ``fisher_reference: warmup``); None until it is known.
    fisher_reference: Optional[float] = None

    def fields(self) -> Dict[str, Any]:
        out = asdict(self)
        if out["fisher_reference"] is None:  # absent, as agents from before it expect
            del out["fisher_reference"]
        return out

    def as_dict(self) -> Dict[str, Any]:
        """JSON-able dict (None for an estimate not yet available), as metrics records carry it."""
        return asdict(self)

    @classmethod
    def parse(cls, fields: Mapping[str, Any], groups: Mapping[str, Tensors]) -> "ClpState":
        k = cls.KIND
        check_keys(k, fields, cls.__dataclass_fields__)
        if groups:
            raise ProtocolError("schema", "extras.%s carries no tensors" % k)
        return cls(version=get_int(k, fields, "version"),
                   fisher_global=get_float(k, fields, "fisher_global", optional=True),
                   fisher_global_prev=get_float(k, fields, "fisher_global_prev", optional=True),
                   in_clp=get_bool(k, fields, "in_clp"), segment=get_int(k, fields, "segment"),
                   segment_start_version=get_int(k, fields, "segment_start_version"),
                   regulating=get_bool(k, fields, "regulating"),
                   fisher_segment_start=get_float(k, fields, "fisher_segment_start", optional=True),
                   fisher_reference=get_float(k, fields, "fisher_reference", optional=True))


@register_extra
@dataclass(frozen=True)
class FisherTrace(Extra):
    """A device's Fisher-information trace at its trained model (AdaCLP eq. 1), in its update.

    Any finite number parses; the coordinator's probe treats a negative one as missing (logged).
    """

    KIND = "fisher_trace"

    value: float

    def fields(self) -> Dict[str, Any]:
        return {"value": self.value}

    @classmethod
    def parse(cls, fields: Mapping[str, Any], groups: Mapping[str, Tensors]) -> "FisherTrace":
        check_keys(cls.KIND, fields, ("value",))
        if groups:
            raise ProtocolError("schema", "extras.%s carries no tensors" % cls.KIND)
        return cls(value=get_float(cls.KIND, fields, "value"))


def _groups(kind: str, groups: Mapping[str, Tensors], names: Any) -> Dict[str, Tensors]:
    extra = sorted(set(groups) - set(names))
    if extra:
        raise ProtocolError("schema", "extras.%s: unexpected tensor groups %s" % (kind, extra))
    return {name: dict(groups[name]) for name in names if name in groups}


@register_extra
@dataclass(frozen=True)
class CurvatureTerms(Extra):
    """FedCurv's terms in a global model: ``lambda2``, how many windows a device's Fisher diagonal
    takes, and, once any device reported one, ``U = sum_k F_k`` and ``V = sum_k F_k * theta_k``."""

    KIND = "curvature"

    lambda2: float
    fisher_samples: int
    U: Optional[Tensors] = None
    V: Optional[Tensors] = None
    #: A device estimates its diagonal every this many of its rounds (1: every round).
    fisher_every: int = 1

    def fields(self) -> Dict[str, Any]:
        out = {"lambda2": self.lambda2, "fisher_samples": self.fisher_samples}
        if self.fisher_every != 1:  # absent, as agents from before it expect
            out["fisher_every"] = self.fisher_every
        return out

    def groups(self) -> Dict[str, Tensors]:
        return {} if self.U is None else {"U": self.U, "V": self.V}

    @property
    def active(self) -> bool:
        """A penalty is to be applied (lambda2 > 0)."""
        return self.lambda2 > 0

    @classmethod
    def parse(cls, fields: Mapping[str, Any], groups: Mapping[str, Tensors]) -> "CurvatureTerms":
        k = cls.KIND
        check_keys(k, fields, ("lambda2", "fisher_samples", "fisher_every"))
        lambda2 = get_float(k, fields, "lambda2")
        if lambda2 < 0:
            raise ProtocolError("schema", "extras.%s.lambda2 must be >= 0, got %r" % (k, lambda2))
        got = _groups(k, groups, ("U", "V"))
        if len(got) == 1:
            raise ProtocolError("schema", "extras.%s: U and V travel together" % k)
        return cls(lambda2=lambda2, fisher_samples=get_int(k, fields, "fisher_samples", minimum=1),
                   U=got.get("U"), V=got.get("V"),
                   fisher_every=get_int(k, fields, "fisher_every", default=1, minimum=1))


@register_extra
@dataclass(frozen=True)
class CurvatureDiagonal(Extra):
    """A device's diagonal Fisher ``F_k`` at its trained model (FedCurv), in its update."""

    KIND = "curvature_diagonal"

    F: Tensors

    def groups(self) -> Dict[str, Tensors]:
        return {"F": self.F}

    @classmethod
    def parse(cls, fields: Mapping[str, Any], groups: Mapping[str, Tensors]) -> "CurvatureDiagonal":
        check_keys(cls.KIND, fields, ())
        got = _groups(cls.KIND, groups, ("F",))
        if "F" not in got:
            raise ProtocolError("schema", "extras.%s: missing tensor group F" % cls.KIND)
        F = {name: np.asarray(a, dtype=np.float32) for name, a in got["F"].items()}
        if not all(np.isfinite(a).all() and (a >= 0).all() for a in F.values()):
            # A NaN or negative diagonal would poison every device's U and V.
            raise ProtocolError("schema", "extras.%s.F: expected finite values >= 0" % cls.KIND)
        return cls(F=F)


#: Most classes a scheduling report may list (a report is bounded whatever its sender claims).
MAX_REPORT_CLASSES = 4096


def _float_list(kind: str, fields: Mapping[str, Any], key: str, integers: bool = False) -> Tuple[Any, ...]:
    """A list of finite numbers >= 0 (integers when ``integers``), at most MAX_REPORT_CLASSES long."""
    value = fields.get(key, [])
    if not isinstance(value, list) or len(value) > MAX_REPORT_CLASSES:
        raise ProtocolError("schema", "extras.%s.%s: expected a list of at most %d numbers"
                            % (kind, key, MAX_REPORT_CLASSES))
    out = []
    for x in value:
        ok = type(x) is int if integers else type(x) in (int, float)
        try:
            ok = ok and math.isfinite(x) and x >= 0
        except OverflowError:
            ok = False
        if not ok:
            raise ProtocolError("schema", "extras.%s.%s: expected %s >= 0, got %r"
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
        optional = {}
        for key in ("grad_var", "grad_norm", "loss", "snr_hz"):
            value = get_float(k, fields, key, optional=True)
            if value is not None and value < 0:
                raise ProtocolError("schema", "extras.%s.%s must be >= 0, got %r" % (k, key, value))
            optional[key] = value
        return cls(counts=counts, prev_counts=prev, frame=get_int(k, fields, "frame"),
                   class_grad_norms=norms, **optional)
