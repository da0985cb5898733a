"""ST-EWC's figures from a domain-incremental run (``streamfl report DIR --section periods``): a Markdown table
of the paper's three metrics per method and a plot of accuracy on period 1 and overall accuracy
against virtual time (its Fig. 3 and 4), mean and min..max over seeds.

The metrics are ``sim.summary.continual_figures``'s: accuracy on period 1 at the end (eq. 13),
average accuracy (eq. 15) at each period's end and its mean over the periods, overall accuracy
(eq. 14) at the end and its mean over the run. The table compares each with ``--reference``.
"""
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from streamfl.coordinator.metrics import read_metrics
from streamfl.errors import StreamflError
from streamfl.sim.plots import TAB10, draw_band, new_figure, save_figure, band_over_seeds, have_matplotlib
from streamfl.sim.summary import read_summary
from streamfl.sim.tables import markdown_rows

KEYS = (("period1_accuracy", "accuracy on period 1 at the end"),
        ("average_accuracy", "average accuracy (eq. 15, mean over periods)"),
        ("overall_accuracy", "overall accuracy at the end"),
        ("mean_overall_accuracy", "overall accuracy, mean over the run"))


def _pm(entry: Dict[str, Any], key: str) -> str:
    mean, std = entry.get(key), entry.get(key + "_std")
    if mean is None:
        return "–"
    return "%.3f ± %.3f" % (mean, std or 0.0)


def _by_period(entry: Dict[str, Any]) -> List[float]:
    """Eq. 15 at each period's end, mean over the seeds (periods every seed reached)."""
    lists = [r.get("average_accuracy_by_period") or [] for r in entry.get("runs", [])]
    n = min((len(x) for x in lists), default=0)
    return [float(np.mean([x[t] for x in lists])) for t in range(n)]


def periods_table(summary: Dict[str, Any], reference: Optional[str] = "fedavg",
                  methods: Optional[Sequence[str]] = None) -> str:
    """The three metrics per method, eq. 15 after each period, and the change against ``reference``."""
    every = summary.get("methods") or {}
    names = [m for m in (methods or every) if m in every and every[m].get("period1_accuracy") is not None]
    if not names:
        raise StreamflError("no method of this run has ST-EWC's figures (a domain_incremental run?)")
    ref = every.get(reference) if reference in names else None
    periods = max(len(_by_period(every[m])) for m in names)
    header = ["method"] + [label for _, label in KEYS] + ["eq. 15 after period %d" % (t + 1) for t in range(periods)]
    if ref is not None:
        header += ["period 1 vs `%s` (points)" % reference, "average vs `%s` (points)" % reference]
    rows = []
    for name in names:
        entry = every[name]
        curve = _by_period(entry)
        row = ["`%s`" % name] + [_pm(entry, key) for key, _ in KEYS]
        row += ["%.3f" % curve[t] if t < len(curve) else "–" for t in range(periods)]
        if ref is not None:
            row += ["%+.1f" % (100 * (entry[k] - ref[k])) for k in ("period1_accuracy", "average_accuracy")]
        rows.append(row)
    return markdown_rows(header, rows)


def plot_periods(metrics_path: Path, methods: Sequence[str], out_path: Path) -> Optional[Path]:
    """Accuracy on period 1 and overall accuracy against virtual time; None without matplotlib."""
    if not have_matplotlib("the ST-EWC plot"):
        return None
    curves: Dict[str, Dict[str, Dict[int, List]]] = {}
    for rec in read_metrics(metrics_path, events=("eval",)):
        acc = rec.get("period_accuracy")
        if not acc or rec.get("method") not in methods:
            continue
        for key, value in (("period1", acc[0]), ("overall", float(np.mean(acc)))):
            curves.setdefault(key, {}).setdefault(rec["method"], {}).setdefault(rec["seed"], []).append(
                (float(rec["time_s"]), float(value)))
    if not curves:
        return None
    fig = new_figure(13, 4.2)
    for col, (key, label) in enumerate((("period1", "accuracy on period 1 (eq. 13)"),
                                        ("overall", "overall accuracy, all periods (eq. 14)"))):
        ax = fig.add_subplot(1, 2, col + 1)
        for i, method in enumerate(methods):
            seeds = curves.get(key, {}).get(method, {})
            band = band_over_seeds([([t for t, _ in sorted(pts)], [v for _, v in sorted(pts)])
                                    for pts in seeds.values()])
            if band is not None:
                draw_band(ax, band, TAB10[i % 10], method)
        ax.set_xlabel("virtual time (s)")
        ax.set_ylabel(label)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower left", fontsize=8)
    fig.suptitle("ST-EWC's metrics against virtual time: mean over seeds, band = min..max", fontsize=10)
    return save_figure(fig, out_path)


def periods_for_run(run_dir: Path, reference: Optional[str] = "fedavg",
                    methods: Optional[Sequence[str]] = None) -> str:
    """The table of ``run_dir``; also writes ``periods.png`` beside its metrics."""
    run_dir = Path(run_dir)
    summary = read_summary(run_dir / "summary.json")
    names = list(methods or summary.get("methods") or {})
    plot_periods(run_dir / "metrics.jsonl", names, run_dir / "periods.png")
    return periods_table(summary, reference, methods)


def section(run_dirs: Sequence[Path], methods: Optional[Sequence[str]], option: str = "",
            reference: Optional[str] = "fedavg", labels: Optional[Sequence[str]] = None,
            overview: bool = False) -> str:
    """``streamfl report DIR --section periods``: ``periods_for_run`` of the one folder, compared
    with ``reference`` (it takes no option)."""
    return periods_for_run(run_dirs[0], reference, methods)
