"""The importance-sampling baseline's typed extra: its budget and eviction sample on the global
model (``importance``)."""
from dataclasses import dataclass
from typing import Any, Dict, Mapping

from streamfl.protocol.bounds import BUDGET
from streamfl.protocol.extras import Bound, Extra, Tensors, check_keys, get_bool, get_float, get_int, no_tensors, \
    register_extra


@register_extra
@dataclass(frozen=True)
class ImportanceTerms(Extra):
    """The importance-sampling baseline runs: its admission budget, eviction sample size, and whether
    windows are scored one by one (the paper's IS) or by class (streamfl's)."""

    KIND = "importance"
    BOUNDS = {
        # the mean admission probability: (0, 1], 1 keeping every window; the floor as BUDGET's
        "budget": Bound(BUDGET.lo, 1.0),
        "candidates": Bound(1, 1024),       # random slots one eviction compares (8 by default)
    }

    budget: float = 0.5
    candidates: int = 8
    per_window: bool = False

    def fields(self) -> Dict[str, Any]:
        return {"budget": self.budget, "candidates": self.candidates, "per_window": self.per_window}

    @classmethod
    def parse(cls, fields: Mapping[str, Any], groups: Mapping[str, Tensors]) -> "ImportanceTerms":
        k = cls.KIND
        check_keys(k, fields, ("budget", "candidates", "per_window"))
        no_tensors(k, groups)
        return cls(budget=get_float(k, fields, "budget"), candidates=get_int(k, fields, "candidates", 8),
                   per_window=get_bool(k, fields, "per_window"))


__all__ = ["ImportanceTerms"]
