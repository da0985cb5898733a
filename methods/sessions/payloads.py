"""The typed extra of session initialization for dynamic devices (session-init paper): which session.

``SessionTerms`` rides in every global model of a fleet running the ``sessions`` plug-in: the
session number (0 first; a new one starts whenever the set of online devices changed enough), and
whether this model is an auxiliary one (``aux_round`` 1..``aux_rounds``: the pilot model, or the
step after it, that devices train once so the coordinator can measure the new session's gradient)
or the session's own model (``aux_round`` 0). Agents log each new session and phase.

Where the coordinator runs the auxiliary rounds beside the global model (``aux_model: beside``),
the auxiliary model rides in the global model as the tensor group ``aux``: the global model stays
the fleet's own, a board trains one round from ``aux`` and marks that round's update with
``SessionAux`` (which session and auxiliary round it trained), so the coordinator measures the
update against the auxiliary model and keeps it from the fleet's model.
"""
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional

import numpy as np

from streamfl.errors import ProtocolError
from streamfl.protocol.extras import (
    MAX_EXACT_INT, Bound, Extra, Tensors, check_keys, get_int, no_tensors, register_extra,
)

#: Bound on the auxiliary rounds a model may announce (the paper uses 1).
MAX_AUX_ROUNDS = 64
#: A weight of the auxiliary model: it is a mean of models that admission let in, whose weight cap
#: (``max_abs_value``) may be set as high as 1e30, so nothing larger is a weight of this fleet;
#: 2^100 (about 1.27e30) since float32 holds it exactly, so the check is the same in float32.
AUX_WEIGHT = Bound(-2.0 ** 100, 2.0 ** 100)


@register_extra
@dataclass(frozen=True)
class SessionTerms(Extra):
    """The fleet's session in a global model: ``session`` (0 first), ``aux_round`` (0: the
    session's model; 1..``aux_rounds``: an auxiliary model) and ``aux_rounds`` (V)."""

    KIND = "session"
    GROUPS = ("aux",)
    BOUNDS = {
        "session": Bound(0, MAX_EXACT_INT),  # sessions counted from 0
        "aux_round": Bound(0, MAX_AUX_ROUNDS),  # 0, or which auxiliary round (<= aux_rounds: parse)
        "aux_rounds": Bound(1, MAX_AUX_ROUNDS),  # V: at least the pilot (the paper uses 1)
        "aux": AUX_WEIGHT,  # the auxiliary model, where it rides beside the global one
    }

    session: int
    aux_round: int = 0
    aux_rounds: int = 1
    #: The auxiliary model to train one round from, where it rides beside the global model
    #: (only while ``aux_round`` > 0); None where the global model is the auxiliary one.
    aux: Optional[Tensors] = field(default=None, compare=False)

    @property
    def auxiliary(self) -> bool:
        """True while the session measures its gradient (the session's own model has not begun)."""
        return self.aux_round > 0

    @property
    def aux_served(self) -> bool:
        """True while the global model itself is the auxiliary model (devices train it once)."""
        return self.aux_round > 0 and self.aux is None

    def fields(self) -> Dict[str, Any]:
        return {"session": self.session, "aux_round": self.aux_round, "aux_rounds": self.aux_rounds}

    def groups(self) -> Dict[str, Tensors]:
        return {"aux": self.aux} if self.aux is not None else {}

    @classmethod
    def parse(cls, fields: Mapping[str, Any], groups: Mapping[str, Tensors]) -> "SessionTerms":
        k = cls.KIND
        check_keys(k, fields, ("session", "aux_round", "aux_rounds"))
        unexpected = sorted(set(groups) - set(cls.GROUPS))
        if unexpected:
            raise ProtocolError("schema", "extras.%s: unexpected tensor groups %s" % (k, unexpected))
        aux_rounds = get_int(k, fields, "aux_rounds", default=1)
        aux_round = get_int(k, fields, "aux_round")
        if aux_round > aux_rounds:
            raise ProtocolError("schema", "extras.%s.aux_round %d is beyond aux_rounds %d"
                                % (k, aux_round, aux_rounds))
        aux = groups.get("aux")
        if aux is not None and aux_round == 0:
            raise ProtocolError("schema", "extras.%s: an auxiliary model outside an auxiliary round" % k)
        return cls(session=get_int(k, fields, "session"), aux_round=aux_round, aux_rounds=aux_rounds,
                   aux=None if aux is None else {n: np.asarray(a, dtype=np.float32) for n, a in aux.items()})


@register_extra
@dataclass(frozen=True)
class SessionAux(Extra):
    """An update's mark: it trained one round from the auxiliary model of ``session``'s auxiliary
    round ``aux_round`` (ridden beside the global model), not from the global version it names."""

    KIND = "session-aux"
    BOUNDS = {
        "session": Bound(0, MAX_EXACT_INT),
        "aux_round": Bound(1, MAX_AUX_ROUNDS),
    }

    session: int
    aux_round: int

    def fields(self) -> Dict[str, Any]:
        return {"session": self.session, "aux_round": self.aux_round}

    @classmethod
    def parse(cls, fields: Mapping[str, Any], groups: Mapping[str, Tensors]) -> "SessionAux":
        k = cls.KIND
        check_keys(k, fields, ("session", "aux_round"))
        no_tensors(k, groups)
        return cls(session=get_int(k, fields, "session"), aux_round=get_int(k, fields, "aux_round"))


__all__ = ["SessionTerms", "SessionAux", "MAX_AUX_ROUNDS"]
