"""AdaCLP's typed extras: the probe's CLP state on the global model and a device's Fisher trace.

Registered with the codec (``register_extra``) when the method loads; every number carries its
range (``BOUNDS``, checked by the codec).
"""
from dataclasses import asdict, dataclass
from typing import Any, Dict, Mapping, Optional

from streamfl.errors import ProtocolError
from streamfl.protocol.extras import (
    Extra, Tensors, check_keys, get_bool, get_float, get_int, register_extra,
)
from streamfl.protocol.bounds import COUNTER, FISHER_TRACE


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

