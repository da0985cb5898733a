"""The typed extras of today's plug-ins: AdaCLP's CLP state and Fisher trace, FedCurv's curvature.

Each is registered with the codec (``register_extra``) so that every side decodes it to the same
class; the plug-ins that produce and consume them live in ``coordinator/plugins`` and
``agent/plugins``. Formulas: DESIGN.md section 8 (AdaCLP eq. 1-6; FedCurv's U/V sums).
"""
from dataclasses import asdict, dataclass
from typing import Any, Dict, Mapping, Optional

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

    def fields(self) -> Dict[str, Any]:
        return {"lambda2": self.lambda2, "fisher_samples": self.fisher_samples}

    def groups(self) -> Dict[str, Tensors]:
        return {} if self.U is None else {"U": self.U, "V": self.V}

    @property
    def active(self) -> bool:
        """A penalty is to be applied (lambda2 > 0)."""
        return self.lambda2 > 0

    @classmethod
    def parse(cls, fields: Mapping[str, Any], groups: Mapping[str, Tensors]) -> "CurvatureTerms":
        k = cls.KIND
        check_keys(k, fields, ("lambda2", "fisher_samples"))
        lambda2 = get_float(k, fields, "lambda2")
        if lambda2 < 0:
            raise ProtocolError("schema", "extras.%s.lambda2 must be >= 0, got %r" % (k, lambda2))
        got = _groups(k, groups, ("U", "V"))
        if len(got) == 1:
            raise ProtocolError("schema", "extras.%s: U and V travel together" % k)
        return cls(lambda2=lambda2, fisher_samples=get_int(k, fields, "fisher_samples", minimum=1),
                   U=got.get("U"), V=got.get("V"))


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
        return cls(F={name: np.asarray(a, dtype=np.float32) for name, a in got["F"].items()})
