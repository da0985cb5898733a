"""Header body schemas derived from the message dataclasses, so a frame's JSON is checked field by field.

Checks are strict where a wrong type would crash a core later: exactly the dataclass's fields,
required ones present, ints are ints (not bools), floats accept ints, dict keys and list items typed,
``Update.class_counts`` keys back to ``int``, counts non-negative, device ids valid topic names.
"""
import re
from dataclasses import MISSING, fields
from typing import Any, Callable, Dict, List, Tuple, Union, get_args, get_origin, get_type_hints

from streamfl.errors import ConfigError, ProtocolError
from streamfl.protocol.messages import (
    COMMAND_KIND_RE, MESSAGE_TYPES, Command, CommandReply, CoordinatorStatus, DeviceReply, GlobalModel,
    Hello, Offline, Telemetry, Update,
)
from streamfl.protocol.topics import validate_name

Checker = Callable[[Any, str], Any]
_INT_KEY = re.compile(r"^-?[0-9]{1,18}$")
_COMMAND_KIND = re.compile(COMMAND_KIND_RE)

#: Fields holding device ids: they end up in topic names and registries, so they must be valid names.
DEVICE_ID_FIELDS = {(Hello, "device_id"), (Offline, "device_id"), (Update, "device_id"),
                    (Telemetry, "device_id"), (DeviceReply, "device_id")}
#: Fields that are counts, versions, rates or probabilities and so never negative.
NON_NEGATIVE = {(GlobalModel, "version"), (CoordinatorStatus, "version"), (Update, "base_version"),
                (Update, "num_samples"), (Hello, "buffer_capacity"), (Telemetry, "buffer_fill"),
                (Telemetry, "buffer_capacity"), (Telemetry, "diverged_rounds"), (Command, "seq"),
                (CommandReply, "seq"), (DeviceReply, "seq"), (Telemetry, "predictions_per_s"),
                (Telemetry, "prediction_confidence"), (Telemetry, "predictions_dropped"),
                (Telemetry, "duplicate_id_takeovers"), (Telemetry, "state_disk_free_bytes"),
                (Telemetry, "state_disk_size_bytes")}
#: A run identity: "" (unknown) or up to 64 characters of a topic-safe name.
_RUN_ID = re.compile(r"^[A-Za-z0-9_.-]{0,64}$")


def _fail(path: str, expected: str, value: Any) -> ProtocolError:
    return ProtocolError("schema", "%s: expected %s, got %s" % (path, expected, type(value).__name__))


def _check_any(value: Any, path: str) -> Any:
    return value


def _check_str(value: Any, path: str) -> Any:
    if not isinstance(value, str):
        raise _fail(path, "string", value)
    return value


def _check_bool(value: Any, path: str) -> Any:
    if type(value) is not bool:
        raise _fail(path, "boolean", value)
    return value


def _check_int(value: Any, path: str) -> Any:
    if type(value) is not int:
        raise _fail(path, "integer", value)
    return value


def _check_count(value: Any, path: str) -> Any:
    if type(value) is not int or value < 0:
        raise ProtocolError("schema", "%s: expected a non-negative integer, got %r" % (path, value))
    return value


def _check_non_negative_float(value: Any, path: str) -> Any:
    number = _check_float(value, path)
    if not number >= 0:
        raise ProtocolError("schema", "%s: expected a non-negative number, got %r" % (path, value))
    return number


def _check_float(value: Any, path: str) -> Any:
    if type(value) not in (int, float):
        raise _fail(path, "number", value)
    try:
        return float(value)
    except OverflowError:  # an integer beyond float range (JSON spells any size)
        raise ProtocolError("schema", "%s: number out of float range" % path) from None


def _check_int_key(key: str, path: str) -> int:
    if not _INT_KEY.match(key):
        raise ProtocolError("schema", "%s: key %r is not an integer" % (path, key))
    return int(key)


