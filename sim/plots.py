"""Every PNG plot of the project: the demo's (one fleet, from a coordinator's metrics.jsonl) and
``streamfl report``'s (a simulator run's methods over seeds).

Figures use an explicit Agg canvas, not pyplot, so a plot renders inside any process without
touching its backend. matplotlib is optional (``streamfl[server]``): ``have_matplotlib`` says
whether plots can be drawn, and each plot returns None when it has nothing to draw.
"""
import functools
import logging
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from streamfl.coordinator.metrics import elapsed_s
from streamfl.sim.tables import is_number, natural_key

log = logging.getLogger(__name__)

GRID_POINTS = 200
MAX_DEVICES_DRAWN = 12
TAB10 = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
         "#bcbd22", "#17becf")  # matplotlib's tab10, spelled out: the same colour per method everywhere


# ---- shared -------------------------------------------------------------------------------------

def have_matplotlib(what: str = "plots") -> bool:
    """Whether matplotlib is installed; where it is not, say (once per call) what goes without."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log.warning("matplotlib is not installed (pip install 'streamfl[server]'): no %s", what)
        return False
    return True


def new_figure(width: float, height: float):
    """A figure on an explicit Agg canvas: no pyplot registry, so nothing to leak or close."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig, path: Path) -> Path:
    """Write a figure as PNG and drop its memory."""
    path = Path(path)
    fig.tight_layout()
    fig.savefig(str(path), dpi=100)
    fig.clear()
    return path


@functools.lru_cache(maxsize=None)
def clock_ladders(board: Optional[str]) -> Optional[Dict[str, Tuple[int, ...]]]:
    """Each domain's levels in kHz from the shipped board profile named ``board``; None where no
    profile has that name or it lists no domains (generic-linux discovers its own at start)."""
    from streamfl.dvfs.profiles import PROFILE_NAMES, load_profile
    if board not in PROFILE_NAMES:
        return None
    ladders = {d.name: tuple(d.levels_khz) for d in load_profile(board).domains}
    return ladders or None


def level_mhz(board: Optional[str], domain: str, level) -> Optional[float]:
    """A clock level as MHz through ``board``'s profile; None where the profile, the domain or
    that level is unknown."""
    ladder = (clock_ladders(board) or {}).get(domain)
    if ladder is None or not is_number(level) or int(level) != level or not 0 <= level < len(ladder):
        return None
    return ladder[int(level)] / 1000.0


def clock_axis_label(unit: str) -> str:
    """The y label of a clock plot: MHz, or level indices where a board's profile is unknown."""
    return "clock (MHz)" if unit == "MHz" else "clock level (0 = lowest)"


def _draw_clock_levels(ax, updates: List[Dict], times: Sequence[float],
                       label: Callable[[str, str], str], max_devices: Optional[int] = None,
                       boards: Optional[Mapping[str, str]] = None) -> Tuple[List[str], str]:
    """One step line per device: the clock of its scaled domain (the GPU where it has one, else
    its first domain by name) at each update's time, in MHz through the board profile each device
    ran (``boards``: device -> profile name). Updates carry level indices; where any drawn
    device's profile or level is unknown the whole axis shows levels, since MHz and levels on one
    axis would mislead. Returns every device, naturally sorted, and the unit ("MHz" or "level")."""
    boards = boards or {}
    devices = sorted({str(r.get("device")) for r in updates}, key=natural_key)
    series = []
    for device in devices[:max_devices]:
        mine = [(t, r["clock_levels"]) for t, r in zip(times, updates) if str(r.get("device")) == device]
        domain = "gpu" if "gpu" in mine[0][1] else sorted(mine[0][1])[0]
        pts = [(t, lv[domain]) for t, lv in mine if is_number(lv.get(domain))]
        if pts:
            series.append((device, domain, pts))
    in_mhz = bool(series) and all(level_mhz(boards.get(device), domain, lv) is not None
                                  for device, domain, pts in series for _, lv in pts)
    for device, domain, pts in series:
        ys = [level_mhz(boards.get(device), domain, lv) if in_mhz else lv for _, lv in pts]
        ax.step([t for t, _ in pts], ys, where="post", marker="o", markersize=2, linewidth=1,
                label=label(device, domain))
    unit = "MHz" if in_mhz else "level"
    if series and not in_mhz:
        log.info("clock plot in levels: no board profile converts every device's levels to MHz")
    return devices, unit


