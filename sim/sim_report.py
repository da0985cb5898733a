"""``streamfl report DIR``: PNG plots and one HTML page comparing a simulator run's methods over seeds.

Input is the run directory of DESIGN.md s7 (``metrics.jsonl`` events tagged with method, seed and
virtual ``t_s``; ``summary.json`` means, spreads and per-seed runs). Figures use an explicit Agg
canvas, not pyplot, so a report renders inside any process without touching its backend.
"""
import html
import logging
import math
import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from streamfl import __version__
from streamfl.sim.run_files import read_run_metrics, read_summary  # noqa: F401 (public here too)

log = logging.getLogger(__name__)

GRID_POINTS = 200
MAX_DEVICES_DRAWN = 12
KNOWN_METHOD_KEYS = ("final_accuracy", "energy_j", "time_to_accuracy_s", "runs")
TAB10 = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
         "#bcbd22", "#17becf")  # matplotlib's tab10, spelled out: the same colour per method everywhere


def _is_number(x) -> bool:
    """Numbers for tables and axes: bools and NaN are not."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not (
        isinstance(x, float) and math.isnan(x))


def _natural_key(text: str):
    """Sort ``dev2`` before ``dev10``."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", str(text))]


def band_over_seeds(curves: List[Tuple[List[float], List[float]]], points: int = GRID_POINTS):
    """Mean, min and max over seeds on a common grid; each seed counts only inside its own x range.

    Returns ``(grid, mean, lo, hi, count)`` as numpy arrays (NaN where no seed covers a point), or
    None when no curve has a point.
    """
    cleaned = []
    for xs, ys in curves:  # interpolation needs increasing x: sort, a repeated x keeps its latest y
        pts = dict(zip(map(float, xs), map(float, ys)))
        if pts:
            cleaned.append((sorted(pts), [pts[x] for x in sorted(pts)]))
    curves = cleaned
    if not curves:
        return None
    start, stop = min(xs[0] for xs, _ in curves), max(xs[-1] for xs, _ in curves)
    grid = np.linspace(start, stop, points) if stop > start else np.array([start])
    stack = np.array([np.interp(grid, xs, ys, left=np.nan, right=np.nan) for xs, ys in curves])
    count = np.sum(~np.isnan(stack), axis=0)
    mean = np.where(count > 0, np.nansum(stack, axis=0) / np.maximum(count, 1), np.nan)
    return grid, mean, np.fmin.reduce(stack, axis=0), np.fmax.reduce(stack, axis=0), count


def fmt_value(mean: Optional[float], std: Optional[float] = None) -> str:
    """``0.812 ± 0.010``: the precision follows the magnitude so mean and spread read alike."""
    if mean is None:
        return "–"
    scale = max(abs(mean), abs(std or 0.0))
    spec = ("%.0f" if scale >= 100 else "%.2f" if scale >= 1 else "%.3f" if scale >= 0.001
            or scale == 0 else "%.2e")
    return spec % mean if std is None else "%s ± %s" % (spec % mean, spec % std)


def _thresholds(methods: Dict[str, Dict]) -> List[str]:
    """Time-to-accuracy keys present in any method, sorted as the numbers they spell."""
    def order(key: str) -> Tuple[float, str]:
        try:
            return float(key), key
        except ValueError:
            return math.inf, key
    return sorted({k for e in methods.values() for k in (e.get("time_to_accuracy_s") or {})}, key=order)


def _extra_keys(methods: Dict[str, Dict]) -> List[str]:
    """Numeric per-method keys beyond the known ones, first seen first; ``K_std`` pairs with ``K``."""
    seen: List[str] = []
    for entry in methods.values():
        seen += [k for k, v in entry.items() if k not in KNOWN_METHOD_KEYS and k not in seen
                 and _is_number(v) and not (k.endswith("_std") and k[:-4] in entry)]
    return seen


