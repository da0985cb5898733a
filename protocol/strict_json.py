"""The JSON texts of a frame parsed strictly: no NaN or Infinity, bounded nesting, typed errors only.

A frame carries two JSON texts, its header and the safetensors block header; both come from the
network, so a parse error, a non-finite number or a nesting that would exhaust the stack must end
as a ``ProtocolError`` with a reason the decoder counts, never as a traceback in a runtime.
"""
import json
import math
from typing import Any

from streamfl.errors import ProtocolError


class _NonFinite(ValueError):
    """A NaN, Infinity or overflowing number spelled in JSON text."""


def _reject_constant(text: str) -> Any:
    raise _NonFinite(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NonFinite(text)
    return value


#: Header text: floats must be finite.
HEADER_DECODER = json.JSONDecoder(parse_float=_parse_float, parse_constant=_reject_constant)
#: Block header text: plain JSON (its numbers are checked by ``tensorblock.parse_block``).
BLOCK_DECODER = json.JSONDecoder()


def loads(raw: bytes, decoder: json.JSONDecoder, what: str) -> Any:
    """Strict JSON from UTF-8 bytes; NaN/Infinity/overflowing floats raise ``non_finite``."""
    try:
        return decoder.decode(raw.decode("utf-8"))
    except _NonFinite as exc:
        raise ProtocolError("non_finite", "%s has non-finite number %s" % (what, exc)) from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ProtocolError("malformed", "%s: %s" % (what, exc)) from None


def depth_at_most(value: Any, limit: int) -> bool:
    """True if ``value`` nests at most ``limit`` lists/objects (iterative: deep input cannot recurse)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        if depth > limit:
            return False
        stack.extend((child, depth + 1) for child in item if isinstance(child, (dict, list)))
    return True
