"""The typed extras of today's plug-ins: AdaCLP's CLP state and Fisher trace, FedCurv's curvature,
the device scheduler's request and the devices' scheduling statistics.

Each is registered with the codec (``register_extra``) so that every side decodes it to the same
class; the plug-ins that produce and consume them live in ``coordinator/plugins`` and
``agent/plugins``. Each declares the range of every number it carries (``BOUNDS``, checked by the
codec; the one-line reasons sit next to them). Formulas: AdaCLP eq. 1-6; FedCurv's U/V sums.
"""
import math
from dataclasses import asdict, dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from streamfl.errors import ProtocolError
from streamfl.protocol.extras import (
    MAX_EXACT_INT, Bound, Extra, Tensors, check_keys, get_bool, get_float, get_int, register_extra,
)

#: A Fisher trace (AdaCLP eq. 1) is a sum of squared gradients over the model: >= 0. Honest traces
#: of the models here are tens to thousands (an MLP's about 24); 1e8 leaves four orders of margin
#: and still keeps one forged trace from moving a fleet's F_G by more than that (a trace of 1e9
#: flipped a fleet's CLP flag).
FISHER_TRACE = Bound(0.0, 1e8)
#: A Fisher diagonal element is a mean of squared gradients of one weight: >= 0; a gradient
#: element of 100 squares to 1e4, the same cap admission puts on a weight (max_abs_value 1e4).
FISHER_DIAGONAL = Bound(0.0, 1e4)
#: Sums of devices' diagonals (FedCurv's U) or of periods' T-FDMs (ST-EWC's P): 10^4 devices or
#: periods at the diagonal's cap.
FISHER_SUM = Bound(0.0, 1e8)
#: Sums of diagonal times weights (V, Q): the sum's cap times admission's weight cap (1e4), either sign.
FISHER_WEIGHT_SUM = Bound(-1e12, 1e12)
#: A penalty strength (FedCurv's lambda2, ST-EWC's lambda1): >= 0; the defaults are 1 and 10 and
#: 1e3 already holds a model still, so 1e4 only stops a forged pull from blowing up training.
LAMBDA = Bound(0.0, 1e4)
#: Windows a device estimates a Fisher on (one backward each): at least one; a million is more
#: than a board's buffer holds, so it bounds the work a model can order.
FISHER_WINDOWS = Bound(1, 10 ** 6)
#: Versions, periods, segments, frames, sessions: counters from 0, exact as JSON numbers.
COUNTER = Bound(0, MAX_EXACT_INT)


@register_extra
@dataclass(frozen=True)
class ClpState(Extra):
    """The coordinator's CLP probe after an aggregation (AdaCLP eq. 2-3, sec. 3.2), in every model.

    ``regulating`` False tells devices to keep the coordinator's hyper-parameters (after R_end, or
    when only the flag is broadcast, as for CriticalFL); ``in_clp`` drives CLP-aware clocks.
    """

    KIND = "clp"
    BOUNDS = {
        "version": COUNTER,                 # the coordinator's model version
        "fisher_global": FISHER_TRACE,      # F_G, a decayed mean of the devices' traces
        "fisher_global_prev": FISHER_TRACE,  # F_G one aggregation back
        "segment": COUNTER,                 # segments counted from 0
        "segment_start_version": COUNTER,   # a model version
        "fisher_segment_start": FISHER_TRACE,  # F_G when the segment started
        "fisher_reference": FISHER_TRACE,   # F_G's warm-up mean
    }

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
    """A device's Fisher-information trace at its trained model (AdaCLP eq. 1), in its update."""

    KIND = "fisher_trace"
    BOUNDS = {"value": FISHER_TRACE}  # a sum of squared gradients (FISHER_TRACE)

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
    GROUPS = ("U", "V")
    BOUNDS = {
        "lambda2": LAMBDA,                  # the penalty's strength
        "fisher_samples": FISHER_WINDOWS,   # windows a device's diagonal takes
        "fisher_every": Bound(1, 10 ** 6),  # rounds between estimates: 1 (every round) and up
        "U": FISHER_SUM,                    # sum_k F_k
        "V": FISHER_WEIGHT_SUM,             # sum_k F_k * theta_k
    }

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
        got = _groups(k, groups, cls.GROUPS)
        if len(got) == 1:
            raise ProtocolError("schema", "extras.%s: U and V travel together" % k)
        return cls(lambda2=get_float(k, fields, "lambda2"), fisher_samples=get_int(k, fields, "fisher_samples"),
                   U=got.get("U"), V=got.get("V"), fisher_every=get_int(k, fields, "fisher_every", default=1))


@register_extra
@dataclass(frozen=True)
class CurvatureDiagonal(Extra):
    """A device's diagonal Fisher ``F_k`` at its trained model (FedCurv), in its update."""

    KIND = "curvature_diagonal"
    GROUPS = ("F",)
    BOUNDS = {"F": FISHER_DIAGONAL}  # mean squared gradients (FISHER_DIAGONAL); 1e30 NaN'd a fleet

    F: Tensors

    def groups(self) -> Dict[str, Tensors]:
        return {"F": self.F}

    @classmethod
    def parse(cls, fields: Mapping[str, Any], groups: Mapping[str, Tensors]) -> "CurvatureDiagonal":
        check_keys(cls.KIND, fields, ())
        got = _groups(cls.KIND, groups, cls.GROUPS)
        if "F" not in got:
            raise ProtocolError("schema", "extras.%s: missing tensor group F" % cls.KIND)
        return cls(F={name: np.asarray(a, dtype=np.float32) for name, a in got["F"].items()})


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