def _cell(entry: Dict, key: str, n_seeds: int) -> str:
    """A method's value of ``key`` as mean ± std; the std comes from ``K_std`` or else the runs."""
    value = entry.get(key)
    if not _is_number(value):
        return "–"
    if n_seeds <= 1:
        return fmt_value(value)
    std = entry.get(key + "_std")
    if not _is_number(std):
        runs = [r.get(key) for r in entry.get("runs") or [] if isinstance(r, dict)]
        runs = [r for r in runs if _is_number(r)]
        std = float(np.std(runs)) if runs else None  # population std, ddof 0
    return fmt_value(value, std)


def _t2a_cell(entry: Dict, key: str, n_seeds: int) -> str:
    """Time to a threshold: mean ± std over the seeds that reached it, and how many did."""
    value = (entry.get("time_to_accuracy_s") or {}).get(key)
    if not _is_number(value):
        return "not reached"
    runs = [r for r in entry.get("runs") or [] if isinstance(r, dict)]
    reached = [(r.get("time_to_accuracy_s") or {}).get(key) for r in runs]
    reached = [t for t in reached if _is_number(t)]
    text = fmt_value(value, float(np.std(reached)) if n_seeds > 1 and len(reached) > 1 else None)
    if runs and len(reached) < len(runs):
        text += " (%d/%d seeds)" % (len(reached), len(runs))
    return text


def _new_figure(width: float, height: float):
    """A figure on an explicit Agg canvas: no pyplot registry, so nothing to leak or close."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: Path) -> Path:
    """Write a figure as PNG and drop its memory."""
    fig.tight_layout()
    fig.savefig(str(path), dpi=100)
    fig.clear()
    return path


def _draw_band(ax, band, color, label: str, scale: float = 1.0) -> None:
    """Mean line, and a min..max band where at least two seeds cover the grid."""
    grid, mean, lo, hi, count = band
    ax.plot(grid / scale, mean, color=color, label=label, linewidth=1.6,
            marker="o" if len(grid) == 1 else None)
    multi = count >= 2
    if np.any(multi):
        ax.fill_between(grid / scale, lo, hi, where=multi, color=color, alpha=0.18, linewidth=0)


def _by_method_seed(records: List[Dict], event: str) -> Dict[str, Dict[int, List[Dict]]]:
    """Events of one kind grouped by method then seed, each list sorted by virtual time."""
    out: Dict[str, Dict[int, List[Dict]]] = {}
    for rec in records:
        if rec["event"] == event:
            out.setdefault(rec["method"], {}).setdefault(rec["seed"], []).append(rec)
    for seeds in out.values():
        for recs in seeds.values():
            recs.sort(key=lambda r: r["t_s"])
    return out


def plot_accuracy_curves(evals, methods: List[str], x_key: str, out_path: Path,
                         thresholds: Sequence[float] = ()) -> Optional[Path]:
    """Accuracy (and accuracy on classes seen, when recorded) against ``t_s`` or ``energy_j``."""
    y_keys = ["accuracy"]
    if any(r.get("accuracy_seen") is not None for s in evals.values() for rs in s.values() for r in rs):
        y_keys.append("accuracy_seen")
    bands = {}
    for method in methods:
        for y_key in y_keys:
            points = [[(r[x_key], r[y_key]) for r in rs
                       if _is_number(r.get(x_key)) and _is_number(r.get(y_key))]
                      for rs in evals.get(method, {}).values()]
            band = band_over_seeds([([x for x, _ in pts], [y for _, y in pts]) for pts in points])
            if band is not None:
                bands[method, y_key] = band
    if not bands:
        return None
    scale, unit = 1.0, "s" if x_key == "t_s" else "J"
    if x_key == "energy_j" and max(float(b[0][-1]) for b in bands.values()) >= 1e4:
        scale, unit = 1000.0, "kJ"
    fig = _new_figure(6.5 * len(y_keys), 4.2)
    for col, y_key in enumerate(y_keys):
        ax = fig.add_subplot(1, len(y_keys), col + 1)
        for i, method in enumerate(methods):
            if (method, y_key) in bands:
                _draw_band(ax, bands[method, y_key], TAB10[i % 10], method, scale)
        for th in thresholds:
            ax.axhline(th, color="grey", linestyle=":", linewidth=0.8)
        ax.set_xlabel(("virtual time (%s)" if x_key == "t_s" else "fleet energy (%s)") % unit)
        ax.set_ylabel("accuracy, all classes" if y_key == "accuracy" else "accuracy, classes seen so far")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower right", fontsize=8)
    fig.suptitle("accuracy against %s: mean over seeds, band = min..max"
                 % ("virtual time" if x_key == "t_s" else "energy"), fontsize=10)
    return _save(fig, out_path)


def _first_seed(per_seed: Dict[int, List[Dict]], seeds: Sequence[int]) -> int:
    """The summary's first seed when this method has it, else the smallest seed it has."""
    return next((s for s in seeds if s in per_seed), min(per_seed))


