"""Typed payloads that plug-ins add to a ``GlobalModel`` or an ``Update`` (``extras``, keyed by kind).

A method's coordinator plug-in puts, say, its own state into every global model and the matching
agent plug-in reads it back; neither core looks inside. Each payload is a small frozen dataclass
subclassing ``Extra``: its JSON-able fields travel in the frame header under ``extras.<kind>`` and its
tensor groups (``{group: {tensor name: array}}``, each shaped like the model) in the tensor block as
``extra/<kind>/<group>/<name>``, always float32. The codec checks the groups against the
architecture like the model tensors; ``Extra.parse`` checks the fields, so a payload that reaches a
plug-in is well-typed. A kind this side does not know is dropped on decode (logged once per kind):
a newer coordinator's extra must not stop an older board from taking the model itself.

Bounds: every numeric field and every tensor group of a payload has a declared range in one place,
its class's ``BOUNDS`` (``{field or group name: Bound(lo, hi)}``, inclusive and finite; a list
field is checked element by element, a group on every element of every array, by one ``np.min``
and one ``np.max`` per array). ``parse`` checks types and relations (U and V travel together, a
period being consolidated is an earlier one); ``register_extra`` wraps it with ``check_bounds``,
so whatever calls a registered ``parse`` (the codec's ``parse_extras`` for every decoded message,
or anyone else) gets ``ProtocolError("bounds", "extras.<kind>.<key>: <value> outside [lo, hi]")``
for the first value out of range, and no plug-in ever sees one. A device's Fisher diagonal of 1e30
is finite and well-typed, so only a declared range stops it at the boundary; what a plug-in then
makes of many in-range values (a fleet-level sum, a weight) is still the plug-in's to bound.
``tests/test_payload_bounds.py`` fails for a registered payload with a numeric field or a tensor
group (``GROUPS``) that has no bound.
"""
import abc
import functools
import inspect
import logging
import math
from typing import Any, ClassVar, Dict, Mapping, Optional, Tuple, Type, TypeVar

import numpy as np

from streamfl.config import Range
from streamfl.errors import ProtocolError

log = logging.getLogger(__name__)

Tensors = Dict[str, np.ndarray]
E = TypeVar("E", bound="Extra")

#: Wire prefix of an extra's tensors in the tensor block.
EXTRA_PREFIX = "extra/"


#: An inclusive range ``[lo, hi]`` a payload's number must lie in, both ends finite: the same
#: declaration as a config key's (``streamfl.config.Range``, never with an open end here).
Bound = Range


#: Exactly representable integers in a JSON number read as a double: versions, periods, ids.
MAX_EXACT_INT = 2 ** 53


class Extra(abc.ABC):
    """One typed payload; subclasses are frozen dataclasses with a unique ``KIND``."""

    #: The key under ``extras`` on the wire and in the message's dict.
    KIND: ClassVar[str] = ""
    #: Names of the tensor groups ``groups()`` may return (each needs a bound).
    GROUPS: ClassVar[Tuple[str, ...]] = ()
    #: ``{field name or group name: Bound}``: the range of every numeric field (every element of a
    #: list field) and of every element of every array of a tensor group (module docstring).
    BOUNDS: ClassVar[Mapping[str, Bound]] = {}

    def fields(self) -> Dict[str, Any]:
        """The JSON-able part (numbers, strings, booleans, lists and dicts of them)."""
        return {}

    def groups(self) -> Dict[str, Tensors]:
        """Tensor groups, each ``{model tensor name: array}`` with the model's shapes."""
        return {}

    @classmethod
    @abc.abstractmethod
    def parse(cls: Type[E], fields: Mapping[str, Any], groups: Mapping[str, Tensors]) -> E:
        """Rebuild from the wire; ``ProtocolError("schema")`` on anything out of type, and (added
        by ``register_extra``) ``ProtocolError("bounds")`` on a value outside ``BOUNDS``."""


def _outside(kind: str, key: str, value: Any, bound: Bound, where: str = "") -> ProtocolError:
    if isinstance(value, np.generic):
        value = value.item()
    return ProtocolError("bounds", "extras.%s.%s: %r outside [%r, %r]%s"
                         % (kind, key, value, bound.lo, bound.hi, where))


