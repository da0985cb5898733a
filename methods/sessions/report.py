"""The session paper's figures from a churn run (``streamfl report DIR --section sessions``): after each
session boundary, the rounds, virtual seconds and joules each method needs to recover a target
accuracy, and its accumulated accuracy gain over ``previous``.

Definitions (session paper sec. VI, eqs. 31-32), as measured here:
- a session is the data's (the scenario's ``session_s``), and its accuracy is the model's on the
  labels the online devices stream now (``accuracy_now`` of the eval events, every evaluation);
- target: ``q`` times the peak accuracy the reference method (``session-init``) reached in that
  session on that seed (the paper's "95% / 97% of the proposed scheme's peak"); without the
  reference in the run, the best peak of the methods;
- rounds: the global rounds from the session's first evaluation to the first at or above the
  target, counting FedAvg rounds (aggregations that merged updates) and auxiliary rounds (each
  closed one); a switch of model is not a round. Seconds and joules likewise (the fleet's);
  not reached within the session: counted as the session's rounds plus one, and shown as a share;
- accumulated gain: the sum over the session's evaluations of (accuracy - ``previous``'s at the
  same time), times the evaluation interval, in accuracy-seconds (eq. 32 sums per round; rounds
  differ in length across methods, time does not).
Session 0 has no boundary before it and is left out, and so is a session with fewer than
``MIN_EVALS`` evaluations (the run's end can open one just before it stops).
"""
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from streamfl.coordinator.metrics import read_metrics
from streamfl.errors import ConfigError, StreamflError
from streamfl.sim.plots import TAB10, band_over_seeds, draw_band, have_matplotlib, new_figure, save_figure
from streamfl.sim.tables import markdown_rows

#: Default targets: the paper's 95% and 97% of the reference's peak.
TARGETS = (0.95, 0.97)

#: The first session with a saved session (and its gradient) to start from, with one pilot session.
LATER = 2
#: Evaluations a session needs to count (one at the run's very end does not make a session).
MIN_EVALS = 3

Key = Tuple[str, int]


def _rounds_events(rows: Sequence[Dict[str, Any]]) -> Dict[Key, List[float]]:
    """Per (method, seed): the times of every global round (merging aggregation or aux round)."""
    out: Dict[Key, List[float]] = {}
    for r in rows:
        key = (r.get("method"), int(r.get("seed", 0)))
        if r.get("event") == "aggregate" and int(r.get("n", 0)) > 0:
            out.setdefault(key, []).append(float(r["time_s"]))
        elif r.get("event") == "session" and ("answers" in r or int(r.get("aux_round", 0)) >= 2):
            out.setdefault(key, []).append(float(r["time_s"]))
    for times in out.values():
        times.sort()
    return out


def session_curves(rows: Sequence[Dict[str, Any]]) -> Dict[Key, Dict[int, List[Dict[str, Any]]]]:
    """Per (method, seed) and session: its evaluations (with ``accuracy_now``), in time order."""
    out: Dict[Key, Dict[int, List[Dict[str, Any]]]] = {}
    for r in rows:
        if r.get("event") == "eval" and r.get("accuracy_now") is not None and r.get("period") is not None:
            key = (r["method"], int(r.get("seed", 0)))
            out.setdefault(key, {}).setdefault(int(r["period"]), []).append(r)
    return out