def plot_clock_levels_by_method(updates, methods: List[str], out_path: Path,
                                seeds: Sequence[int] = ()) -> Optional[Path]:
    """Per method, one seed's clock level of each device's scaled domain (GPU, else the first)."""
    panels = []
    for method in methods:
        per_seed = {s: [r for r in rs if r.get("clock_levels")] for s, rs in updates.get(method, {}).items()}
        per_seed = {s: rs for s, rs in per_seed.items() if rs}
        if per_seed:
            seed = _first_seed(per_seed, seeds)
            panels.append((method, seed, per_seed[seed]))
    if not panels:
        return None
    fig = _new_figure(8, 2.4 * len(panels) + 0.4)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (method, seed, recs) in zip(axes, panels):
        devices = sorted({str(r.get("device")) for r in recs}, key=_natural_key)
        for device in devices[:MAX_DEVICES_DRAWN]:
            mine = [r for r in recs if str(r.get("device")) == device]
            domain = "gpu" if "gpu" in mine[0]["clock_levels"] else sorted(mine[0]["clock_levels"])[0]
            pts = [(r["t_s"], r["clock_levels"][domain]) for r in mine
                   if _is_number(r["clock_levels"].get(domain))]
            if pts:
                ax.step([t for t, _ in pts], [lv for _, lv in pts], where="post", marker="o",
                        markersize=2, linewidth=1, label="%s (%s)" % (device, domain))
        shown = "%d devices" % len(devices)
        if len(devices) > MAX_DEVICES_DRAWN:
            shown = "%d of %d devices shown" % (MAX_DEVICES_DRAWN, len(devices))
            log.info("clock levels of %s: %s", method, shown)
        ax.set_title("%s, seed %d: %s" % (method, seed, shown), fontsize=9)
        ax.set_ylabel("level (0 = lowest)", fontsize=8)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=6)
    ax.set_xlabel("virtual time (s)")
    return _save(fig, out_path)


def _clp_spans(recs: List[Dict]) -> List[Tuple[float, float]]:
    """Intervals of virtual time during which a critical learning period was detected."""
    spans, start = [], None
    for rec in recs:
        if rec.get("in_clp") and start is None:
            start = rec["t_s"]
        elif not rec.get("in_clp") and start is not None:
            spans.append((start, rec["t_s"]))
            start = None
    if start is not None:
        spans.append((start, recs[-1]["t_s"]))
    return spans


def plot_clp(clps, methods: List[str], out_path: Path, seeds: Sequence[int] = ()) -> Optional[Path]:
    """Per method, one seed's global Fisher information over time with detected CLPs shaded."""
    panels = [(m, _first_seed(clps[m], seeds)) for m in methods if clps.get(m)]
    if not panels:
        return None
    fig = _new_figure(8, 2.4 * len(panels) + 0.4)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (method, seed) in zip(axes, panels):
        recs = clps[method][seed]
        pts = [(r["t_s"], r["fisher_global"]) for r in recs if _is_number(r.get("fisher_global"))]
        ax.plot([t for t, _ in pts], [f for _, f in pts], color=TAB10[methods.index(method) % 10],
                marker="o", markersize=2, linewidth=1.2)
        values = [f for _, f in pts]
        if values and min(values) > 0 and max(values) / min(values) > 100:
            ax.set_yscale("log")
        for i, (a, b) in enumerate(_clp_spans(recs)):
            ax.axvspan(a, b, color="orange", alpha=0.25, label="in CLP" if i == 0 else None)
        ax.set_title("%s, seed %d" % (method, seed), fontsize=9)
        ax.set_ylabel("global Fisher", fontsize=8)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper right", fontsize=7)
    ax.set_xlabel("virtual time (s)")
    return _save(fig, out_path)


CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:14px}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}.meta{color:#555}.how{background:#f8f8e8;padding:.6em}
figure{margin:1.5em 0}img{max-width:100%}figcaption{color:#555;font-size:13px}"""

CAPTIONS = {
    "accuracy_vs_time.png": "Accuracy of the global model against virtual time.",
    "accuracy_vs_energy.png": "Accuracy against cumulative fleet energy (training and idle).",
    "clock_levels.png": "Clock level of each device's scaled domain over time (first seed).",
    "clp.png": "Global Fisher information over time; shaded spans are detected critical learning periods.",
}


def _table(header: List[str], rows: List[List[str]]) -> str:
    """An HTML table; every cell is escaped here."""
    head = "".join("<th>%s</th>" % html.escape(h) for h in header)
    body = "".join("<tr>%s</tr>" % "".join("<td>%s</td>" % html.escape(c) for c in row) for row in rows)
    return "<table><thead><tr>%s</tr></thead><tbody>%s</tbody></table>" % (head, body)


def methods_table(summary: Dict) -> str:
    """Methods × metrics, mean ± std over seeds."""
    methods = summary.get("methods", {})
    t2a, extras = _thresholds(methods), _extra_keys(methods)
    header = (["method", "final accuracy", "fleet energy (J)"]
              + ["time to %s accuracy (s)" % k for k in t2a] + extras)
    rows = []
    for name, entry in methods.items():
        n = len(entry.get("runs") or []) or len(summary.get("seeds") or [])
        rows.append([name, _cell(entry, "final_accuracy", n), _cell(entry, "energy_j", n)]
                    + [_t2a_cell(entry, k, n) for k in t2a] + [_cell(entry, k, n) for k in extras])
    return _table(header, rows)


def render_html(summary: Dict, images: List[str], title: str) -> str:
    """The self-contained page; images are referenced by file name next to it."""
    e = html.escape
    seeds = summary.get("seeds") or []
    meta = "duration %s s of virtual time · seeds %s · thresholds %s" % (
        fmt_value(summary["duration_s"]) if _is_number(summary.get("duration_s")) else "?",
        ", ".join(str(s) for s in seeds) or "?",
        ", ".join(str(t) for t in summary.get("thresholds") or []) or "none")
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
    out_dir.mkdir(parents=True, exist_ok=True)
    methods = list(summary.get("methods", {}))
    methods += sorted({r["method"] for r in records} - set(methods), key=_natural_key)
    seeds = [s for s in summary.get("seeds") or [] if isinstance(s, int)]
    thresholds = [t for t in summary.get("thresholds") or [] if _is_number(t)]
    images: List[str] = []
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log.warning("matplotlib is not installed (pip install 'streamfl[server]'): report without plots")
    else:
        evals = _by_method_seed(records, "eval")
        plots = [("accuracy_vs_time.png",
                  lambda p: plot_accuracy_curves(evals, methods, "t_s", p, thresholds)),
                 ("accuracy_vs_energy.png",
                  lambda p: plot_accuracy_curves(evals, methods, "energy_j", p)),
                 ("clock_levels.png", lambda p: plot_clock_levels_by_method(
                     _by_method_seed(records, "update"), methods, p, seeds)),
                 ("clp.png", lambda p: plot_clp(_by_method_seed(records, "clp"), methods, p, seeds))]
        for name, draw in plots:
            if draw(out_dir / name) is not None:
                images.append(name)
            else:
                log.info("%s: nothing to plot", name)
                if (out_dir / name).exists():  # a stale plot from an earlier render of this directory
                    (out_dir / name).unlink()
    title = "streamfl simulation: %s" % summary.get("scenario", run_dir.name)
    out = out_dir / "report.html"
    out.write_text(render_html(summary, images, title), encoding="utf-8")
    log.info("report written to %s (%d plots)", out, len(images))
    return out
