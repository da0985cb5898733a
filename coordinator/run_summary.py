"""A real fleet's run, summed up at stop: ``summary.json`` in the run folder and readable log lines.

``summary.json`` has the simulator's shape (``methods: {name: figures}``, the run as its one
seed), so ``streamfl report`` reads a real run's folder as it reads a simulated one; the
figures a real fleet adds (updates by fate, rejections by reason, the server's counters) sit
beside them. Counts that differ say why: every update received is accounted for by its fate.

The summary is the run's, not the last process's (``run_record.py``): ``started`` and
``duration_s`` are the run's (seconds since it started, on ``metrics.jsonl``'s axis), the figures
and counters span every coordinator process of the run, and ``processes`` lists them: when each
started and was last heard of, how it ended (a clean stop, a step-down, or no stop line: killed,
crashed or lost power), the version it resumed from.
"""
import json
import logging
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

from streamfl.fileio import atomic_write

log = logging.getLogger(__name__)

SUMMARY_FILE = "summary.json"

#: Processes of a run the log line at stop names (``summary.json`` lists them all).
LOG_PROCESSES = 5

#: Why an update was not merged, in words, for each fate (``UpdateRecord.outcome``).
FATES = {
    "aggregated": "merged into a new version",
    "buffered": "waiting for the next round (merged later, or dropped at stop)",
    "stale": "too stale to merge (max_staleness)",
    "duplicate": "resent by an agent that had not seen its acknowledgement (dropped)",
    "rejected": "refused by admission",
    "withheld": "kept from the strategy by a method",
}


def run_summary(figures: Mapping[str, Any], counters: Mapping[str, int], *, fleet: str, run_id: str,
                method: str, seed: int, started_wall_s: float, duration_s: float,
                processes: Sequence[Mapping[str, Any]] = ()) -> Dict[str, Any]:
    """The run's ``summary.json`` content from the fleet table's ``figures()`` and the run's
    counters (``run_record.run_counters``); ``processes``: the run's coordinator processes,
    oldest first (``run_record.processes`` and this one)."""
    one = dict(figures)
    entry: Dict[str, Any] = {"seeds": 1, "runs": [one], "time_to_accuracy_s": {},
                             "energy_to_accuracy_j": {}, "reached": {}}
    for key in ("final_accuracy", "mean_accuracy", "energy_j"):
        if one.get(key) is not None:
            entry[key], entry[key + "_std"] = one[key], 0.0
    return {"kind": "fleet", "scenario": "fleet %s" % fleet, "fleet": fleet, "run_id": run_id,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started_wall_s)),
            "duration_s": round(duration_s, 3), "seeds": [seed], "thresholds": [],
            "devices": len(one.get("devices") or ()), "methods": {method: entry},
            "counters": dict(sorted(counters.items())),
            "processes": [dict(p) for p in processes], "restarts": max(0, len(processes) - 1)}


def write_summary(run_dir: Path, summary: Mapping[str, Any]) -> Path:
    """Write ``summary.json`` atomically (a crash leaves the previous one or none); ``OSError``
    if it cannot be written."""
    path = Path(run_dir) / SUMMARY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, (json.dumps(summary, indent=1) + "\n").encode("utf-8"))
    return path


def _num(value: Any, pattern: str = "%.4f") -> str:
    return "-" if value is None else pattern % value


def summary_lines(summary: Mapping[str, Any]) -> List[str]:
    """The summary as a few readable lines for the log at stop."""
    (method, entry), = summary["methods"].items()
    f = entry["runs"][0]
    c = summary.get("counters") or {}
    fates = f.get("updates_by_outcome") or {}
    lines = ["run %s of fleet %s (%s): %.0f s, %d version(s), %d device(s)" % (
        summary.get("run_id", ""), summary.get("fleet", ""), method, summary.get("duration_s", 0.0),
        c.get("version", 0), summary.get("devices", 0))]
    procs = summary.get("processes") or []
    if len(procs) > 1:
        shown = procs[-LOG_PROCESSES:]
        lines.append("%d coordinator processes%s: %s" % (
            len(procs), "" if len(shown) == len(procs) else " (the last %d)" % len(shown), "; ".join(
                "from %.0f s to %.0f s, %s" % (p.get("started_t_s") or 0.0, p.get("last_t_s") or 0.0,
                                              p.get("ended") or "?") for p in shown)))
    if f.get("evaluations"):
        lines.append("accuracy: %s at the end, %s at the start, %s best, %s mean over %d evaluations" % (
            _num(f.get("final_accuracy")), _num(f.get("initial_accuracy")), _num(f.get("best_accuracy")),
            _num(f.get("mean_accuracy")), f["evaluations"]))
    else:
        lines.append("accuracy: not measured (no eval_path)")
    lines.append("updates: %d received; %s" % (f.get("updates", 0), "; ".join(
        "%d %s" % (n, FATES.get(k, k)) for k, n in fates.items() if n) or "none"))
    if f.get("rejected_by_reason"):
        lines.append("rejected by reason: %s" % ", ".join(
            "%s %d" % kv for kv in f["rejected_by_reason"].items()))
    frames = c.get("frames_rejected", 0)
    if frames:
        lines.append("frames refused before they became updates (malformed, oversize, ...): %d" % frames)
    lines.append("staleness: mean %s, max %s; clipped updates: %d" % (
        _num(f.get("mean_staleness"), "%.2f"), _num(f.get("max_staleness"), "%d"), f.get("clipped", 0)))
    energy = f.get("energy_j_per_device") or {}
    lines.append("energy: %s J in all%s" % (_num(f.get("energy_j"), "%.1f"), (": " + ", ".join(
        "%s %.1f J" % kv for kv in energy.items())) if energy and len(energy) <= 30 else ""))
    return lines
