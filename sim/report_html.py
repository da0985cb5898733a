"""``streamfl report DIR``: one HTML page comparing a simulator run's methods over seeds.

Input is a simulator run directory (``metrics.jsonl`` events tagged with method, seed and
virtual ``time_s``; ``summary.json`` means, spreads and per-seed runs), read with
``streamfl.coordinator.metrics.read_metrics`` and ``streamfl.sim.summary.read_summary``. The page
holds the methods table (``streamfl.sim.tables``) and the PNG plots (``streamfl.sim.plots``) written
next to it.

A real fleet's run folder (``summary.json`` of kind ``fleet``, ``coordinator/run_summary.py``) is
read the same way, on the run's one time axis across its coordinator processes: a record from
before process lines, whose times restarted at 0 with each process, is put on it by wall time
(``run_times``), and each process's start is a dashed line on the plot against time and a line of
the page.
"""
import html
import logging
from pathlib import Path
from typing import Dict, List, Optional

from streamfl import __version__
from streamfl.coordinator.metrics import PROCESS_START, process_starts, read_metrics, run_times
from streamfl.sim.plots import (have_matplotlib, plot_accuracy_curves, plot_clock_levels_by_method,
                                plot_clp)
from streamfl.sim.summary import read_summary
from streamfl.sim.tables import fmt_value, is_number, methods_table, natural_key

log = logging.getLogger(__name__)

#: The events the report draws, and the fields each must have.
REPORT_EVENTS = ("eval", "update", "clp", PROCESS_START)
REQUIRED_FIELDS = ("method", "seed", "time_s")

CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:14px}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}.meta{color:#555}.how{background:#f8f8e8;padding:.6em}
figure{margin:1.5em 0}img{max-width:100%}figcaption{color:#555;font-size:13px}"""

CAPTIONS = {
    "accuracy_vs_time.png": "Accuracy of the global model against virtual time (a fleet run: "
                            "wall-clock time since the run started; dashed lines: coordinator "
                            "processes starting).",
    "accuracy_vs_rounds.png": "Accuracy against rounds (global versions), mean and spread over seeds.",
    "accuracy_vs_energy.png": "Accuracy against cumulative fleet energy (training and idle).",
    "clock_levels.png": "Clock of each device's scaled domain over time (first seed), in MHz "
                        "through its board profile (levels where a board's profile is unknown).",
    "clp.png": "Global Fisher information over time; shaded spans are detected critical learning periods.",
}


def read_run_metrics(path: Path) -> List[Dict]:
    """The events of a finished simulator run's ``metrics.jsonl`` the report draws, strictly."""
    return read_metrics(path, strict=True, events=REPORT_EVENTS, required=REQUIRED_FIELDS)


def _by_method_seed(records: List[Dict], event: str) -> Dict[str, Dict[int, List[Dict]]]:
    """Events of one kind grouped by method then seed, each list sorted by virtual time."""
    out: Dict[str, Dict[int, List[Dict]]] = {}
    for rec in records:
        if rec["event"] == event:
            out.setdefault(rec["method"], {}).setdefault(rec["seed"], []).append(rec)
    for seeds in out.values():
        for recs in seeds.values():
            recs.sort(key=lambda r: r["time_s"])
    return out


def boards_by_method_seed(summary: Dict) -> Dict[str, Dict[int, Dict[str, str]]]:
    """Each run's device -> board profile name, by method then seed, from ``summary.json``'s
    per-seed runs (what converts the clock plot's levels to MHz)."""
    out: Dict[str, Dict[int, Dict[str, str]]] = {}
    for method, entry in (summary.get("methods") or {}).items():
        for run in (entry.get("runs") or []) if isinstance(entry, dict) else []:
            devices = run.get("devices") if isinstance(run, dict) else None
            if isinstance(run.get("seed"), int) and isinstance(devices, dict):
                out.setdefault(method, {})[run["seed"]] = {
                    str(dev): d["board"] for dev, d in devices.items()
                    if isinstance(d, dict) and isinstance(d.get("board"), str)}
    return out


def fleet_time_axis(records: List[Dict]) -> List[float]:
    """A real fleet run's records put on the run's one time axis (in place; see the module
    docstring); returns when each coordinator process started, when more than one did."""
    starts = process_starts(records)  # before the times are rewritten: where they fell back
    for rec, t in zip(records, run_times(records)):
        rec["time_s"] = t
    return starts if len(starts) > 1 else []


def _t(value) -> str:
    return "%.1f" % value if is_number(value) else "?"


def processes_line(summary: Dict, starts: List[float]) -> str:
    """The run's coordinator processes in one line ("" for one): from ``summary.json``'s
    ``processes``, else where the record says processes started."""
    procs = [p for p in summary.get("processes") or [] if isinstance(p, dict)]
    if len(procs) > 1:
        return "%d coordinator processes: %s" % (len(procs), "; ".join(
            "from %s s to %s s, %s" % (_t(p.get("started_t_s")), _t(p.get("last_t_s")),
                                       p.get("ended") or "?") for p in procs))
    if len(starts) > 1:
        return "%d coordinator processes, started at %s s" % (len(starts), ", ".join(_t(t) for t in starts))
    return ""


def render_html(summary: Dict, images: List[str], title: str, starts: List[float] = ()) -> str:
    """The self-contained page; images are referenced by file name next to it."""
    e = html.escape
    seeds = summary.get("seeds") or []
    fleet_run = summary.get("kind") == "fleet"  # a real fleet's run folder (coordinator/run_summary.py)
    meta = "duration %s s of %s time · seeds %s · thresholds %s" % (
        fmt_value(summary["duration_s"]) if is_number(summary.get("duration_s")) else "?",
        "wall-clock" if fleet_run else "virtual",
        ", ".join(str(s) for s in seeds) or "?",
        ", ".join(str(t) for t in summary.get("thresholds") or []) or "none")
    procs = processes_line(summary, list(starts)) if fleet_run else ""
    if procs:
        meta += " · " + procs
    how = ("How to read: table cells are mean ± standard deviation over the %d seed(s) (population std); "
           "time to accuracy is the virtual time until the global model first reaches the threshold, "
           "with the seeds that reached it counted when not all did. Plot lines are the mean over seeds "
           "on a common grid and shaded bands span the minimum to the maximum seed." % len(seeds))
    figures = "".join('<figure><img src="%s" alt="%s"><figcaption>%s</figcaption></figure>'
                      % (e(name, quote=True), e(name, quote=True), e(CAPTIONS.get(name, name)))
                      for name in images)
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>%s</title>"
            "<style>%s</style></head><body><h1>%s</h1><p class=\"meta\">%s</p><p class=\"how\">%s</p>"
            "%s%s<p class=\"meta\">streamfl %s</p></body></html>\n"
            % (e(title), CSS, e(title), e(meta), e(how), methods_table(summary),
               figures, e(__version__)))


def render_report(run_dir: Path, out_dir: Optional[Path] = None) -> Path:
    """Read a simulator run directory, write its PNG plots and ``report.html``; return the HTML path."""
    run_dir = Path(run_dir)
    out_dir = Path(out_dir) if out_dir is not None else run_dir
    records = read_run_metrics(run_dir / "metrics.jsonl")
    summary = read_summary(run_dir / "summary.json")
    starts = fleet_time_axis(records) if summary.get("kind") == "fleet" else []
    records = [r for r in records if r["event"] != PROCESS_START]
    out_dir.mkdir(parents=True, exist_ok=True)
    methods = list(summary.get("methods", {}))
    methods += sorted({r["method"] for r in records} - set(methods), key=natural_key)
    seeds = [s for s in summary.get("seeds") or [] if isinstance(s, int)]
    thresholds = [t for t in summary.get("thresholds") or [] if is_number(t)]
    images: List[str] = []
    fleet = summary.get("kind") == "fleet"
    if have_matplotlib("plots in the report"):
        evals = _by_method_seed(records, "eval")
        plots = [("accuracy_vs_time.png",
                  lambda p: plot_accuracy_curves(evals, methods, "time_s", p, thresholds, marks=starts[1:],
                                                 time_label="time since the run started" if fleet
                                                 else "virtual time")),
                 ("accuracy_vs_rounds.png",
                  lambda p: plot_accuracy_curves(evals, methods, "version", p, thresholds)),
                 ("accuracy_vs_energy.png",
                  lambda p: plot_accuracy_curves(evals, methods, "energy_j", p)),
                 ("clock_levels.png", lambda p: plot_clock_levels_by_method(
                     _by_method_seed(records, "update"), methods, p, seeds,
                     boards_by_method_seed(summary))),
                 ("clp.png", lambda p: plot_clp(_by_method_seed(records, "clp"), methods, p, seeds))]
        for name, draw in plots:
            if draw(out_dir / name) is not None:
                images.append(name)
            else:
                log.info("%s: nothing to plot", name)
                if (out_dir / name).exists():  # a stale plot from an earlier render of this directory
                    (out_dir / name).unlink()
    title = "streamfl %s: %s" % ("fleet run" if summary.get("kind") == "fleet" else "simulation",
                                 summary.get("scenario", run_dir.name))
    out = out_dir / "report.html"
    out.write_text(render_html(summary, images, title, starts), encoding="utf-8")
    log.info("report written to %s (%d plots)", out, len(images))
    return out
