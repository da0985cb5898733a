"""Load YAML into frozen dataclasses, rejecting unknown keys and wrong types with the file and key named.

Every configuration object in streamfl is a frozen dataclass whose fields have defaults; files and
command-line flags only override. Errors are ``ConfigError`` (exit code 2); an error that one
flag causes names that flag (``load_with_flags``).

Numbers have declared bounds (``bounded``): every int or float field of a config dataclass says
the range it accepts, and ``build`` refuses a value outside it with the key named; every float is
refused when it is NaN or infinite, whether or not its field declares a range (a field whose
meaning needs infinity, e.g. "offline until the end", says so with ``allows_infinity``).

Numbers are read the YAML 1.2 way, in files and in ``--set`` values alike (``Loader``,
``parse_value``): PyYAML follows YAML 1.1, under which ``1e-3`` and ``1.0e9`` (no dot, or an
unsigned exponent) are strings, so ``lr: 1e-3`` would be refused as "expected a number".
"""
import dataclasses
import functools
import logging
import math
import re
import shlex
import typing
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Type, TypeVar, Union

import yaml

from streamfl.errors import ConfigError

T = TypeVar("T")

_NONE_TYPE = type(None)
#: What PyYAML raises on a bad document: its own errors, and ValueError (``2001-02-30``, an int of
#: more than 4300 digits), RecursionError (deep nesting) or OverflowError from its constructors.
_YAML_ERRORS = (yaml.YAMLError, ValueError, RecursionError, OverflowError)


#: Field metadata keys: the ``Range`` a number must lie in, and whether floats may be +-inf.
RANGE = "streamfl.range"
INFINITE = "streamfl.allows_infinity"

Number = Union[int, float]

#: The widest seed range every random source here takes (numpy's legacy seeds stop at 2^32 - 1).
SEED_MAX = 2 ** 32 - 1
#: The largest frame either program may be told to accept (4 GiB; the default is 64 MiB).
FRAME_BYTES_MAX = 2 ** 32


@dataclasses.dataclass(frozen=True)
class Range:
    """The interval a numeric config field accepts: ``[lo, hi]``, either end open if said so."""

    lo: Number
    hi: Number
    lo_open: bool = False
    hi_open: bool = False

    def __post_init__(self) -> None:
        for end in (self.lo, self.hi):
            if type(end) not in (int, float) or not math.isfinite(end):
                raise ValueError("a range needs finite numbers at both ends, got [%r, %r]"
                                 % (self.lo, self.hi))
        if self.lo > self.hi:
            raise ValueError("a range needs lo <= hi, got [%r, %r]" % (self.lo, self.hi))

    def __contains__(self, value: Number) -> bool:
        above = value > self.lo if self.lo_open else value >= self.lo
        below = value < self.hi if self.hi_open else value <= self.hi
        return bool(above and below)

    def __str__(self) -> str:
        return "%s%s, %s%s" % ("(" if self.lo_open else "[", _show(self.lo), _show(self.hi),
                               ")" if self.hi_open else "]")


def _show(x: Number) -> str:
    return str(x) if isinstance(x, int) else "%.10g" % x


def bounded(default: Any, lo: Number, hi: Number, lo_open: bool = False, hi_open: bool = False,
            **kwargs: Any) -> Any:
    """A dataclass field with ``default`` whose values must lie in ``[lo, hi]`` (``lo_open``,
    ``hi_open``: that end excluded), checked by ``build``: None passes (an Optional field), and
    each element of a tuple field is checked. Both ends are required, so that no key takes 1e300
    by oversight. ``kwargs`` go to ``dataclasses.field``."""
    metadata = dict(kwargs.pop("metadata", None) or {})
    metadata[RANGE] = Range(lo, hi, lo_open, hi_open)
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


def allows_infinity(**kwargs: Any) -> Any:
    """A dataclass field whose floats may be +inf or -inf (never NaN); ``kwargs`` go to
    ``dataclasses.field``."""
    metadata = dict(kwargs.pop("metadata", None) or {})
    metadata[INFINITE] = True
    return dataclasses.field(metadata=metadata, **kwargs)


