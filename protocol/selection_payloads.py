"""Typed extras of the methods that choose which windows a board keeps (SFedPO, importance sampling).

- ``SfedpoTerms`` (global model, ``sfedpo``): SFedPO runs (sfedpo.txt sec. 5). Whether DDS admits
  windows by state (``dds``), whether the coordinator weighs updates by SAW (``saw``: devices then
  report s_n and q_n), the sampling budget alpha_n and eq. 10's a1, b1, eq. 12's G and
  L eta sigma^2, and the fleet's state frequencies w_m (``states`` with ``weights``) where devices
  share state ids.
- ``SfedpoReport`` (update): the device's heterogeneity score s_n (eq. 12), its availability q_n,
  the windows it saw per state (the coordinator's w_m), whether its state ids are shared, and the
  share of windows its full buffer admitted.
- ``ImportanceTerms`` (global model, ``importance``): the importance-sampling baseline runs, with
  its budget (the mean admission probability) and how many random slots an eviction compares.

Every list is bounded (``MAX_STATES``) and every number checked: a report is hostile until parsed,
and the coordinator bounds what it does with the values as well.
"""
import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from streamfl.errors import ProtocolError
from streamfl.protocol.extras import Extra, Tensors, check_keys, get_bool, get_float, get_int, register_extra

#: Most states a model or report may list (the agent tracks at most as many).
MAX_STATES = 1024
#: Bound on a reported heterogeneity score (eq. 12 is a few units for any sane inputs).
MAX_SCORE = 1e6


def _no_tensors(kind: str, groups: Mapping[str, Tensors]) -> None:
    if groups:
        raise ProtocolError("schema", "extras.%s: carries no tensors" % kind)


def _bounded(kind: str, fields: Mapping[str, Any], key: str, lo: float, hi: float,
             open_lo: bool = False) -> float:
    """A finite number in [lo, hi] ((lo, hi] with ``open_lo``)."""
    value = get_float(kind, fields, key)
    if value > hi or value < lo or (open_lo and value == lo):
        raise ProtocolError("schema", "extras.%s.%s: expected a number in %s%g, %g], got %r"
                            % (kind, key, "(" if open_lo else "[", lo, hi, value))
    return value


def _states(kind: str, fields: Mapping[str, Any], key: str, values: str,
            integers: bool) -> Tuple[Tuple[int, ...], Tuple[Any, ...]]:
    """Parallel lists ``key`` (distinct state ids >= 0) and ``values`` (numbers >= 0), bounded."""
    ids, vals = fields.get(key, []), fields.get(values, [])
    if not isinstance(ids, list) or not isinstance(vals, list) or len(ids) != len(vals) \
            or len(ids) > MAX_STATES:
        raise ProtocolError("schema", "extras.%s.%s/%s: expected two lists of equal length <= %d"
                            % (kind, key, values, MAX_STATES))
    for s in ids:
        if type(s) is not int or s < 0:
            raise ProtocolError("schema", "extras.%s.%s: expected state ids >= 0, got %r" % (kind, key, s))
    if len(set(ids)) != len(ids):
        raise ProtocolError("schema", "extras.%s.%s: a state is listed twice" % (kind, key))
    for v in vals:
        ok = type(v) is int if integers else type(v) in (int, float)
        if not ok or not math.isfinite(v) or v < 0:
            raise ProtocolError("schema", "extras.%s.%s: expected %s >= 0, got %r"
                                % (kind, values, "integers" if integers else "finite numbers", v))
    return tuple(ids), tuple(int(v) if integers else float(v) for v in vals)


