"""SFedPO's comparison from latent-state runs (``streamfl report DIR... --section sfedpo``).

One Markdown table over one or several run folders (a folder per dataset and access scenario):
per method, the held-out accuracy at the run's end and its mean over the run (mean +- std over
seeds), and per folder the best baseline and SFedPO's margin over it, in accuracy points: the
paper's Table 1 figure (it reports the final test accuracy). Beside the folders' common parent
it draws ``sfedpo.png`` (accuracy over virtual time, one panel a folder, mean over seeds with a
min..max band) and ``sfedpo-buffer.png`` (the class mix of one device's buffer over time, seed 0 of
the first partial-access folder, one panel a method: what DDS keeps that FIFO drops).
"""
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from streamfl.coordinator.metrics import read_metrics
from streamfl.errors import StreamflError
from streamfl.sim.plots import TAB10, band_over_seeds, draw_band, have_matplotlib, new_figure, save_figure
from streamfl.sim.tables import markdown_rows

#: The SFedPO paper's baselines that fit a streaming fleet, as registered in ``sim/methods.py``:
#: importance sampling both per window (``is-window``, the paper's IS) and by class (``is``, ours).
BASELINES = ("fedavg", "fedcurv", "fedogd", "adapfedavg", "is", "is-window")
#: The method whose margin over the best baseline the table gives.
REFERENCE = "sfedpo"
#: Methods drawn in the buffer plot, where the run has them.
BUFFER_METHODS = ("fedavg", "is", "sfedpo")


def _evals(records: Sequence[Dict[str, Any]]) -> Dict[str, Dict[int, List[Dict[str, Any]]]]:
    """Per method and seed: its eval events in time order."""
    out: Dict[str, Dict[int, List[Dict[str, Any]]]] = {}
    for r in records:
        if r.get("event") == "eval" and r.get("accuracy") is not None:
            out.setdefault(r["method"], {}).setdefault(int(r.get("seed", 0)), []).append(r)
    for seeds in out.values():
        for rows in seeds.values():
            rows.sort(key=lambda r: float(r["time_s"]))
    return out


def method_figures(records: Sequence[Dict[str, Any]]) -> Dict[str, Dict[str, List[float]]]:
    """Per method: ``final`` (accuracy at each seed's last evaluation) and ``mean`` (its mean)."""
    out: Dict[str, Dict[str, List[float]]] = {}
    for method, seeds in _evals(records).items():
        finals = [float(rows[-1]["accuracy"]) for _, rows in sorted(seeds.items())]
        means = [float(np.mean([float(r["accuracy"]) for r in rows])) for _, rows in sorted(seeds.items())]
        out[method] = {"final": finals, "mean": means}
    return out


