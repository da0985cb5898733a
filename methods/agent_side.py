"""The agent side of a named method, and how a coordinator running it tells the boards.

A named method (``streamfl.methods.base.Method``) sets coordinator keys, coordinator plug-ins and,
for the boards, ``AgentConfig`` keys (``agent``) and a clock policy (``dvfs_policy``). On a fleet
the coordinator that runs it (``streamfl-coordinator --method NAME``) puts the boards' part in
every global model as the ``method_settings`` extra (``MethodSettings``), so boards need no
per-method YAML; each board checks every value against its own config's declared ranges and
applies only what a coordinator may set (``streamfl.agent.method_settings``).

Why an extra of the global model and not a command: the model is retained and reaches every
board, a late one too; it is signed with the model where the fleet signs, under the same run
identity, replay and version rules (``agent/model_gate.py``); and "the coordinator stopped sending
them" has one meaning, a newest model without the extra, on which the board goes back to its own
config, as a plug-in goes dormant. A command is per device, not retained, and would need its own
re-sending, ordering and expiry.

What a coordinator may set (``split``; the rest of a method's agent side is each board's own):

- ``plugins.<name>.<key>``: the settings of the methods' agent plug-ins, except the keys a
  plug-in's settings dataclass names in ``BOARD_KEYS`` (facts of the board, e.g. its radio);
- ``dvfs.policy`` and ``dvfs.policy_options``: the clock policy, one of ``SENT_POLICIES`` (those
  that plan over whatever domains a board has; ``fixed`` names a board's domains, so it is the
  board's own), except ``power_w`` (the board's power model comes from its own profile), and never
  on a board whose own ``dvfs.policy`` is ``none`` (clocks move only where the board's operator
  chose a policy).

Never: the buffer (``buffer_capacity``, ``min_buffer``: its memory is allocated and checked at
start against the board's), the broker, paths, identity, keys, limits (``hparam_limits``,
``max_skip_rounds``). The hyper-parameters travel as they always have, in the model's ``hparams``,
clamped to each board's ``hparam_limits``.

The payload's ``parse`` checks only its shape (sizes, nesting, scalar leaves; ``check_shape``):
a frame outside it is refused whole, like any payload out of its bounds. What each value means,
and whether it is in range, is for the board to judge key by key against its own config, so that
one bad key costs that key, not the model.
"""
import json
import math
import re
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Mapping, Tuple

from streamfl.errors import ProtocolError
from streamfl.methods.base import Method
from streamfl.protocol.extras import MAX_EXACT_INT, Extra, check_keys, no_tensors, register_extra

#: The extra's kind in a global model.
KIND = "method_settings"
#: Sections of the agent YAML a coordinator may set, and under ``dvfs`` the keys it may set.
SENT_SECTIONS = ("plugins", "dvfs")
CLOCK_KEYS = ("policy", "policy_options")
#: Clock policies a coordinator may send: each plans over whatever domains a board has.
SENT_POLICIES = ("none", "performance", "powersave", "clp-aware")
#: Clock policy options that are facts of the board: never sent, never applied from the network.
BOARD_POLICY_OPTIONS = ("power_w",)
#: The class attribute of a plug-in's settings dataclass naming its keys that are the board's own.
BOARD_KEYS_ATTR = "BOARD_KEYS"

#: A method's name: what ``streamfl sim --methods`` takes (``fedasync+balance-rest``).
NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")
#: A key at any level: a plug-in, a setting or a clock domain name.
KEY_RE = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")

# Shape limits. The largest shipped agent side is 4 mappings deep (settings > dvfs >
# policy_options > a fixed policy's levels) with a handful of keys; these leave room for any
# plug-in's settings and keep a hostile payload to a few kilobytes of work.
#: Mappings nested in the settings, the settings themselves counted.
MAX_DEPTH = 5
#: Keys of one mapping.
MAX_KEYS = 32
#: Scalar values in all.
MAX_VALUES = 256
#: Items of one list (lists hold scalars only).
MAX_LIST = 32
#: Characters of one string value.
MAX_STRING = 128
#: Bytes of the settings as canonical JSON.
MAX_JSON_BYTES = 8192


def _bad(where: str, what: str) -> ProtocolError:
    return ProtocolError("schema", "extras.%s.%s: %s" % (KIND, where, what))


def check_shape(settings: Any, where: str = "settings") -> None:
    """``ProtocolError("schema")`` unless ``settings`` is a mapping of names to mappings, lists of
    scalars and scalars (bool, finite number, string, null) within the limits above."""
    if not isinstance(settings, Mapping):
        raise _bad(where, "expected an object, got %.80r" % (settings,))
    values = 0
    stack = [(settings, where, 1)]
    while stack:
        node, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _bad(path, "nested deeper than %d objects" % MAX_DEPTH)
        if len(node) > MAX_KEYS:
            raise _bad(path, "%d keys, at most %d" % (len(node), MAX_KEYS))
        for key, value in node.items():
            if not isinstance(key, str) or not KEY_RE.match(key):
                raise _bad(path, "key %.80r is not a name" % (key,))
            at = "%s.%s" % (path, key)
            if isinstance(value, Mapping):
                stack.append((value, at, depth + 1))
                continue
            items = value if isinstance(value, list) else [value]
            if isinstance(value, list) and len(value) > MAX_LIST:
                raise _bad(at, "%d items, at most %d" % (len(value), MAX_LIST))
            for item in items:
                _check_scalar(item, at)
            values += len(items)
            if values > MAX_VALUES:
                raise _bad(where, "more than %d values" % MAX_VALUES)
    if len(canonical(settings).encode("utf-8")) > MAX_JSON_BYTES:
        raise _bad(where, "more than %d bytes" % MAX_JSON_BYTES)


