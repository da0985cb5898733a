"""Reading a simulator run folder back, strictly: every malformed line is an error naming the file
and the line, since a finished run has no partial lines to forgive (``streamfl report``)."""
import json
import math
from pathlib import Path
from typing import Dict, List, Optional

from streamfl.errors import StreamflError


def read_run_metrics(path: Path) -> List[Dict]:
    """Every event of ``metrics.jsonl``, strictly: a finished run has no partial lines to forgive."""
    path = Path(path)
    if not path.is_file():
        raise StreamflError("%s: not found (is this a simulator run directory?)" % path)
    records = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as exc:
                raise StreamflError("%s line %d: not valid JSON (%s)" % (path, lineno, exc)) from None
            if not isinstance(rec, dict):
                raise StreamflError("%s line %d: expected a JSON object" % (path, lineno))
            if rec.get("event") in ("eval", "update", "clp"):
                problem = _check_event(rec)
                if problem:
                    raise StreamflError("%s line %d: %s" % (path, lineno, problem))
                records.append(rec)
    return records


def _check_event(rec: Dict) -> Optional[str]:
    """What is wrong with a known event's fields, or None; optional numbers may be null or NaN."""
    kinds = {"method": (str,), "seed": (int,), "t_s": (int, float), "clock_levels": (dict,)}
    kinds.update((k, (int, float)) for k in ("accuracy", "accuracy_seen", "energy_j", "fisher_global"))
    for key, types in kinds.items():
        value, required = rec.get(key), key in ("method", "seed", "t_s")
        if (value is not None or required) and (not isinstance(value, types) or isinstance(value, bool)
                                                or (key == "t_s" and math.isnan(value))):
            return "%s event with %s %r" % (rec["event"], "a missing or bad" if required else "a bad", key)
    return None


def read_summary(path: Path) -> Dict:
    """``summary.json`` with its ``methods`` mapping checked."""
    path = Path(path)
    if not path.is_file():
        raise StreamflError("%s: not found (is this a simulator run directory?)" % path)
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise StreamflError("%s line %d: not valid JSON (%s)" % (path, exc.lineno, exc.msg)) from None
    if not isinstance(summary, dict) or not isinstance(summary.get("methods", {}), dict):
        raise StreamflError("%s: expected an object with a 'methods' object" % path)
    for name, entry in summary.get("methods", {}).items():
        if not isinstance(entry, dict):
            raise StreamflError("%s: methods[%r] is not an object" % (path, name))
    return summary