def session_figures(rows: Sequence[Dict[str, Any]], targets: Sequence[float] = TARGETS,
                    reference: str = "session-init", baseline: str = "previous") -> Dict[str, Any]:
    """``{method: {"transitions": [...per (seed, session)...]}}`` with rounds, seconds and joules
    to each target, whether reached, the session's mean accuracy and the gain over ``baseline``."""
    curves = session_curves(rows)
    if not curves:
        raise StreamflError("no evaluation of this run has accuracy_now (a sessions-stream run?)")
    rounds = _rounds_events(rows)
    methods = sorted({m for m, _ in curves})
    seeds = sorted({s for _, s in curves})
    out: Dict[str, Any] = {m: {"transitions": []} for m in methods}
    for seed in seeds:
        sessions = sorted(set().union(*[set(curves.get((m, seed), {})) for m in methods]) - {0})
        for s in sessions:
            per = {m: curves.get((m, seed), {}).get(s, []) for m in methods}
            per = {m: es for m, es in per.items() if len(es) >= MIN_EVALS}
            ref = reference if reference in per else None
            peaks = [max(e["accuracy_now"] for e in per[m]) for m in ([ref] if ref else per)]
            if not peaks:
                continue
            peak = max(peaks)
            base = {round(e["time_s"], 3): e["accuracy_now"] for e in per.get(baseline, [])}
            for m in methods:
                if m not in per:
                    continue
                out[m]["transitions"].append(_transition(per[m], rounds.get((m, seed), []), peak, targets,
                                                         base, seed, s))
    return out


def _transition(es: List[Dict[str, Any]], round_times: List[float], peak: float,
                targets: Sequence[float], base: Dict[float, float], seed: int, session: int) -> Dict[str, Any]:
    t0, e0 = float(es[0]["time_s"]), float(es[0].get("energy_j") or 0.0)
    times = np.asarray(round_times)
    lo = int(np.searchsorted(times, t0, side="right"))
    n_session = int(np.searchsorted(times, float(es[-1]["time_s"]), side="right")) - lo
    interval = (float(es[1]["time_s"]) - t0) if len(es) > 1 else 1.0
    fig: Dict[str, Any] = {"seed": seed, "session": session, "peak": round(peak, 4),
                           "mean_accuracy": round(float(np.mean([e["accuracy_now"] for e in es])), 4),
                           "first_accuracy": round(float(es[0]["accuracy_now"]), 4)}
    gains = [e["accuracy_now"] - base[round(e["time_s"], 3)] for e in es if round(e["time_s"], 3) in base]
    fig["gain_vs_baseline"] = round(float(np.sum(gains)) * interval, 3) if gains else None
    for q in targets:
        hit = next((e for e in es if e["accuracy_now"] >= q * peak), None)
        key = "%g" % q
        if hit is None:
            fig[key] = {"reached": False, "rounds": n_session + 1, "seconds": None, "joules": None}
            continue
        t = float(hit["time_s"])
        n = int(np.searchsorted(times, t, side="right")) - lo
        fig[key] = {"reached": True, "rounds": n, "seconds": round(t - t0, 3),
                    "joules": round(float(hit.get("energy_j") or 0.0) - e0, 1)}
    return fig


def _mean(values: Sequence[Optional[float]]) -> Optional[float]:
    got = [float(v) for v in values if v is not None]
    return float(np.mean(got)) if got else None


def _spread(per_seed: Dict[int, List[float]]) -> Optional[float]:
    """The standard deviation over seeds of each seed's mean (None with fewer than 2 seeds)."""
    means = [float(np.mean(v)) for v in per_seed.values() if v]
    return float(np.std(means, ddof=1)) if len(means) >= 2 else None


def _by_seed(ts: Sequence[Dict[str, Any]], value: Any) -> Dict[int, List[float]]:
    """``value(t)`` of each transition, grouped by seed (None values left out)."""
    out: Dict[int, List[float]] = {}
    for t in ts:
        v = value(t)
        if v is not None:
            out.setdefault(int(t["seed"]), []).append(float(v))
    return out