def _pm(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return "%.3f +- %.3f" % (float(np.mean(values)), float(np.std(values)))


def margin(figures: Dict[str, Dict[str, List[float]]], reference: str = REFERENCE,
           baselines: Sequence[str] = BASELINES) -> Tuple[Optional[str], Optional[float]]:
    """(best baseline by mean final accuracy, reference minus it in points); Nones if either is absent."""
    present = [b for b in baselines if b in figures]
    if reference not in figures or not present:
        return None, None
    best = max(present, key=lambda b: float(np.mean(figures[b]["final"])))
    return best, 100.0 * (float(np.mean(figures[reference]["final"])) - float(np.mean(figures[best]["final"])))


def sfedpo_for_runs(run_dirs: Sequence[Path], methods: Optional[Sequence[str]] = None,
                    reference: str = REFERENCE, baselines: Sequence[str] = BASELINES) -> str:
    """The table (module docstring), and the two plots beside the folders' common parent."""
    rows: List[List[str]] = []
    notes: List[str] = []
    all_records: List[Tuple[str, List[Dict[str, Any]]]] = []
    for run_dir in run_dirs:
        path = Path(run_dir) / "metrics.jsonl"
        if not path.exists():
            raise StreamflError("%s has no metrics.jsonl" % run_dir)
        records = read_metrics(path)
        name = Path(run_dir).name
        all_records.append((name, records))
        figures = method_figures(records)
        best, gap = margin(figures, reference, baselines)
        for method in methods or sorted(figures, key=_order):
            if method not in figures:
                continue
            f = figures[method]
            tag = " (best baseline)" if method == best else ""
            rows.append([name, "`%s`%s" % (method, tag), _pm(f["final"]), _pm(f["mean"]), str(len(f["final"]))])
        if best is not None:
            notes.append("- %s: `%s` %+.1f points over the best baseline, `%s`." % (name, reference, gap, best))
    parent = Path(os.path.commonpath([str(Path(d).resolve()) for d in run_dirs]))
    if len(run_dirs) == 1:
        parent = parent.parent
    plot_accuracy_panels(all_records, parent / "sfedpo.png", methods)
    partial = [(n, r) for n, r in all_records if "partial" in n] or all_records
    plot_buffer_mix(partial[0][1], parent / "sfedpo-buffer.png", partial[0][0])
    table = markdown_rows(["run", "method", "accuracy at the end", "mean accuracy over the run", "seeds"], rows)
    return table + ("\n\n" + "\n".join(notes) if notes else "")


def _order(method: str) -> Tuple[int, str]:
    """Baselines first (in the paper's order), then SFedPO and its variants."""
    return (BASELINES.index(method), "") if method in BASELINES else (len(BASELINES), method)


def plot_accuracy_panels(folders: Sequence[Tuple[str, List[Dict[str, Any]]]], out_path: Path,
                         methods: Optional[Sequence[str]] = None) -> Optional[Path]:
    """Accuracy over virtual time, one panel per folder; None without matplotlib or evaluations."""
    if not folders or not have_matplotlib("the SFedPO plot"):
        return None
    cols = min(2, len(folders))
    rows = (len(folders) + cols - 1) // cols
    fig = new_figure(6.5 * cols, 3.8 * rows)
    names = sorted({m for _, rec in folders for m in _evals(rec)}, key=_order)
    names = [m for m in (methods or names) if m in names]
    for i, (name, records) in enumerate(folders):
        ax = fig.add_subplot(rows, cols, i + 1)
        evals = _evals(records)
        for j, method in enumerate(names):
            seeds = evals.get(method)
            if not seeds:
                continue
            band = band_over_seeds([([float(r["time_s"]) for r in rs], [float(r["accuracy"]) for r in rs])
                                    for rs in seeds.values()])
            if band is not None:
                draw_band(ax, band, TAB10[j % 10], method)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("virtual time (s)")
        ax.set_ylabel("held-out accuracy")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    handles: Dict[str, Any] = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if handles:  # every method in the first panel's legend, whichever panels have it
        fig.axes[0].legend(list(handles.values()), list(handles), loc="lower right", fontsize=7, ncol=2)
    fig.suptitle("SFedPO and the baselines: mean over seeds, band = min..max", fontsize=10)
    return save_figure(fig, out_path)


def buffer_mix(records: Sequence[Dict[str, Any]], method: str, seed: int = 0) -> Tuple[List[float], np.ndarray]:
    """(times, class shares [n, K]) of the evaluated device's buffer for ``method`` and ``seed``."""
    rows = [r for r in _evals(records).get(method, {}).get(seed, []) if r.get("buffer_counts")]
    if not rows:
        return [], np.zeros((0, 0))
    counts = np.asarray([r["buffer_counts"] for r in rows], dtype=np.float64)
    totals = np.maximum(counts.sum(axis=1, keepdims=True), 1.0)
    return [float(r["time_s"]) for r in rows], counts / totals


def plot_buffer_mix(records: Sequence[Dict[str, Any]], out_path: Path, name: str = "") -> Optional[Path]:
    """Stacked class shares of one device's buffer over time, one panel per method in
    ``BUFFER_METHODS`` the run has; None without matplotlib or buffer counts."""
    mixes = [(m,) + buffer_mix(records, m) for m in BUFFER_METHODS]
    mixes = [(m, t, s) for m, t, s in mixes if len(t)]
    if not mixes or not have_matplotlib("the buffer plot"):
        return None
    fig = new_figure(13, 2.6 * len(mixes))
    for i, (method, times, shares) in enumerate(mixes):
        ax = fig.add_subplot(len(mixes), 1, i + 1)
        ax.stackplot(times, shares.T, colors=[TAB10[c % 10] for c in range(shares.shape[1])],
                     labels=["class %d" % c for c in range(shares.shape[1])])
        ax.set_ylim(0, 1)
        ax.set_ylabel("share of the buffer")
        ax.set_title("%s: device dev-000's buffer, seed 0" % method, fontsize=9)
        if i == 0:
            ax.legend(loc="upper right", fontsize=6, ncol=5)
    ax.set_xlabel("virtual time (s)")
    fig.suptitle("Class mix of one device's buffer over time (%s)" % name, fontsize=10)
    return save_figure(fig, out_path)


def section(run_dirs: Sequence[Path], methods: Optional[Sequence[str]], option: str = "",
            reference: Optional[str] = None, labels: Optional[Sequence[str]] = None,
            overview: bool = False) -> str:
    """``streamfl report DIR... --section sfedpo``: ``sfedpo_for_runs`` (it takes no option; the
    margin is always ``REFERENCE``'s over the best of ``BASELINES``)."""
    return sfedpo_for_runs(run_dirs, methods=methods)