# ---- one fleet: the demo's coordinator metrics.jsonl --------------------------------------------

def plot_accuracy(metrics: List[Dict], out_path: Path, title: str = "streamfl") -> Optional[Path]:
    """Accuracy of the global model against time (and version); None when nothing to plot."""
    evals = [m for m in metrics if m.get("event") == "eval"]
    if not evals or not have_matplotlib("plot written"):
        return None
    fig = new_figure(7, 4)
    ax = fig.add_subplot(1, 1, 1)
    ax.plot(elapsed_s(evals), [m["accuracy"] for m in evals], marker="o", markersize=3,
            label="global model")
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("held-out accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    top = ax.secondary_xaxis("top")
    top.set_xlabel("version %d -> %d" % (evals[0]["version"], evals[-1]["version"]))
    top.set_ticks([])
    ax.legend(loc="lower right")
    return save_figure(fig, out_path)


def plot_clock_levels(metrics: List[Dict], out_path: Path, boards: Optional[Dict[str, str]] = None,
                      title: str = "clocks") -> Optional[Path]:
    """Each device's clock per round over time (the GPU where it has one, else cpu0), in MHz
    through its board profile: ``boards`` (device -> profile name), else the board each device's
    Hello named (the coordinator's ``device`` events); levels where a profile is unknown."""
    updates = [m for m in metrics if m.get("event") == "update" and m.get("clock_levels")]
    if not updates or not have_matplotlib("plot written"):
        return None
    known = {str(m.get("device")): m["board"] for m in metrics
             if m.get("event") == "device" and isinstance(m.get("board"), str)}
    known.update(boards or {})
    fig = new_figure(7, 4)
    ax = fig.add_subplot(1, 1, 1)
    _, unit = _draw_clock_levels(ax, updates, elapsed_s(updates),
                                 lambda device, domain: "%s (%s, %s)" % (device, known.get(device, "?"), domain),
                                 boards=known)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel(clock_axis_label(unit))
    ax.grid(alpha=0.3)
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    return save_figure(fig, out_path)


# ---- a simulator run: methods over seeds (``streamfl report``) ----------------------------------

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


def draw_band(ax, band, color, label: str, scale: float = 1.0) -> None:
    """Mean line, and a min..max band where at least two seeds cover the grid."""
    grid, mean, lo, hi, count = band
    ax.plot(grid / scale, mean, color=color, label=label, linewidth=1.6,
            marker="o" if len(grid) == 1 else None)
    multi = count >= 2
    if np.any(multi):
        ax.fill_between(grid / scale, lo, hi, where=multi, color=color, alpha=0.18, linewidth=0)


def plot_accuracy_curves(evals, methods: List[str], x_key: str, out_path: Path,
                         thresholds: Sequence[float] = (), marks: Sequence[float] = (),
                         time_label: str = "virtual time") -> Optional[Path]:
    """Accuracy (and accuracy on classes seen, when recorded) against ``time_s``, ``version``
    (rounds: aggregations) or ``energy_j``; ``evals``: eval events by method, then seed;
    ``marks``: x values drawn as dashed lines (a fleet run's coordinator processes starting)."""
    y_keys = ["accuracy"]
    if any(r.get("accuracy_seen") is not None for s in evals.values() for rs in s.values() for r in rs):
        y_keys.append("accuracy_seen")
    bands = {}
    for method in methods:
        for y_key in y_keys:
            points = [[(r[x_key], r[y_key]) for r in rs
                       if is_number(r.get(x_key)) and is_number(r.get(y_key))]
                      for rs in evals.get(method, {}).values()]
            band = band_over_seeds([([x for x, _ in pts], [y for _, y in pts]) for pts in points])
            if band is not None:
                bands[method, y_key] = band
    if not bands:
        return None
    scale, unit = 1.0, {"time_s": "s", "version": "aggregations"}.get(x_key, "J")
    if x_key == "energy_j" and max(float(b[0][-1]) for b in bands.values()) >= 1e4:
        scale, unit = 1000.0, "kJ"
    fig = new_figure(6.5 * len(y_keys), 4.2)
    for col, y_key in enumerate(y_keys):
        ax = fig.add_subplot(1, len(y_keys), col + 1)
        for i, method in enumerate(methods):
            if (method, y_key) in bands:
                draw_band(ax, bands[method, y_key], TAB10[i % 10], method, scale)
        for th in thresholds:
            ax.axhline(th, color="grey", linestyle=":", linewidth=0.8)
        for i, x in enumerate(marks):
            ax.axvline(x / scale, color="black", linestyle="--", linewidth=0.8, alpha=0.6,
                       label="coordinator (re)start" if i == 0 else None)
        ax.set_xlabel({"time_s": time_label + " (%s)", "version": "rounds (%s)"}.get(
            x_key, "fleet energy (%s)") % unit)
        ax.set_ylabel("accuracy, all classes" if y_key == "accuracy" else "accuracy, classes seen so far")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower right", fontsize=8)
    fig.suptitle("accuracy against %s: mean over seeds, band = min..max"
                 % {"time_s": time_label, "version": "rounds"}.get(x_key, "energy"), fontsize=10)
    return save_figure(fig, out_path)


def _first_seed(per_seed: Dict[int, List[Dict]], seeds: Sequence[int]) -> int:
    """The summary's first seed when this method has it, else the smallest seed it has."""
    return next((s for s in seeds if s in per_seed), min(per_seed))


def plot_clock_levels_by_method(updates, methods: List[str], out_path: Path,
                                seeds: Sequence[int] = (),
                                boards: Optional[Mapping[str, Mapping[int, Mapping[str, str]]]] = None
                                ) -> Optional[Path]:
    """Per method, one seed's clock of each device's scaled domain (GPU, else the first), in MHz
    through each device's board profile (``boards``: method -> seed -> device -> profile name, as
    the run's summary lists them); a panel whose boards are unknown shows levels."""
    panels = []
    for method in methods:
        per_seed = {s: [r for r in rs if r.get("clock_levels")] for s, rs in updates.get(method, {}).items()}
        per_seed = {s: rs for s, rs in per_seed.items() if rs}
        if per_seed:
            seed = _first_seed(per_seed, seeds)
            panels.append((method, seed, per_seed[seed]))
    if not panels:
        return None
    fig = new_figure(8, 2.4 * len(panels) + 0.4)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (method, seed, recs) in zip(axes, panels):
        devices, unit = _draw_clock_levels(ax, recs, [r["time_s"] for r in recs],
                                           lambda device, domain: "%s (%s)" % (device, domain),
                                           MAX_DEVICES_DRAWN, ((boards or {}).get(method) or {}).get(seed))
        shown = "%d devices" % len(devices)
        if len(devices) > MAX_DEVICES_DRAWN:
            shown = "%d of %d devices shown" % (MAX_DEVICES_DRAWN, len(devices))
            log.info("clock levels of %s: %s", method, shown)
        ax.set_title("%s, seed %d: %s" % (method, seed, shown), fontsize=9)
        ax.set_ylabel(clock_axis_label(unit), fontsize=8)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=6)
    ax.set_xlabel("virtual time (s)")
    return save_figure(fig, out_path)


def _clp_spans(recs: List[Dict]) -> List[Tuple[float, float]]:
    """Intervals of virtual time during which a critical learning period was detected."""
    spans, start = [], None
    for rec in recs:
        if rec.get("in_clp") and start is None:
            start = rec["time_s"]
        elif not rec.get("in_clp") and start is not None:
            spans.append((start, rec["time_s"]))
            start = None
    if start is not None:
        spans.append((start, recs[-1]["time_s"]))
    return spans


def plot_clp(clps, methods: List[str], out_path: Path, seeds: Sequence[int] = ()) -> Optional[Path]:
    """Per method, one seed's global Fisher information over time with detected CLPs shaded."""
    panels = [(m, _first_seed(clps[m], seeds)) for m in methods if clps.get(m)]
    if not panels:
        return None
    fig = new_figure(8, 2.4 * len(panels) + 0.4)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (method, seed) in zip(axes, panels):
        recs = clps[method][seed]
        pts = [(r["time_s"], r["fisher_global"]) for r in recs if is_number(r.get("fisher_global"))]
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
    return save_figure(fig, out_path)