def summarize(figures: Dict[str, Any], targets: Sequence[float] = TARGETS,
              first_session: int = 1) -> Dict[str, Dict[str, Any]]:
    """Per method: mean rounds / seconds / joules to each target over every transition from
    ``first_session`` on and every seed (seconds and joules over the reached ones), the share
    reached, the median rounds, and the mean accumulated gain and session accuracy. The spreads
    (``*_std``) are the standard deviation over seeds of each seed's mean: boundaries of one seed
    share its run, so the seeds, not the boundaries, are the independent repeats."""
    out: Dict[str, Dict[str, Any]] = {}
    for m, entry in figures.items():
        ts = [t for t in entry["transitions"] if t["session"] >= first_session]
        row: Dict[str, Any] = {"transitions": len(ts), "seeds": len({t["seed"] for t in ts}),
                               "mean_accuracy": _mean([t["mean_accuracy"] for t in ts]),
                               "mean_accuracy_std": _spread(_by_seed(ts, lambda t: t["mean_accuracy"])),
                               "gain_vs_baseline": _mean([t["gain_vs_baseline"] for t in ts]),
                               "gain_vs_baseline_std": _spread(_by_seed(ts, lambda t: t["gain_vs_baseline"]))}
        for q in targets:
            key = "%g" % q
            got = [t[key] for t in ts]
            row[key] = {"rounds": _mean([g["rounds"] for g in got]),
                        "rounds_std": _spread(_by_seed(ts, lambda t: t[key]["rounds"])),
                        "median_rounds": float(np.median([g["rounds"] for g in got])) if got else None,
                        "within_2": float(np.mean([g["reached"] and g["rounds"] <= 2 for g in got])) if got else None,
                        "within_2_std": _spread(_by_seed(ts, lambda t: t[key]["reached"] and t[key]["rounds"] <= 2)),
                        "reached": float(np.mean([g["reached"] for g in got])) if got else None,
                        "seconds": _mean([g["seconds"] for g in got]),
                        "joules": _mean([g["joules"] for g in got])}
        out[m] = row
    return out


def _f(value: Optional[float], fmt: str) -> str:
    return "–" if value is None else fmt % value


def _pm(value: Optional[float], spread: Optional[float], fmt: str, scale: float = 1.0) -> str:
    """``value ± spread`` (the spread left out when there is none: one seed)."""
    if value is None:
        return "–"
    text = fmt % (scale * value)
    return text if spread is None else "%s ± %s" % (text, (fmt.replace("+", "") % (scale * spread)).rstrip("%"))


def sessions_table(summary: Dict[str, Dict[str, Any]], targets: Sequence[float] = TARGETS,
                   label: str = "", group: str = "") -> List[List[str]]:
    """Markdown rows: per method, each target's rounds (mean ± spread over seeds, median),
    share within 2 rounds, share reached (below 100%: the rest are censored, counted at the
    session's rounds plus one), seconds and joules (over the reached ones); then accumulated gain
    over ``previous`` and session accuracy, each mean ± spread over seeds."""
    rows = []
    for m, row in summary.items():
        cells = ([label] if label else []) + ([group] if group else []) + ["`%s`" % m]
        for q in targets:
            g = row["%g" % q]
            cells += ["%s (%s)" % (_pm(g["rounds"], g["rounds_std"], "%.1f"), _f(g["median_rounds"], "%.0f")),
                      _pm(g["within_2"], g["within_2_std"], "%.0f%%", 100.0),
                      _f(None if g["reached"] is None else 100 * g["reached"], "%.0f%%"),
                      _f(g["seconds"], "%.1f"), _f(g["joules"], "%.0f")]
        cells += [_pm(row["gain_vs_baseline"], row["gain_vs_baseline_std"], "%+.1f"),
                  _pm(row["mean_accuracy"], row["mean_accuracy_std"], "%.3f")]
        rows.append(cells)
    return rows


def header(targets: Sequence[float] = TARGETS, label: str = "") -> List[str]:
    cells = ([label] if label else []) + ["boundaries", "method"]
    for q in targets:
        p = "%g%%" % (100 * q)
        cells += ["rounds to %s (median)" % p, "within 2 rounds", "reached", "s to %s" % p, "J to %s" % p]
    return cells + ["gain over `previous` (acc x s)", "session accuracy"]


