"""Typed payloads that plug-ins add to a ``GlobalModel`` or an ``Update`` (``extras``, keyed by kind).

A method's coordinator plug-in puts, say, its CLP state into every global model and the matching
agent plug-in reads it back; neither core looks inside. Each payload is a small frozen dataclass
subclassing ``Extra``: its JSON-able fields travel in the frame header under ``extras.<kind>`` and its
tensor groups (``{group: {tensor name: array}}``, each shaped like the model) in the tensor block as
``extra/<kind>/<group>/<name>``, always float32. The codec checks the groups against the
architecture like the model tensors; ``Extra.parse`` checks the fields, so a payload that reaches a
plug-in is well-typed. A kind this side does not know is dropped on decode (logged once per kind):
a newer coordinator's extra must not stop an older board from taking the model itself.
"""
import abc
import logging
import math
from typing import Any, ClassVar, Dict, Mapping, Type, TypeVar

import numpy as np

from streamfl.errors import ProtocolError

log = logging.getLogger(__name__)

Tensors = Dict[str, np.ndarray]
E = TypeVar("E", bound="Extra")

#: Wire prefix of an extra's tensors in the tensor block.
EXTRA_PREFIX = "extra/"


class Extra(abc.ABC):
    """One typed payload; subclasses are frozen dataclasses with a unique ``KIND``."""

    #: The key under ``extras`` on the wire and in the message's dict.
    KIND: ClassVar[str] = ""

    def fields(self) -> Dict[str, Any]:
        """The JSON-able part (numbers, strings, booleans, lists and dicts of them)."""
        return {}

    def groups(self) -> Dict[str, Tensors]:
        """Tensor groups, each ``{model tensor name: array}`` with the model's shapes."""
        return {}

    @classmethod
    @abc.abstractmethod
    def parse(cls: Type[E], fields: Mapping[str, Any], groups: Mapping[str, Tensors]) -> E:
        """Rebuild from the wire; ``ProtocolError("schema")`` on anything out of type or range."""


#: Registered payload classes by kind (``register_extra``).
EXTRA_TYPES: Dict[str, Type[Extra]] = {}


def register_extra(cls: Type[E]) -> Type[E]:
    """Class decorator: make ``cls`` decodable under ``cls.KIND`` (once per kind)."""
    if not cls.KIND or "/" in cls.KIND:
        raise ValueError("an Extra needs a KIND without '/', got %r" % cls.KIND)
    if EXTRA_TYPES.get(cls.KIND, cls) is not cls:
        raise ValueError("extra kind %r is already registered" % cls.KIND)
    EXTRA_TYPES[cls.KIND] = cls
    return cls


#: Unknown kinds already warned about; bounded (count and length), since any sender picks the kinds.
_unknown_logged = set()
_UNKNOWN_LOGGED_MAX = 64
_UNKNOWN_KIND_MAX_CHARS = 64


def parse_extras(fields: Mapping[str, Any], groups: Mapping[str, Dict[str, Tensors]]) -> Dict[str, Extra]:
    """``{kind: Extra}`` from a decoded header's ``extras`` and the tensor block's extra groups."""
    out: Dict[str, Extra] = {}
    for kind in sorted(set(fields) | set(groups)):
        cls = EXTRA_TYPES.get(kind)
        if cls is None:
            if kind in _unknown_logged:
                continue
            if len(_unknown_logged) < _UNKNOWN_LOGGED_MAX and len(kind) <= _UNKNOWN_KIND_MAX_CHARS:
                _unknown_logged.add(kind)
                log.warning("dropping extra %r: no plug-in here knows it", kind)
            else:
                log.debug("dropping extra %.80r: no plug-in here knows it", kind)
            continue
        body = fields.get(kind, {})
        if not isinstance(body, Mapping):
            raise ProtocolError("schema", "extras.%s: expected an object" % kind)
        out[kind] = cls.parse(body, groups.get(kind, {}))
    return out


# ---- field checks for ``parse`` implementations --------------------------------------------------

def _fail(kind: str, key: str, what: str, value: Any) -> ProtocolError:
    return ProtocolError("schema", "extras.%s.%s: expected %s, got %r" % (kind, key, what, value))


def get_bool(kind: str, fields: Mapping[str, Any], key: str, default: bool = False) -> bool:
    value = fields.get(key, default)
    if type(value) is not bool:
        raise _fail(kind, key, "true or false", value)
    return value


def get_int(kind: str, fields: Mapping[str, Any], key: str, default: int = 0, minimum: int = 0) -> int:
    value = fields.get(key, default)
    if type(value) is not int or value < minimum:
        raise _fail(kind, key, "an integer >= %d" % minimum, value)
    return value


def get_float(kind: str, fields: Mapping[str, Any], key: str, optional: bool = False,
              default: float = 0.0) -> Any:
    """A finite number (None allowed when ``optional``)."""
    value = fields.get(key, None if optional else default)
    if value is None and optional:
        return None
    try:
        ok = type(value) in (int, float) and math.isfinite(value)
    except OverflowError:  # an integer beyond float range
        ok = False
    if not ok:
        raise _fail(kind, key, "a finite number", value)
    return float(value)


def check_keys(kind: str, fields: Mapping[str, Any], known: Any) -> None:
    """Reject fields this payload does not have (a typo or a forged header)."""
    extra = sorted(set(fields) - set(known))
    if extra:
        raise ProtocolError("schema", "extras.%s: unexpected fields %s" % (kind, extra))