@register_extra
@dataclass(frozen=True)
class SfedpoTerms(Extra):
    """SFedPO's settings for the fleet, in the global model (module docstring)."""

    KIND = "sfedpo"

    dds: bool = True
    saw: bool = True
    budget: float = 0.5
    a1: float = 0.15
    b1: float = 0.25
    g: float = 1.0
    l_eta_sigma2: float = 0.0
    states: Tuple[int, ...] = ()
    weights: Tuple[float, ...] = ()

    def fields(self) -> Dict[str, Any]:
        return {"dds": self.dds, "saw": self.saw, "budget": self.budget, "a1": self.a1, "b1": self.b1,
                "g": self.g, "l_eta_sigma2": self.l_eta_sigma2, "states": list(self.states),
                "weights": list(self.weights)}

    @property
    def state_weights(self) -> Dict[int, float]:
        """``{state: w_m}`` (empty until the fleet has counted states)."""
        return dict(zip(self.states, self.weights))

    @classmethod
    def parse(cls, fields: Mapping[str, Any], groups: Mapping[str, Tensors]) -> "SfedpoTerms":
        k = cls.KIND
        check_keys(k, fields, ("dds", "saw", "budget", "a1", "b1", "g", "l_eta_sigma2", "states", "weights"))
        _no_tensors(k, groups)
        states, weights = _states(k, fields, "states", "weights", integers=False)
        budget = _bounded(k, fields, "budget", 0.0, 1.0, open_lo=True)
        if budget == 1.0:
            raise ProtocolError("schema", "extras.%s.budget: expected a number below 1" % k)
        return cls(dds=get_bool(k, fields, "dds", True), saw=get_bool(k, fields, "saw", True),
                   budget=budget, a1=_bounded(k, fields, "a1", 0.0, 100.0),
                   b1=_bounded(k, fields, "b1", -100.0, 100.0), g=_bounded(k, fields, "g", 0.0, 100.0),
                   l_eta_sigma2=_bounded(k, fields, "l_eta_sigma2", 0.0, 100.0),
                   states=states, weights=weights)


@register_extra
@dataclass(frozen=True)
class SfedpoReport(Extra):
    """A device's SAW inputs with its update: s_n, q_n, its state counts (module docstring)."""

    KIND = "sfedpo_report"

    score: float
    availability: float
    shared_ids: bool = False
    states: Tuple[int, ...] = ()
    counts: Tuple[int, ...] = ()
    admission_rate: Optional[float] = None

    def fields(self) -> Dict[str, Any]:
        return {"score": self.score, "availability": self.availability, "shared_ids": self.shared_ids,
                "states": list(self.states), "counts": list(self.counts),
                "admission_rate": self.admission_rate}

    @classmethod
    def parse(cls, fields: Mapping[str, Any], groups: Mapping[str, Tensors]) -> "SfedpoReport":
        k = cls.KIND
        check_keys(k, fields, ("score", "availability", "shared_ids", "states", "counts", "admission_rate"))
        _no_tensors(k, groups)
        states, counts = _states(k, fields, "states", "counts", integers=True)
        rate = None
        if fields.get("admission_rate") is not None:
            rate = _bounded(k, fields, "admission_rate", 0.0, 1.0)
        return cls(score=_bounded(k, fields, "score", 0.0, MAX_SCORE),
                   availability=_bounded(k, fields, "availability", 0.0, 1.0, open_lo=True),
                   shared_ids=get_bool(k, fields, "shared_ids", False), states=states, counts=counts,
                   admission_rate=rate)


@register_extra
@dataclass(frozen=True)
class ImportanceTerms(Extra):
    """The importance-sampling baseline runs: its admission budget and eviction sample size."""

    KIND = "importance"

    budget: float = 0.5
    candidates: int = 8

    def fields(self) -> Dict[str, Any]:
        return {"budget": self.budget, "candidates": self.candidates}

    @classmethod
    def parse(cls, fields: Mapping[str, Any], groups: Mapping[str, Tensors]) -> "ImportanceTerms":
        k = cls.KIND
        check_keys(k, fields, ("budget", "candidates"))
        _no_tensors(k, groups)
        candidates = get_int(k, fields, "candidates", 8, minimum=1)
        if candidates > 1024:
            raise ProtocolError("schema", "extras.%s.candidates: expected at most 1024" % k)
        return cls(budget=_bounded(k, fields, "budget", 0.0, 1.0, open_lo=True), candidates=candidates)


__all__ = ["SfedpoTerms", "SfedpoReport", "ImportanceTerms", "MAX_STATES", "MAX_SCORE"]
