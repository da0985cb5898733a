"""The bounds of fleet control's board answers (``DeviceReply``), shared by the agent that writes
them and the coordinator that must not trust them.

A board's answer is hostile until bounded, like everything a device sends: the coordinator drops a
reply frame over ``MAX_REPLY_BYTES`` unread, and ``check_result`` keeps only what each kind may
say, in the shape it may say it, so that nothing but short strings and plain numbers reaches the
operator's screen.

Choices:

- ``MAX_REPLY_BYTES`` 64 KiB: room for ``MAX_LOG_LINES`` lines of ``MAX_LOG_LINE_CHARS`` ASCII
  characters (60 000 bytes) and the frame around them, a fraction of any broker's message size;
  an agent drops its oldest lines until its answer fits;
- ``MAX_LOG_LINES`` 200 and ``MAX_LOG_LINE_CHARS`` 300: what a person reads on a screen to see
  why a board misbehaves (a traceback's last frames, the last rounds' lines); an agent's
  ``control.log_lines`` and ``control.log_line_chars`` may ask for fewer, never more;
- ``MAX_ERROR_CHARS`` 300: a refusal's reason is one sentence.
"""
import math
from typing import Any, Dict, List, Mapping, Optional

from streamfl.errors import ProtocolError

MAX_REPLY_BYTES = 64 * 1024
MAX_LOG_LINES = 200
MAX_LOG_LINE_CHARS = 300
MAX_ERROR_CHARS = 300
#: A setting's name: the agent YAML key it changes.
MAX_SETTING_CHARS = 64


def _text(value: Any, limit: int, path: str) -> str:
    if not isinstance(value, str):
        raise ProtocolError("schema", "%s: expected a string" % path)
    if len(value) > limit:
        raise ProtocolError("schema", "%s: %d characters, at most %d" % (path, len(value), limit))
    return value


def _number(value: Any, path: str) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ProtocolError("schema", "%s: expected a finite number" % path)
    return value


def check_result(kind: str, result: Mapping[str, Any]) -> Dict[str, Any]:
    """The answer of a board to a ``kind`` command, checked field by field (``ProtocolError
    ("schema")`` for anything else): ``pause``/``resume``: ``paused`` and ``was_paused`` (bools);
    ``logs``: ``lines`` (at most ``MAX_LOG_LINES`` strings of ``MAX_LOG_LINE_CHARS``) and
    ``dropped_lines`` (a count); ``set``: ``name``, ``old`` and ``new`` (numbers or null)."""
    out: Dict[str, Any] = {}
    if kind in ("pause", "resume"):
        allowed = {"paused", "was_paused"}
        for key in allowed & set(result):
            if type(result[key]) is not bool:
                raise ProtocolError("schema", "DeviceReply.result.%s: expected a boolean" % key)
            out[key] = result[key]
    elif kind == "logs":
        allowed = {"lines", "dropped_lines"}
        lines = result.get("lines", [])
        if not isinstance(lines, list) or len(lines) > MAX_LOG_LINES:
            raise ProtocolError("schema", "DeviceReply.result.lines: expected a list of at most %d "
                                          "lines" % MAX_LOG_LINES)
        out["lines"] = [_text(line, MAX_LOG_LINE_CHARS, "DeviceReply.result.lines") for line in lines]
        dropped = result.get("dropped_lines", 0)
        if type(dropped) is not int or dropped < 0:
            raise ProtocolError("schema", "DeviceReply.result.dropped_lines: expected a count")
        out["dropped_lines"] = dropped
    elif kind == "set":
        allowed = {"name", "old", "new"}
        out["name"] = _text(result.get("name", ""), MAX_SETTING_CHARS, "DeviceReply.result.name")
        for key in ("old", "new"):
            out[key] = _number(result.get(key), "DeviceReply.result.%s" % key)
    else:
        raise ProtocolError("schema", "DeviceReply.kind %r is not a fleet-control kind" % (kind,))
    extra = set(result) - allowed
    if extra:
        raise ProtocolError("schema", "DeviceReply.result: unexpected fields %s" % sorted(extra))
    return out


def check_error(text: str) -> str:
    """A refusal's reason, bounded."""
    return _text(text, MAX_ERROR_CHARS, "DeviceReply.error")


def fit_lines(lines: List[str], encoded_size, budget_bytes: int = MAX_REPLY_BYTES) -> int:
    """How many of the oldest ``lines`` to drop so that ``encoded_size(kept lines)`` fits in
    ``budget_bytes`` (the agent's side: its answer must pass the coordinator's bound)."""
    lo, hi = 0, len(lines)
    if encoded_size(lines) <= budget_bytes:
        return 0
    while lo < hi:  # the fewest dropped that fit (dropping all fits: the frame alone is small)
        mid = (lo + hi) // 2
        if encoded_size(lines[mid:]) <= budget_bytes:
            hi = mid
        else:
            lo = mid + 1
    return lo
