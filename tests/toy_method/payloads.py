"""The toy method's typed extras: its terms on the global model, a device's window count."""
from dataclasses import dataclass
from typing import Any, Dict, Mapping

from streamfl.protocol.extras import Bound, Extra, Tensors, check_keys, get_float, get_int, no_tensors, \
    register_extra


@register_extra
@dataclass(frozen=True)
class ToyTerms(Extra):
    """The coordinator runs the toy method: devices scale their learning rate by ``lr_scale``."""

    lr_scale: float = 0.5
    KIND = "toy"
    BOUNDS = {"lr_scale": Bound(1e-3, 1.0)}

    def fields(self) -> Dict[str, Any]:
        return {"lr_scale": self.lr_scale}

    @classmethod
    def parse(cls, fields: Mapping[str, Any], groups: Mapping[str, Tensors]) -> "ToyTerms":
        no_tensors(cls.KIND, groups)
        check_keys(cls.KIND, fields, ("lr_scale",))
        return cls(get_float(cls.KIND, fields, "lr_scale"))


@register_extra
@dataclass(frozen=True)
class ToyReport(Extra):
    """A device's count of the windows it saw since it started."""

    windows: int = 0
    KIND = "toy_report"
    BOUNDS = {"windows": Bound(0, 10 ** 9)}

    def fields(self) -> Dict[str, Any]:
        return {"windows": self.windows}

    @classmethod
    def parse(cls, fields: Mapping[str, Any], groups: Mapping[str, Tensors]) -> "ToyReport":
        no_tensors(cls.KIND, groups)
        check_keys(cls.KIND, fields, ("windows",))
        return cls(get_int(cls.KIND, fields, "windows"))
