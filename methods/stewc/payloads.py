"""The typed extras of ST-EWC's temporal half (ST-EWC paper, sec. 4): periods, T-FDMs, drift.

``PeriodTerms`` rides in every global model of a fleet running the ``stewc`` plug-in: the current
period, lambda1, the running sums ``P = sum_t F^t`` and ``Q = sum_t F^t * theta*_t`` once a period
was consolidated, and, while the coordinator collects a period's T-FDM, which period that is (the
model carrying it is theta*_t). ``PeriodFisher`` is a device's local T-FDM ``F_k^t`` (eq. 8) with
its sample count ``n_k,t`` (eq. 9 weighs by it). ``DriftSignal`` is a device's input-drift count,
the signal a real fleet's coordinator can cut periods on.

Every number and every tensor group has a declared range (``BOUNDS``), checked at the boundary by
the codec: Fisher values >= 0 and bounded, sample counts and lambda1 bounded. A frame that parses is
still only as trusted as its sender; the coordinator clips what it folds in.
"""
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

import numpy as np

from streamfl.errors import ProtocolError
from streamfl.protocol.extras import (
    MAX_EXACT_INT, Bound, Extra, Tensors, check_keys, get_float, get_int, register_extra,
)
from streamfl.protocol.bounds import COUNTER, FISHER_DIAGONAL, FISHER_SUM, FISHER_WEIGHT_SUM, \
    FISHER_WINDOWS, LAMBDA


def _float32(tensors: Mapping[str, Any]) -> Tensors:
    """A tensor group as float32 arrays (its range is checked against ``BOUNDS`` after ``parse``)."""
    return {name: np.asarray(a, dtype=np.float32) for name, a in tensors.items()}


def _only(kind: str, groups: Mapping[str, Tensors], names) -> None:
    extra = sorted(set(groups) - set(names))
    if extra:
        raise ProtocolError("schema", "extras.%s: unexpected tensor groups %s" % (kind, extra))


@register_extra
@dataclass(frozen=True)
class PeriodTerms(Extra):
    """ST-EWC's temporal terms in a global model: ``period`` (0 first), ``lambda1``, the windows a
    device's T-FDM takes, ``consolidating`` (the period whose T-FDM devices compute at this model,
    None when none is being collected) and, after the first consolidation, ``P`` and ``Q``."""

    KIND = "periods"
    GROUPS = ("P", "Q")
    BOUNDS = {
        "period": COUNTER,                  # periods counted from 0
        "lambda1": LAMBDA,                  # the temporal pull's strength
        "fisher_samples": FISHER_WINDOWS,   # windows a device's T-FDM takes
        # an earlier period than ``period`` (checked in parse), so one below the counter's cap
        "consolidating": Bound(0, MAX_EXACT_INT - 1),
        "P": FISHER_SUM,                    # sum_t F^t over consolidated periods
        "Q": FISHER_WEIGHT_SUM,             # sum_t F^t * theta*_t
    }

    period: int
    lambda1: float
    fisher_samples: int
    consolidating: Optional[int] = None
    P: Optional[Tensors] = None
    Q: Optional[Tensors] = None

    def fields(self) -> Dict[str, Any]:
        out = {"period": self.period, "lambda1": self.lambda1, "fisher_samples": self.fisher_samples}
        if self.consolidating is not None:
            out["consolidating"] = self.consolidating
        return out

    def groups(self) -> Dict[str, Tensors]:
        return {} if self.P is None else {"P": self.P, "Q": self.Q}

    @classmethod
    def parse(cls, fields: Mapping[str, Any], groups: Mapping[str, Tensors]) -> "PeriodTerms":
        k = cls.KIND
        check_keys(k, fields, ("period", "lambda1", "fisher_samples", "consolidating"))
        _only(k, groups, cls.GROUPS)
        if ("P" in groups) != ("Q" in groups):
            raise ProtocolError("schema", "extras.%s: P and Q travel together" % k)
        period = get_int(k, fields, "period")
        consolidating = fields.get("consolidating")
        if consolidating is not None:
            consolidating = get_int(k, fields, "consolidating")
            if consolidating >= period:
                raise ProtocolError("schema", "extras.%s.consolidating must be an earlier period "
                                              "than %d, got %d" % (k, period, consolidating))
        P = Q = None
        if "P" in groups:
            P, Q = _float32(groups["P"]), _float32(groups["Q"])
            if {n: a.shape for n, a in P.items()} != {n: a.shape for n, a in Q.items()}:
                raise ProtocolError("schema", "extras.%s: P and Q differ in tensors or shapes" % k)
        return cls(period=period, lambda1=get_float(k, fields, "lambda1"),
                   fisher_samples=get_int(k, fields, "fisher_samples"), consolidating=consolidating, P=P, Q=Q)


@register_extra
@dataclass(frozen=True)
class PeriodFisher(Extra):
    """A device's local T-FDM ``F_k^t`` (ST-EWC eq. 8) at theta*_t, for period ``period``, from
    ``samples`` windows of its data (``n_k,t``: eq. 9's weight), in its update."""

    KIND = "period_fisher"
    GROUPS = ("F",)
    BOUNDS = {
        "period": COUNTER,                  # the period this T-FDM is for
        # n_k,t, eq. 9's weight: windows the T-FDM took, >= 1 (a weight of 0 divides by 0); a board
        # uses fisher_samples of them (100), so 10^7 is generous; 10^9 owned a fleet's P
        "samples": Bound(1, 10 ** 7),
        "F": FISHER_DIAGONAL,               # F_k^t, mean squared gradients
    }

    period: int
    samples: int
    F: Tensors

    def fields(self) -> Dict[str, Any]:
        return {"period": self.period, "samples": self.samples}

    def groups(self) -> Dict[str, Tensors]:
        return {"F": self.F}

    @classmethod
    def parse(cls, fields: Mapping[str, Any], groups: Mapping[str, Tensors]) -> "PeriodFisher":
        k = cls.KIND
        check_keys(k, fields, ("period", "samples"))
        _only(k, groups, cls.GROUPS)
        if "F" not in groups:
            raise ProtocolError("schema", "extras.%s: missing tensor group F" % k)
        return cls(period=get_int(k, fields, "period"), samples=get_int(k, fields, "samples"),
                   F=_float32(groups["F"]))


@register_extra
@dataclass(frozen=True)
class DriftSignal(Extra):
    """A device's input drift (``methods/stewc/drift.py``): how many drifts it has detected since it
    started, and the last shift statistic; in updates and in the telemetry of a skipping device."""

    KIND = "drift"
    BOUNDS = {
        "drifts": COUNTER,                  # drifts detected since the device started
        # a distance in units of the reference's spread (floored at 1e-12): a stationary stream
        # gives about 0.25, a drift over 0.6; 1e18 is a jump of 10^6 sensor units from a constant
        # reference, beyond any sensor's range; only logged, never summed
        "shift": Bound(0.0, 1e18),
    }

    drifts: int
    shift: float = 0.0

    def fields(self) -> Dict[str, Any]:
        return {"drifts": self.drifts, "shift": self.shift}

    @classmethod
    def parse(cls, fields: Mapping[str, Any], groups: Mapping[str, Tensors]) -> "DriftSignal":
        k = cls.KIND
        check_keys(k, fields, ("drifts", "shift"))
        _only(k, groups, ())
        shift = get_float(k, fields, "shift", optional=True)
        return cls(drifts=get_int(k, fields, "drifts"), shift=shift or 0.0)
