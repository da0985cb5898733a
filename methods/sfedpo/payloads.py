"""SFedPO's typed extras: its terms on the global model and a device's report in its update.

- ``SfedpoTerms`` (global model, ``sfedpo``): SFedPO runs (SFedPO paper, sec. 5). Whether DDS admits
  windows by state (``dds``), whether the coordinator weighs updates by SAW (``saw``: devices then
  report s_n and q_n), the sampling budget alpha_n and eq. 10's a1, b1, eq. 12's G and
  L eta sigma^2, and the fleet's state frequencies w_m (``states`` with ``weights``) where devices
  share state ids.
- ``SfedpoReport`` (update): the device's heterogeneity score s_n (eq. 12), its availability q_n,
  the windows it saw per state (the coordinator's w_m), whether its state ids are shared, and the
  share of windows its full buffer admitted.
Every list is bounded in length (``MAX_STATES``) and every number in range (``BOUNDS``, checked
by the codec): a report is hostile until parsed, and the coordinator bounds what it does with the
values as well.
"""
import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from streamfl.errors import ProtocolError
from streamfl.protocol.bounds import BUDGET
from streamfl.protocol.extras import (
    MAX_EXACT_INT, Bound, Extra, Tensors, check_keys, get_bool, get_float, no_tensors, register_extra,
)

#: Most states a model or report may list (the agent tracks at most as many).
MAX_STATES = 1024
#: Bound on a reported heterogeneity score (eq. 12 is a few units for any sane inputs).
MAX_SCORE = 1e6
#: The smallest availability q_n a report may claim: a tenth of the paper's clip (0.01, the
#: agents' and the coordinator's default floor), so an agent configured with a lower floor still
#: reports; eq. 14's 1/q_n is then at most 1000.
MIN_AVAILABILITY = 1e-3
#: State ids are labels, not quantities: any non-negative integer exact in JSON.
STATE_ID = Bound(0, MAX_EXACT_INT)


def _states(kind: str, fields: Mapping[str, Any], key: str, values: str,
            integers: bool) -> Tuple[Tuple[int, ...], Tuple[Any, ...]]:
    """Parallel lists ``key`` (distinct integer state ids) and ``values`` (finite numbers, integers
    when ``integers``), at most ``MAX_STATES`` long; their ranges are in ``BOUNDS``."""
    ids, vals = fields.get(key, []), fields.get(values, [])
    if not isinstance(ids, list) or not isinstance(vals, list) or len(ids) != len(vals) \
            or len(ids) > MAX_STATES:
        raise ProtocolError("schema", "extras.%s.%s/%s: expected two lists of equal length <= %d"
                            % (kind, key, values, MAX_STATES))
    for s in ids:
        if type(s) is not int:
            raise ProtocolError("schema", "extras.%s.%s: expected integer state ids, got %r" % (kind, key, s))
    if len(set(ids)) != len(ids):
        raise ProtocolError("schema", "extras.%s.%s: a state is listed twice" % (kind, key))
    for v in vals:
        try:
            ok = type(v) is int if integers else type(v) in (int, float) and math.isfinite(v)
        except OverflowError:  # an integer beyond float range
            ok = False
        if not ok:
            raise ProtocolError("schema", "extras.%s.%s: expected %s, got %r"
                                % (kind, values, "integers" if integers else "finite numbers", v))
    return tuple(ids), tuple(int(v) if integers else float(v) for v in vals)


@register_extra
@dataclass(frozen=True)
class SfedpoTerms(Extra):
    """SFedPO's settings for the fleet, in the global model (module docstring)."""

    KIND = "sfedpo"
    BOUNDS = {
        "budget": BUDGET,                   # alpha_n (BUDGET)
        "a1": Bound(0.0, 100.0),            # eq. 10's weight on d_m, >= 0 (0.15 by default)
        "b1": Bound(-100.0, 100.0),         # eq. 10's offset, either sign (0.25 by default)
        "g": Bound(0.0, 100.0),             # eq. 12's G, >= 0 (1 by default)
        "l_eta_sigma2": Bound(0.0, 100.0),  # eq. 12's L eta sigma^2, a product of non-negatives
        "states": STATE_ID,                 # the state ids the weights are for
        "weights": Bound(0.0, 1.0),         # w_m: population frequencies, each in [0, 1]
    }

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
        no_tensors(k, groups)
        states, weights = _states(k, fields, "states", "weights", integers=False)
        return cls(dds=get_bool(k, fields, "dds", True), saw=get_bool(k, fields, "saw", True),
                   budget=get_float(k, fields, "budget"), a1=get_float(k, fields, "a1"),
                   b1=get_float(k, fields, "b1"), g=get_float(k, fields, "g"),
                   l_eta_sigma2=get_float(k, fields, "l_eta_sigma2"), states=states, weights=weights)


@register_extra
@dataclass(frozen=True)
class SfedpoReport(Extra):
    """A device's SAW inputs with its update: s_n, q_n, its state counts (module docstring)."""

    KIND = "sfedpo_report"
    BOUNDS = {
        "score": Bound(0.0, MAX_SCORE),     # s_n, eq. 12 (the agent clamps it to the same)
        "availability": Bound(MIN_AVAILABILITY, 1.0),  # q_n, a probability (MIN_AVAILABILITY)
        "states": STATE_ID,                 # the state ids counted
        # windows seen per state since start: 1000 windows a second for 30 years is 1e12; the
        # coordinator uses shares of them, one device one vote
        "counts": Bound(0, 10 ** 12),
        "admission_rate": Bound(0.0, 1.0),  # a share of windows admitted
    }

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
        no_tensors(k, groups)
        states, counts = _states(k, fields, "states", "counts", integers=True)
        return cls(score=get_float(k, fields, "score"), availability=get_float(k, fields, "availability"),
                   shared_ids=get_bool(k, fields, "shared_ids", False), states=states, counts=counts,
                   admission_rate=get_float(k, fields, "admission_rate", optional=True))