def field_range(f: "dataclasses.Field") -> Optional[Range]:
    """The declared ``Range`` of dataclass field ``f`` (None: none declared)."""
    return f.metadata.get(RANGE)


def _check_range(value: Any, rng: Range, where: str) -> None:
    """``ConfigError`` naming ``where`` if ``value`` (or an element of it) lies outside ``rng``."""
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            _check_range(item, rng, "%s[%d]" % (where, i))
        return
    if isinstance(value, (int, float)) and value not in rng:
        raise ConfigError("%s: %s is out of range, expected a value in %s" % (
            where, repr(value) if isinstance(value, float) and not math.isfinite(value) else _show(value), rng))


class Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also reads ``1e-3``, ``1.0e9`` and ``5E+6`` as floats (YAML 1.2)."""


#: YAML 1.2 core-schema floats that the YAML 1.1 rule misses: an exponent without a dot before it
#: or without a sign; the 1.1 forms (``1.5``, ``.inf``, ``1.0e+9``) still resolve through the
#: resolvers inherited from ``SafeLoader``, which are tried first.
_FLOAT_1_2 = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")
Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_1_2, list("-+0123456789."))


def parse_value(text: str, where: str) -> Any:
    """A command-line value read as YAML with ``Loader`` (``3``, ``1e9``, ``true``, ``[1, 2]``,
    ``null``, else the string); ``where`` (e.g. ``--set lr``) names it in the ``ConfigError``."""
    try:
        return yaml.load(text, Loader=Loader)  # noqa: S506 (a SafeLoader subclass)
    except _YAML_ERRORS as exc:
        raise ConfigError("%s: the value is not YAML: %s" % (where, " ".join(str(exc).split()))) from None


def read_yaml(path) -> Dict[str, Any]:
    """Read a YAML mapping from ``path``; an empty file is an empty mapping."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("cannot read config file %s: %s" % (path, exc.strerror or exc)) from exc
    return parse_yaml(text, "config file %s" % path)