def _check_scalar(value: Any, where: str) -> None:
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if abs(value) > MAX_EXACT_INT:
            raise _bad(where, "integer beyond 2^53")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _bad(where, "expected a finite number, got %r" % value)
        return
    if isinstance(value, str):
        if len(value) > MAX_STRING:
            raise _bad(where, "string of %d characters, at most %d" % (len(value), MAX_STRING))
        return
    raise _bad(where, "expected a number, string, true/false or null, got %.80r" % (value,))


def canonical(settings: Mapping[str, Any]) -> str:
    """The settings as one JSON text (sorted keys, no spaces): equal settings, equal text."""
    return json.dumps(settings, sort_keys=True, separators=(",", ":"), allow_nan=False)


@register_extra
@dataclass(frozen=True)
class MethodSettings(Extra):
    """The agent side of the named method the coordinator runs: its name and the settings a
    coordinator may set on a board (``split``), shaped like the agent YAML. On the wire the
    settings are a JSON object; here they are kept as canonical JSON text (``settings``, the
    parsed mapping), so that the payload is frozen and two equal ones compare equal."""

    KIND: ClassVar[str] = KIND
    #: No numbers of its own: each setting's range is the board's config's (module docstring).
    BOUNDS: ClassVar[Mapping[str, Any]] = {}

    #: The named method (``streamfl methods``), for the boards' logs.
    method: str = ""
    #: The settings as canonical JSON (``canonical``).
    settings_json: str = "{}"

    @classmethod
    def of(cls, method: str, settings: Mapping[str, Any]) -> "MethodSettings":
        """The payload for ``settings``; ``ProtocolError`` if the name or the shape is refused."""
        if not isinstance(method, str) or not NAME_RE.match(method):
            raise _bad("method", "expected a method name, got %.80r" % (method,))
        check_shape(settings)
        return cls(method, canonical(settings))

    @property
    def settings(self) -> Dict[str, Any]:
        """The settings as a fresh mapping (the caller may change it)."""
        return json.loads(self.settings_json)

    def fields(self) -> Dict[str, Any]:
        return {"method": self.method, "settings": self.settings}

    @classmethod
    def parse(cls, fields: Mapping[str, Any], groups: Mapping[str, Any]) -> "MethodSettings":
        no_tensors(KIND, groups)
        check_keys(KIND, fields, ("method", "settings"))
        return cls.of(fields.get("method", ""), fields.get("settings", {}))


@dataclass(frozen=True)
class AgentSide:
    """A method's agent side, split: what its coordinator sends the boards (``sent``, shaped like
    the agent YAML) and what stays each board's own (``board``: to be set in the agent YAMLs)."""

    sent: Dict[str, Any]
    board: Dict[str, Any]


def split(method: Method) -> AgentSide:
    """``method``'s ``agent`` keys and ``dvfs_policy`` as what a coordinator may send and what
    each board must set itself (module docstring)."""
    sent: Dict[str, Any] = {}
    board: Dict[str, Any] = {}
    for key, value in method.agent.items():
        if key == "plugins":
            sent["plugins"] = {name: dict(values or {}) for name, values in value.items()}
        elif key != "dvfs":
            board[key] = value
    dvfs = dict(method.agent.get("dvfs") or {})
    if method.dvfs_policy is not None:
        dvfs = dict({"policy": method.dvfs_policy}, **{k: v for k, v in dvfs.items() if k != "policy"})
    clocks: Dict[str, Any] = {}
    for key, value in dvfs.items():
        if key == "policy_options":
            options = dict(value or {})
            kept = {k: options.pop(k) for k in BOARD_POLICY_OPTIONS if k in options}
            if kept:
                board.setdefault("dvfs", {})["policy_options"] = kept
            clocks["policy_options"] = options
        elif key in CLOCK_KEYS:
            clocks[key] = value
        else:
            board.setdefault("dvfs", {})[key] = value
    if clocks.get("policy", SENT_POLICIES[0]) not in SENT_POLICIES:
        board.setdefault("dvfs", {}).update(clocks)
    elif clocks:
        sent["dvfs"] = clocks
    return AgentSide(sent, board)


def method_settings(method: Method) -> MethodSettings:
    """The extra a coordinator running ``method`` puts in every global model."""
    return MethodSettings.of(method.name, split(method).sent)


def board_keys(config_cls: type) -> Tuple[str, ...]:
    """The keys of a plug-in's settings dataclass that are its board's own (``BOARD_KEYS``)."""
    return tuple(getattr(config_cls, BOARD_KEYS_ATTR, ()) or ())


__all__ = ["KIND", "SENT_SECTIONS", "CLOCK_KEYS", "SENT_POLICIES", "BOARD_POLICY_OPTIONS", "MethodSettings",
           "AgentSide", "split", "method_settings", "check_shape", "canonical", "board_keys"]
