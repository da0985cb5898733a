"""Load YAML into frozen dataclasses, rejecting unknown keys and wrong types with the file and key named.

Every configuration object in streamfl is a frozen dataclass whose fields have defaults; files and
command-line flags only override. Errors are ``ConfigError`` (exit code 2, DESIGN.md section 9).
"""
import dataclasses
import typing
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Type, TypeVar

import yaml

from streamfl.errors import ConfigError

T = TypeVar("T")

_NONE_TYPE = type(None)


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
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("%s is not valid YAML: %s" % (source, exc)) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("%s must hold a mapping at the top level" % source)
    return data


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against the annotation ``tp``; ints are accepted where floats are expected."""
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
                return _coerce(value, arg, where)
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
            return tuple(_coerce(v, args[0], "%s[%d]" % (where, i)) for i, v in enumerate(value))
        if args and len(args) != len(value):
            raise ConfigError("%s: expected %d items, got %d" % (where, len(args), len(value)))
        return tuple(_coerce(v, a, "%s[%d]" % (where, i)) for i, (v, a) in enumerate(zip(value, args)))
    if origin in (dict, typing.Dict, Mapping) or tp in (dict, Dict):
        if not isinstance(value, Mapping):
            raise ConfigError("%s: expected a mapping, got %r" % (where, value))
        if len(args) == 2:
            return {_coerce(k, args[0], where): _coerce(v, args[1], "%s.%s" % (where, k))
                    for k, v in value.items()}
        return dict(value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError("%s: expected a number, got %r" % (where, value))
        return float(value)
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


def build(cls: Type[T], values: Mapping[str, Any], source: str = "config") -> T:
    """Build dataclass ``cls`` from ``values``; unknown keys and wrong types raise ``ConfigError``."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError("%s: unknown key %r (known keys: %s)" % (
            source, unknown[0], ", ".join(sorted(fields))))
    kwargs = {name: _coerce(value, hints[name], "%s: key %r" % (source, name))
              for name, value in values.items()}
    try:
        obj = cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError("%s: %s" % (source, exc)) from exc
    return obj


def load(cls: Type[T], path: Optional[Path] = None, overrides: Optional[Mapping[str, Any]] = None,
         section: Optional[str] = None) -> T:
    """Load ``cls`` from an optional YAML file (or one ``section`` of it), then apply flag ``overrides``.

    Overrides whose value is ``None`` (a flag that was not given) are ignored.
    """
    values: Dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        data = read_yaml(path)
        source = str(path)
        if section is not None:
            data = data.get(section, {}) or {}
            source = "%s [%s]" % (path, section)
            if not isinstance(data, dict):
                raise ConfigError("%s: section must be a mapping" % source)
        values.update(data)
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = value
    return build(cls, values, source)


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
    """A plain, YAML/JSON friendly dict of a config dataclass (paths as strings)."""
    def plain(v):
        if isinstance(v, Path):
            return str(v)
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v
    return {k: plain(v) for k, v in dataclasses.asdict(obj).items()}
