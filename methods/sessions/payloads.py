"""The typed extra of session initialization for dynamic devices (session-init paper): which session.

``SessionTerms`` rides in every global model of a fleet running the ``sessions`` plug-in: the
session number (0 first; a new one starts whenever the set of online devices changed enough), and
whether this model is an auxiliary one (``aux_round`` 1..``aux_rounds``: the pilot model, or the
step after it, that devices train once so the coordinator can measure the new session's gradient)
or the session's own model (``aux_round`` 0). Agents log each new session and phase; what they
train is the global model either way, so a board needs no per-method switch.
"""
from dataclasses import dataclass
from typing import Any, Dict, Mapping

from streamfl.errors import ProtocolError
from streamfl.protocol.extras import MAX_EXACT_INT, Bound, Extra, Tensors, check_keys, get_int, register_extra

#: Bound on the auxiliary rounds a model may announce (the paper uses 1).
MAX_AUX_ROUNDS = 64


@register_extra
@dataclass(frozen=True)
class SessionTerms(Extra):
    """The fleet's session in a global model: ``session`` (0 first), ``aux_round`` (0: the
    session's model; 1..``aux_rounds``: an auxiliary model) and ``aux_rounds`` (V)."""

    KIND = "session"
    BOUNDS = {
        "session": Bound(0, MAX_EXACT_INT),  # sessions counted from 0
        "aux_round": Bound(0, MAX_AUX_ROUNDS),  # 0, or which auxiliary round (<= aux_rounds: parse)
        "aux_rounds": Bound(1, MAX_AUX_ROUNDS),  # V: at least the pilot (the paper uses 1)
    }

    session: int
    aux_round: int = 0
    aux_rounds: int = 1

    @property
    def auxiliary(self) -> bool:
        """True while devices train an auxiliary model (the pilot, or a step after it)."""
        return self.aux_round > 0

    def fields(self) -> Dict[str, Any]:
        return {"session": self.session, "aux_round": self.aux_round, "aux_rounds": self.aux_rounds}

    @classmethod
    def parse(cls, fields: Mapping[str, Any], groups: Mapping[str, Tensors]) -> "SessionTerms":
        k = cls.KIND
        check_keys(k, fields, ("session", "aux_round", "aux_rounds"))
        if groups:
            raise ProtocolError("schema", "extras.%s: carries no tensors" % k)
        aux_rounds = get_int(k, fields, "aux_rounds", default=1)
        aux_round = get_int(k, fields, "aux_round")
        if aux_round > aux_rounds:
            raise ProtocolError("schema", "extras.%s.aux_round %d is beyond aux_rounds %d"
                                % (k, aux_round, aux_rounds))
        return cls(session=get_int(k, fields, "session"), aux_round=aux_round, aux_rounds=aux_rounds)


__all__ = ["SessionTerms", "MAX_AUX_ROUNDS"]
