"""The typed extras of ST-EWC's temporal half (st-ewc.txt; DESIGN.md s8): periods, T-FDMs, drift.

``PeriodTerms`` rides in every global model of a fleet running the ``stewc`` plug-in: the current
period, lambda1, the running sums ``P = sum_t F^t`` and ``Q = sum_t F^t * theta*_t`` once a period
was consolidated, and, while the coordinator collects a period's T-FDM, which period that is (the
model carrying it is theta*_t). ``PeriodFisher`` is a device's local T-FDM ``F_k^t`` (eq. 8) with
its sample count ``n_k,t`` (eq. 9 weighs by it). ``DriftSignal`` is a device's input-drift count,
the signal a real fleet's coordinator can cut periods on.

Every tensor group is checked here, at the boundary: finite and, for Fisher values, >= 0. A frame
that parses is still only as trusted as its sender; the coordinator clips what it folds in.
"""
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

import numpy as np

from streamfl.errors import ProtocolError
from streamfl.protocol.extras import Extra, Tensors, check_keys, get_float, get_int, register_extra


def _checked(kind: str, group: str, tensors: Mapping[str, Any], nonnegative: bool) -> Tensors:
    """float32 copies of a tensor group; ProtocolError if any value is not finite (or negative)."""
    out = {}
    for name, a in tensors.items():
        a = np.asarray(a, dtype=np.float32)
        if not np.isfinite(a).all() or (nonnegative and (a < 0).any()):
            raise ProtocolError("schema", "extras.%s.%s.%s: expected finite values%s"
                                % (kind, group, name, " >= 0" if nonnegative else ""))
        out[name] = a
    return out


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
        _only(k, groups, ("P", "Q"))
        if ("P" in groups) != ("Q" in groups):
            raise ProtocolError("schema", "extras.%s: P and Q travel together" % k)
        lambda1 = get_float(k, fields, "lambda1")
        if lambda1 < 0:
            raise ProtocolError("schema", "extras.%s.lambda1 must be >= 0, got %r" % (k, lambda1))
        period = get_int(k, fields, "period", minimum=0)
        consolidating = fields.get("consolidating")
        if consolidating is not None:
            consolidating = get_int(k, fields, "consolidating", minimum=0)
            if consolidating >= period:
                raise ProtocolError("schema", "extras.%s.consolidating must be an earlier period "
                                              "than %d, got %d" % (k, period, consolidating))
        P = Q = None
        if "P" in groups:
            P = _checked(k, "P", groups["P"], nonnegative=True)
            Q = _checked(k, "Q", groups["Q"], nonnegative=False)
            if {n: a.shape for n, a in P.items()} != {n: a.shape for n, a in Q.items()}:
                raise ProtocolError("schema", "extras.%s: P and Q differ in tensors or shapes" % k)
        return cls(period=period, lambda1=lambda1,
                   fisher_samples=get_int(k, fields, "fisher_samples", minimum=1),
                   consolidating=consolidating, P=P, Q=Q)


@register_extra
@dataclass(frozen=True)
class PeriodFisher(Extra):
    """A device's local T-FDM ``F_k^t`` (ST-EWC eq. 8) at theta*_t, for period ``period``, from
    ``samples`` windows of its data (``n_k,t``: eq. 9's weight), in its update."""

    KIND = "period_fisher"

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
        _only(k, groups, ("F",))
        if "F" not in groups:
            raise ProtocolError("schema", "extras.%s: missing tensor group F" % k)
        return cls(period=get_int(k, fields, "period", minimum=0),
                   samples=get_int(k, fields, "samples", minimum=1),
                   F=_checked(k, "F", groups["F"], nonnegative=True))


@register_extra
@dataclass(frozen=True)
class DriftSignal(Extra):
    """A device's input drift (``agent/drift.py``): how many drifts it has detected since it
    started, and the last shift statistic; in updates and in the telemetry of a skipping device."""

    KIND = "drift"

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
        if shift is not None and shift < 0:
            raise ProtocolError("schema", "extras.%s.shift must be >= 0, got %r" % (k, shift))
        return cls(drifts=get_int(k, fields, "drifts", minimum=0), shift=shift or 0.0)
