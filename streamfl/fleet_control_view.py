"""What ``streamfl operator pause|resume|logs|set`` prints: one line per target board saying
answered, refused (why), timed out or offline, and a ``logs`` answer's lines under its board.

Every text here came from a board, so control characters are shown escaped (``\\x1b``): a log line
must not move the operator's cursor or recolour the terminal.
"""
import re
from typing import Any, Dict, List, Mapping

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
#: How each state reads in the table.
STATE_WORDS = {"answered": "answered", "refused": "REFUSED", "timed_out": "TIMED OUT",
               "offline": "OFFLINE"}


def safe(text: Any) -> str:
    """``text`` with control characters escaped."""
    return _CONTROL.sub(lambda m: "\\x%02x" % ord(m.group()), str(text))


def _answer_text(kind: str, answer: Mapping[str, Any]) -> str:
    if kind in ("pause", "resume"):
        now = "paused" if answer.get("paused") else "running"
        was = "paused" if answer.get("was_paused") else "running"
        return now if now != was else "%s (already)" % now
    if kind == "set":
        return "%s: %s -> %s" % (safe(answer.get("name")), answer.get("old"), answer.get("new"))
    if kind == "logs":
        n, dropped = len(answer.get("lines") or []), answer.get("dropped_lines") or 0
        return "%d line(s)%s" % (n, " (%d older ones left out to fit)" % dropped if dropped else "")
    return ""


def render_boards(kind: str, result: Mapping[str, Any]) -> str:
    """The per-board table of a fleet-control answer (``CommandReply.result``)."""
    devices: Dict[str, Mapping[str, Any]] = dict(result.get("devices") or {})
    if not devices:
        return "%s: no board to send it to" % kind
    width = max(len(safe(d)) for d in devices)
    out: List[str] = []
    for device_id in sorted(devices):
        target = devices[device_id] or {}
        state = target.get("state", "")
        if state == "answered":
            detail = _answer_text(kind, target.get("answer") or {})
        else:
            detail = safe(target.get("reason", ""))
        out.append("%-*s  %-9s  %s" % (width, safe(device_id), STATE_WORDS.get(state, safe(state)),
                                       detail))
        if kind == "logs" and state == "answered":
            out.extend("    " + safe(line) for line in (target.get("answer") or {}).get("lines") or [])
    states = result.get("states") or {}
    out.append("%s: %s" % (kind, ", ".join("%d %s" % (n, STATE_WORDS.get(s, s).lower().replace("_", " "))
                                           for s, n in sorted(states.items()))))
    return "\n".join(out)