def check_bounds(extra: E) -> E:
    """``extra`` if every value ``BOUNDS`` names is in its range, else ``ProtocolError("bounds")``
    naming the first one outside (absent optional fields and groups are skipped)."""
    cls = type(extra)
    groups: Optional[Dict[str, Tensors]] = None
    for key, bound in cls.BOUNDS.items():
        if key in cls.GROUPS:
            if groups is None:
                groups = extra.groups()
            for name, arr in (groups.get(key) or {}).items():
                a = np.asarray(arr)
                if a.size == 0:
                    continue
                # As Python floats (exact for every float dtype): numpy would compare a float32
                # with the bound rounded to float32, which lets a value past a bound that float32
                # cannot hold through. NaN propagates into both: refused below.
                low, high = float(np.min(a)), float(np.max(a))
                if not low >= bound.lo:
                    raise _outside(cls.KIND, key, low, bound, " (tensor %s)" % name)
                if not high <= bound.hi:
                    raise _outside(cls.KIND, key, high, bound, " (tensor %s)" % name)
            continue
        value = getattr(extra, key)
        if value is None:
            continue
        values = value if isinstance(value, (tuple, list)) else (value,)  # parse bounds list lengths
        try:
            bad = next((x for x in values if x not in bound), None)
        except TypeError:  # not a number: parse should have refused it
            raise _outside(cls.KIND, key, value, bound) from None
        if bad is not None:
            raise _outside(cls.KIND, key, bad, bound)
    return extra


#: Registered payload classes by kind (``register_extra``).
EXTRA_TYPES: Dict[str, Type[Extra]] = {}


def register_extra(cls: Type[E]) -> Type[E]:
    """Class decorator: make ``cls`` decodable under ``cls.KIND`` (once per kind), with its
    ``parse`` wrapped so that it checks ``cls.BOUNDS`` on what it built (``check_bounds``)."""
    if not cls.KIND or "/" in cls.KIND:
        raise ValueError("an Extra needs a KIND without '/', got %r" % cls.KIND)
    if EXTRA_TYPES.get(cls.KIND, cls) is not cls:
        raise ValueError("extra kind %r is already registered" % cls.KIND)
    names = set(getattr(cls, "__dataclass_fields__", {})) | set(cls.GROUPS)
    for key, bound in cls.BOUNDS.items():
        if key not in names:
            raise ValueError("%s.BOUNDS names %r, neither a field nor a tensor group" % (cls.__name__, key))
        if not isinstance(bound, Bound) or bound.lo_open or bound.hi_open:
            raise ValueError("%s.BOUNDS[%r] must be a closed Bound, got %r" % (cls.__name__, key, bound))
    parse = inspect.getattr_static(cls, "parse")
    if not isinstance(parse, classmethod):
        raise ValueError("%s.parse must be a classmethod" % cls.__name__)
    if not getattr(parse.__func__, "checks_bounds", False):
        cls.parse = classmethod(_bounded_parse(parse.__func__))  # type: ignore[assignment]
    EXTRA_TYPES[cls.KIND] = cls
    return cls


def _bounded_parse(parse: Any) -> Any:
    """``parse`` followed by ``check_bounds`` on its result."""
    @functools.wraps(parse)
    def bounded(cls: Any, fields: Mapping[str, Any], groups: Mapping[str, Tensors]) -> Any:
        return check_bounds(parse(cls, fields, groups))
    bounded.checks_bounds = True  # type: ignore[attr-defined]
    return bounded


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
        out[kind] = cls.parse(body, groups.get(kind, {}))  # checks BOUNDS (register_extra)
    return out


# ---- field checks for ``parse`` implementations --------------------------------------------------

def _fail(kind: str, key: str, what: str, value: Any) -> ProtocolError:
    return ProtocolError("schema", "extras.%s.%s: expected %s, got %r" % (kind, key, what, value))


def get_bool(kind: str, fields: Mapping[str, Any], key: str, default: bool = False) -> bool:
    value = fields.get(key, default)
    if type(value) is not bool:
        raise _fail(kind, key, "true or false", value)
    return value


def get_int(kind: str, fields: Mapping[str, Any], key: str, default: int = 0,
            minimum: Optional[int] = None) -> int:
    """An integer (not a bool); its range belongs in the payload's ``BOUNDS``, not ``minimum``."""
    value = fields.get(key, default)
    if type(value) is not int or (minimum is not None and value < minimum):
        raise _fail(kind, key, "an integer" if minimum is None else "an integer >= %d" % minimum, value)
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


def no_tensors(kind: str, groups: Mapping[str, Tensors]) -> None:
    """``ProtocolError`` if a field-only extra arrived with tensor groups."""
    if groups:
        raise ProtocolError("schema", "extras.%s: carries no tensors" % kind)


def check_keys(kind: str, fields: Mapping[str, Any], known: Any) -> None:
    """Reject fields this payload does not have (a typo or a forged header)."""
    extra = sorted(set(fields) - set(known))
    if extra:
        raise ProtocolError("schema", "extras.%s: unexpected fields %s" % (kind, extra))