def _checker(tp: Any, count: bool = False) -> Checker:
    """A function that validates (and normalizes) a decoded JSON value against type hint ``tp``."""
    if tp is Any:
        return _check_any
    if tp is str:
        return _check_str
    if tp is bool:
        return _check_bool
    if tp is int:
        return _check_count if count else _check_int
    if tp is float:
        return _check_non_negative_float if count else _check_float
    origin, args = get_origin(tp), get_args(tp)
    if origin is Union:
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            raise TypeError("unsupported union %r" % tp)
        check_inner = _checker(inner[0], count)

        def check_optional(value: Any, path: str) -> Any:
            return None if value is None else check_inner(value, path)
        return check_optional
    if origin in (list, List):
        check_item = _checker(args[0], count)

        def check_list(value: Any, path: str) -> Any:
            if not isinstance(value, list):
                raise _fail(path, "list", value)
            return [check_item(v, path) for v in value]
        return check_list
    if origin in (dict, Dict):
        if args[0] not in (str, int):
            raise TypeError("unsupported dict key type %r" % tp)
        int_keys = args[0] is int
        check_value = _checker(args[1], count)

        def check_dict(value: Any, path: str) -> Any:
            if not isinstance(value, dict):
                raise _fail(path, "object", value)
            if int_keys:
                return {_check_int_key(k, path): check_value(v, path) for k, v in value.items()}
            return {k: check_value(v, path) for k, v in value.items()}
        return check_dict
    raise TypeError("unsupported field type %r" % tp)


class _Schema:
    """The compiled body schema of one message class."""

    def __init__(self, cls: type):
        hints = get_type_hints(cls)
        self.cls = cls
        self.names = frozenset(f.name for f in fields(cls) if f.name != "tensors")
        #: (field, checker, required, path, is device id)
        self.fields: List[Tuple[str, Checker, bool, str, bool]] = []
        for f in fields(cls):
            if f.name == "tensors":
                continue
            required = f.default is MISSING and f.default_factory is MISSING  # type: ignore[misc]
            count = (cls, f.name) in NON_NEGATIVE or (cls, f.name) == (Update, "class_counts")
            self.fields.append((f.name, _checker(hints[f.name], count), required,
                                "%s.%s" % (cls.__name__, f.name), (cls, f.name) in DEVICE_ID_FIELDS))


_SCHEMAS = {cls: _Schema(cls) for cls in MESSAGE_TYPES.values()}


def body_schema(cls: type) -> Dict[str, Tuple[Checker, bool]]:
    """``{field: (checker, required)}`` of a message class's header body (tensors excluded)."""
    return {name: (check, required) for name, check, required, _, _ in _SCHEMAS[cls].fields}


def check_body(cls: type, body: Any) -> Dict[str, Any]:
    """The normalized keyword arguments for ``cls`` from a header body, or ``ProtocolError("schema")``."""
    if not isinstance(body, dict):
        raise _fail("body", "object", body)
    schema = _SCHEMAS[cls]
    extra = body.keys() - schema.names
    if extra:
        raise ProtocolError("schema", "%s: unexpected fields %s" % (cls.__name__, sorted(extra)))
    out = {}
    for name, check, required, path, device_id in schema.fields:
        if name not in body:
            if required:
                raise ProtocolError("schema", "%s: missing field" % path)
            continue
        value = out[name] = check(body[name], path)
        if device_id:
            try:
                validate_name(value, "device id")
            except ConfigError as exc:
                raise ProtocolError("schema", "%s: %s" % (path, exc)) from None
    if cls in (GlobalModel, Update, Telemetry) and "extras" not in out:
        out["extras"] = {}
    if not _RUN_ID.match(out.get("run_id", "")):
        raise ProtocolError("schema", "%s.run_id %r is not a run identity" % (cls.__name__, out["run_id"]))
    if cls in (Command, CommandReply, DeviceReply) and not _COMMAND_KIND.match(out["kind"]):
        raise ProtocolError("schema", "Command.kind %r is not a valid command name" % (out["kind"],))
    return out
