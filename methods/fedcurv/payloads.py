"""FedCurv's typed extras: the coordinator's U/V sums on the global model and a device's Fisher
diagonal.

Registered with the codec (``register_extra``) when the method loads; every number carries its
range (``BOUNDS``, checked by the codec).
"""
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

import numpy as np

from streamfl.errors import ProtocolError
from streamfl.protocol.extras import (
    Bound, Extra, Tensors, check_keys, get_float, get_int, register_extra,
)
from streamfl.protocol.bounds import FISHER_DIAGONAL, FISHER_SUM, FISHER_WEIGHT_SUM, FISHER_WINDOWS, LAMBDA


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