def parse_yaml(text: str, source: str) -> Dict[str, Any]:
    """A YAML mapping from ``text`` (an empty text is an empty mapping); ``source`` names it in errors."""
    try:
        data = yaml.load(text, Loader=Loader)  # noqa: S506 (a SafeLoader subclass)
    except _YAML_ERRORS as exc:
        raise ConfigError("%s is not valid YAML: %s" % (source, exc)) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("%s must hold a mapping at the top level" % source)
    return data


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str, infinite: bool = False) -> Any:
    """Check ``value`` against the annotation ``tp``; ints are accepted where floats are expected.
    A float must be finite (``infinite``: +-inf allowed); NaN never is."""
    origin = typing.get_origin(tp) if hasattr(typing, "get_origin") else getattr(tp, "__origin__", None)
    args = typing.get_args(tp) if hasattr(typing, "get_args") else getattr(tp, "__args__", ())
    if tp is Any:
        return value
    if origin is typing.Union:
        if value is None and _NONE_TYPE in args:
            return None
        errors = []
        for arg in args:
            if arg is _NONE_TYPE:
                continue
            try:
                return _coerce(value, arg, where, infinite)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else "%s: %r fits none of %s" % (
            where, value, ", ".join(_type_name(a) for a in args)))
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError("%s: expected a mapping, got %r" % (where, value))
        return build(tp, value, where)
    if origin in (tuple, typing.Tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError("%s: expected a list, got %r" % (where, value))
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], "%s[%d]" % (where, i), infinite) for i, v in enumerate(value))
        if args and len(args) != len(value):
            raise ConfigError("%s: expected %d items, got %d" % (where, len(args), len(value)))
        return tuple(_coerce(v, a, "%s[%d]" % (where, i), infinite)
                     for i, (v, a) in enumerate(zip(value, args)))
    if origin in (dict, typing.Dict, Mapping) or tp in (dict, Dict):
        if not isinstance(value, Mapping):
            raise ConfigError("%s: expected a mapping, got %r" % (where, value))
        if len(args) == 2:
            return {_coerce(k, args[0], where, infinite): _coerce(v, args[1], "%s.%s" % (where, k), infinite)
                    for k, v in value.items()}
        return dict(value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError("%s: expected a number, got %r" % (where, value))
        try:
            number = float(value)
        except OverflowError:  # an integer beyond float range
            raise ConfigError("%s: %d digits is out of range for a number" % (where, len(str(abs(value))))) from None
        if math.isnan(number) or (math.isinf(number) and not infinite):
            raise ConfigError("%s: expected a finite number, got %r" % (where, number))
        return number
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError("%s: expected an integer, got %r" % (where, value))
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError("%s: expected true or false, got %r" % (where, value))
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError("%s: expected a string, got %r" % (where, value))
        return value
    if tp is Path:
        if not isinstance(value, (str, Path)):
            raise ConfigError("%s: expected a path, got %r" % (where, value))
        return Path(value)
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ConfigError("%s: expected %s, got %r" % (where, _type_name(tp), value))
    return value


@functools.lru_cache(maxsize=None)
def _fields_of(cls: type) -> Tuple[Dict[str, Any], Dict[str, dataclasses.Field]]:
    """A dataclass's resolved annotations and init fields, read once per class: resolving them
    (``typing.get_type_hints``) was a sixth of building a simulated fleet's hundred devices."""
    return typing.get_type_hints(cls), {f.name: f for f in dataclasses.fields(cls) if f.init}


def build(cls: Type[T], values: Mapping[str, Any], source: str = "config") -> T:
    """Build dataclass ``cls`` from ``values``; unknown keys, wrong types, NaN or infinite floats
    and numbers outside their field's declared range (``bounded``) raise ``ConfigError``."""
    hints, fields = _fields_of(cls)
    if not isinstance(values, Mapping):
        raise ConfigError("%s: expected a mapping, got %r" % (source, values))
    unknown = sorted(set(values) - set(fields), key=repr)  # YAML keys may be numbers, null, ...
    if unknown:
        raise ConfigError("%s: unknown key %r (known keys: %s)" % (
            source, unknown[0], ", ".join(sorted(fields))))
    try:
        kwargs = {}
        for name, value in values.items():
            where = "%s: key %r" % (source, name)
            f = fields[name]
            kwargs[name] = _coerce(value, hints[name], where, bool(f.metadata.get(INFINITE)))
            rng = field_range(f)
            if rng is not None:
                _check_range(kwargs[name], rng, where)
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as exc:
            raise ConfigError("%s: %s" % (source, exc)) from exc
    except ConfigError as exc:
        exc.source = source  # the outermost build sets it last: the prefix of the message
        raise


def load(cls: Type[T], path: Optional[Path] = None, overrides: Optional[Mapping[str, Any]] = None,
         section: Optional[str] = None, source: str = "defaults") -> T:
    """Load ``cls`` from an optional YAML file (or one ``section`` of it), then merge flag ``overrides``.

    ``overrides`` nest like the file (``{"mqtt": {"host": ...}}``); a ``None`` value (a flag that
    was not given) is skipped. ``source`` names the values in errors when there is no file.
    """
    values, source = read_values(path, section, source)
    return build(cls, merge(values, overrides or {}), source)


def read_values(path: Optional[Path], section: Optional[str] = None,
                source: str = "defaults") -> Tuple[Dict[str, Any], str]:
    """The mapping of a YAML file (or of one ``section`` of it; ``{}`` without a file) and the name
    errors give it; ``ConfigError`` if the section is not a mapping."""
    if path is None:
        return {}, source
    values = read_yaml(path)
    source = str(path)
    if section is not None:
        values = values.get(section, {}) or {}
        source = "%s [%s]" % (path, section)
        if not isinstance(values, dict):
            raise ConfigError("%s: section must be a mapping" % source)
    return values, source


def merge(*layers: Mapping[str, Any]) -> Dict[str, Any]:
    """Layers merged left to right, section by section; ``None`` values (flags not given) skipped."""
    out: Dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if value is None:
                continue
            if isinstance(value, Mapping):
                inner = out.get(key)
                out[key] = merge(inner if isinstance(inner, Mapping) else {}, value)
            else:
                out[key] = value
    return out


def to_dict(obj: Any) -> Dict[str, Any]:
    """A plain, YAML/JSON friendly dict of a config dataclass (paths as strings), with only the
    keys a file can set (fields derived on load, ``init=False``, are left out)."""
    def plain(v):
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v) if f.init}
        if isinstance(v, Path):
            return str(v)
        if isinstance(v, (tuple, list)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v
    return plain(obj)


def nest(flat: Mapping[str, Any]) -> Dict[str, Any]:
    """``{"mqtt.port": 1}`` as ``{"mqtt": {"port": 1}}``: dotted keys shaped like the YAML file."""
    out: Dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def given_flags(args: Any, keys: Mapping[str, str]) -> Dict[str, Tuple[str, Any]]:
    """``{dotted key: (flag, value)}`` of the flags given on the command line.

    ``keys`` maps each argparse ``dest`` to the config key it overrides (``{"port": "mqtt.port"}``);
    a flag whose value is None was not given. Paths become strings, as in a YAML file.
    """
    out: Dict[str, Tuple[str, Any]] = {}
    for dest, key in keys.items():
        value = getattr(args, dest)
        if value is not None:
            out[key] = ("--" + dest.replace("_", "-"), str(value) if isinstance(value, Path) else value)
    return out


def load_with_flags(load: Callable[[Mapping[str, Any]], T], flags: Mapping[str, Tuple[str, Any]]) -> T:
    """``load(overrides)`` with the flags' values as overrides (``given_flags``).

    A ``ConfigError`` that comes from a flag names the flag rather than the file (or "defaults"):
    the culprit is a flag whose removal makes the rest load, or else the first flag that fails
    alone over the file. The extra loads happen only on the error path.
    """
    def overrides(keys) -> Dict[str, Any]:
        return nest({key: flags[key][1] for key in keys})

    try:
        return load(overrides(flags))
    except ConfigError as exc:
        if not flags:
            raise
        error = exc
    for key in flags:
        if _loads(load, overrides(k for k in flags if k != key)):
            raise _flag_error(flags[key], error) from None
    if _loads(load, {}):
        for key in flags:
            try:
                load(overrides([key]))
            except ConfigError as exc:
                raise _flag_error(flags[key], exc) from None
    raise error


def _loads(load: Callable[[Mapping[str, Any]], Any], overrides: Mapping[str, Any]) -> bool:
    try:
        load(overrides)
    except ConfigError:
        return False
    return True


def _flag_error(flag: Tuple[str, Any], exc: ConfigError) -> ConfigError:
    """``exc`` said of ``flag`` (``--port 0: key 'mqtt': ...``) instead of its file or "defaults"."""
    detail = str(exc)
    source = getattr(exc, "source", None)
    if source and detail.startswith(source + ": "):
        detail = detail[len(source) + 2:]
    return ConfigError("%s %s: %s" % (flag[0], shlex.quote(str(flag[1])), detail))


def resolve_encoding(key: str, value: str, allowed: Tuple[str, ...], flag_key: str,
                     flag: bool) -> str:
    """A wire-encoding setting (``key``: ``value``, one of ``allowed``) with its deprecated float16
    flag (``flag_key``: ``flag``) folded in: the flag means ``float16`` and must not disagree."""
    if value not in allowed:
        raise ValueError("%s must be one of %s, got %r" % (key, ", ".join(allowed), value))
    if not flag:
        return value
    if value not in ("float32", "float16"):
        raise ValueError("%s: true and %s: %s disagree: give only %s" % (flag_key, key, value, key))
    logging.getLogger(__name__).warning("%s is deprecated: write %s: float16", flag_key, key)
    return "float16"