def sessions_for_runs(run_dirs: Sequence[Path], targets: Sequence[float] = TARGETS,
                      reference: str = "session-init", baseline: str = "previous",
                      methods: Optional[Sequence[str]] = None) -> str:
    """One Markdown table over one or several run folders (a column names the folder then; each
    folder also gets ``sessions.png``, ``plot_sessions``): per
    method, every boundary, then only those from ``LATER`` on (the sessions with a saved session
    to start from: the first after the pilot has none, so session-init goes back to the last
    model there after its auxiliary round)."""
    label = "run" if len(run_dirs) > 1 else ""
    rows: List[List[str]] = []
    for run_dir in run_dirs:
        path = Path(run_dir) / "metrics.jsonl"
        if not path.exists():
            raise StreamflError("%s has no metrics.jsonl" % run_dir)
        records = read_metrics(path)
        plot_sessions(records, Path(run_dir) / "sessions.png", methods)
        figures = session_figures(records, targets, reference, baseline)
        for first, group in ((1, "all"), (LATER, "%d+" % LATER)):
            summary = summarize(figures, targets, first)
            if methods:
                summary = {m: summary[m] for m in methods if m in summary}
            rows += sessions_table(summary, targets, Path(run_dir).name if label else "", group)
    return markdown_rows(header(targets, label), rows)


def plot_sessions(records: Sequence[Dict[str, Any]], out_path: Path,
                  methods: Optional[Sequence[str]] = None) -> Optional[Path]:
    """Accuracy on the current session's labels against virtual time, mean over seeds and min..max,
    with the sessions' starts marked; None without matplotlib or such evaluations."""
    curves: Dict[str, Dict[int, List[Tuple[float, float]]]] = {}
    starts: Dict[int, float] = {}
    for r in records:
        if r.get("event") != "eval" or r.get("accuracy_now") is None:
            continue
        if methods and r.get("method") not in methods:
            continue
        curves.setdefault(r["method"], {}).setdefault(int(r.get("seed", 0)), []).append(
            (float(r["time_s"]), float(r["accuracy_now"])))
        if r.get("period") is not None:
            p = int(r["period"])
            starts[p] = min(starts.get(p, float("inf")), float(r["time_s"]))
    if not curves or not have_matplotlib("the sessions plot"):
        return None
    fig = new_figure(13, 4.2)
    ax = fig.add_subplot(1, 1, 1)
    for p, t in sorted(starts.items()):
        if p > 0:
            ax.axvline(t, color="#999999", linewidth=0.8, linestyle=":")
    for i, method in enumerate(methods or sorted(curves)):
        seeds = curves.get(method, {})
        band = band_over_seeds([([t for t, _ in sorted(pts)], [v for _, v in sorted(pts)])
                                for pts in seeds.values()], points=max(200, max(len(v) for v in seeds.values()))) \
            if seeds else None
        if band is not None:
            draw_band(ax, band, TAB10[i % 10], method)
    ax.set_xlabel("virtual time (s); dotted: a session's first evaluation")
    ax.set_ylabel("accuracy on the session's labels")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle("Recovery after each session boundary: mean over seeds, band = min..max", fontsize=10)
    return save_figure(fig, out_path)


def section(run_dirs: Sequence[Path], methods: Optional[Sequence[str]], option: str,
            reference: Optional[str] = None, labels: Optional[Sequence[str]] = None,
            overview: bool = False) -> str:
    """``streamfl report DIR... --section sessions [--option SHARES]``: ``sessions_for_runs`` with
    the comma-separated target shares of the reference's peak in ``option`` ("": ``TARGETS``)."""
    if not option.strip():
        return sessions_for_runs(run_dirs, TARGETS, methods=methods)
    try:
        targets = [float(t) for t in option.split(",") if t.strip()]
    except ValueError:
        raise ConfigError("section sessions: --option takes comma-separated shares, e.g. 0.95,0.97") from None
    if not targets or not all(0 < t <= 1 for t in targets):
        raise ConfigError("section sessions: shares must be in (0, 1]")
    return sessions_for_runs(run_dirs, targets, methods=methods)
