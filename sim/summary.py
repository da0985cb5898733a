"""``summary.json`` of a simulator run: per method, each seed's figures and their mean and spread;
computed here from a run's events, and read back here (``read_summary``) for the report and tables.

Definitions the papers leave open, chosen here:
- mean accuracy: the mean over every evaluation of the run (one each ``eval_every_s``), AdaCLP's
  "average accuracy over a period" (sec. 5.1); with one class at a time the final accuracy depends
  on which class is current at the end, the run's mean much less;
- time to accuracy: virtual seconds until the first evaluation at or above the threshold (None
  when a seed never reaches it; the mean is over the seeds that did, ``reached`` counts them);
- per period (AdaCLP periods, FedTeddi frames, sessions of the session paper): time from the
  period's start to the threshold, and the accumulated accuracy gain, the sum over the period's
  evaluations of (accuracy - accuracy at the period's first evaluation) times the evaluation
  interval, in accuracy-seconds (the session paper's "accumulated accuracy gain" as an area);
  and rounds (aggregations) from the period's first evaluation to the first whose accuracy on the
  classes seen so far reaches each threshold (FedTeddi's rounds to a target after a new frame);
- aggregation figures come from the runtime's ``aggregate`` events, one per new version however it
  was made (an update, or FedAvg's deadline): updates merged per version, distinct devices per
  round (mean and histogram) and the staleness of every merged update relative to the version it
  was merged into (the new version minus one);
- energy: ``energy_j`` is the fleet's at the last evaluation, ``train_energy_j`` the part spent in
  rounds (whole-board power while training, idle floor included) and ``idle_energy_j`` the idle
  power over the rest of the online time (sim/runtime.py ``energy_split_j``);
- ST-EWC (domain-incremental): accuracy on period 1 at the end, overall accuracy (mean over all
  periods' test transforms) and average accuracy (eq. 15 at each period's end, mean over the
  seen periods); ``continual_figures`` has the details.
"""
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from streamfl.errors import StreamflError


def _mean_std(values: Sequence[Optional[float]]) -> Dict[str, Any]:
    got = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not got:
        return {"mean": None, "std": None}
    return {"mean": float(np.mean(got)), "std": float(np.std(got))}


def time_to(evals: List[Dict[str, Any]], threshold: float, start_s: float = 0.0) -> Optional[float]:
    """Seconds from ``start_s`` to the first evaluation at or above ``threshold``."""
    for e in evals:
        if e["time_s"] >= start_s and e["accuracy"] >= threshold:
            return round(e["time_s"] - start_s, 3)
    return None


def energy_to(evals: List[Dict[str, Any]], threshold: float) -> Optional[float]:
    """Fleet joules spent up to the first evaluation at or above ``threshold`` (AdaCLP sec. 5.3.3's
    energy to a target accuracy); None if never reached."""
    for e in evals:
        if e["accuracy"] >= threshold:
            return e.get("energy_j")
    return None


def rounds_to(evals: List[Dict[str, Any]], threshold: float, key: str = "accuracy_seen") -> Optional[int]:
    """Aggregations from the first of ``evals`` to the first at or above ``threshold`` (by ``key``)."""
    for e in evals:
        if e.get(key) is not None and e[key] >= threshold:
            return int(e["version"]) - int(evals[0]["version"])
    return None


def period_figures(evals: List[Dict[str, Any]], threshold: float, eval_every_s: float,
                   thresholds: Sequence[float] = ()) -> List[Dict[str, Any]]:
    """Per period: its start, time to ``threshold`` and accumulated accuracy gain, and the rounds
    to each of ``thresholds`` in accuracy on the classes seen so far (FedTeddi's per-frame figure)."""
    out: List[Dict[str, Any]] = []
    periods: Dict[int, List[Dict[str, Any]]] = {}
    for e in evals:
        if e.get("period") is not None:
            periods.setdefault(int(e["period"]), []).append(e)
    for p in sorted(periods):
        es = periods[p]
        base = es[0]["accuracy"]
        out.append({"period": p, "start_s": es[0]["time_s"],
                    "time_to_accuracy_s": time_to(es, threshold, es[0]["time_s"]),
                    "accumulated_gain": round(sum(e["accuracy"] - base for e in es) * eval_every_s, 4),
                    "rounds_to_seen": {str(t): rounds_to(es, t) for t in thresholds},
                    "evaluations": len({e["time_s"] for e in es}),
                    "rounds": int(es[-1]["version"]) - int(es[0]["version"])})
    return out


def continual_figures(evals: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """ST-EWC sec. 5.1's three metrics, from evaluations carrying every period's accuracy.

    ``period1_accuracy``: Acc(theta, C_1) at the end (eq. 13). ``overall_accuracy``: Acc(theta,
    O_T), the mean over all T periods' test sets (equal sizes), at the end (eq. 14), and
    ``mean_overall_accuracy`` its mean over the run's evaluations (Fig. 4's curve in one number).
    ``average_accuracy_by_period``: eq. 15 at the end of each period t, the mean over i <= t of
    Acc(theta^{t,*}, C_i) with theta^{t,*} the model at period t's last evaluation (Fig. 5's
    curve); ``average_accuracy`` its mean over the periods (Fig. 5 in one number: a method that
    forgets falls as t grows).
    """
    with_periods = [e for e in evals if e.get("period_accuracy") and e.get("period") is not None]
    if not with_periods:
        return None
    final = with_periods[-1]["period_accuracy"]
    at_end: Dict[int, List[float]] = {}
    for e in with_periods:
        at_end[int(e["period"])] = e["period_accuracy"]
    by_period = [float(np.mean(at_end[t][:t + 1])) for t in sorted(at_end)]
    return {"period1_accuracy": float(final[0]), "overall_accuracy": float(np.mean(final)),
            "mean_overall_accuracy": float(np.mean([np.mean(e["period_accuracy"]) for e in with_periods])),
            "average_accuracy": float(np.mean(by_period)),
            "average_accuracy_by_period": [round(a, 6) for a in by_period]}


def aggregation_figures(aggregates: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Updates per aggregation, devices per round and merged staleness from ``aggregate`` events."""
    staleness = Counter(int(s) for a in aggregates for s in a.get("staleness") or ())
    per_round = [len(set(a.get("devices") or ())) for a in aggregates]
    return {
        "aggregations": len(aggregates),
        "staleness_histogram": {str(k): v for k, v in sorted(staleness.items())},
        "updates_per_aggregation": (round(float(np.mean([a["n"] for a in aggregates])), 3)
                                    if aggregates else None),
        "devices_per_round": {"mean": round(float(np.mean(per_round)), 3) if per_round else None,
                              "histogram": {str(k): v for k, v in sorted(Counter(per_round).items())}},
    }


def run_figures(evals: List[Dict[str, Any]], updates: List[Dict[str, Any]], totals: Dict[str, Any],
                thresholds: Sequence[float], eval_every_s: float,
                aggregates: Sequence[Dict[str, Any]] = ()) -> Dict[str, Any]:
    """One seed of one method (``aggregates``: the run's ``aggregate`` events)."""
    last = evals[-1] if evals else {}
    figures = {
        "final_accuracy": last.get("accuracy"),
        "final_accuracy_seen": last.get("accuracy_seen"),
        "mean_accuracy": (round(float(np.mean([e["accuracy"] for e in evals])), 6)
                          if evals else None),
        "energy_j": last.get("energy_j"),
        # The two parts of energy_j: rounds (whole-board power while training) and idle time.
        "train_energy_j": last.get("train_energy_j"),
        "idle_energy_j": last.get("idle_energy_j"),
        "versions": last.get("version"),
        "updates": len(updates),
        "time_to_accuracy_s": {str(t): time_to(evals, t) for t in thresholds},
        "energy_to_accuracy_j": {str(t): energy_to(evals, t) for t in thresholds},
        "diverged_rounds": sum(d.get("diverged_rounds", 0) for d in totals.values()),
        "train_s": round(sum(d["train_s"] for d in totals.values()), 3),
        "idle_s": round(sum(d["idle_s"] for d in totals.values()), 3),
        "round_latency_s": _mean_std([d["round_latency_s"] for d in totals.values()])["mean"],
        "energy_j_per_device": {k: d["energy_j"] for k, d in totals.items()},
        "periods": (period_figures(evals, thresholds[0], eval_every_s, thresholds)
                    if thresholds else []),
    }
    figures.update(aggregation_figures(list(aggregates)))
    cont = continual_figures(evals)
    if cont is not None:
        figures.update(cont)
    return figures


def method_summary(runs: List[Dict[str, Any]], thresholds: Sequence[float]) -> Dict[str, Any]:
    """Mean and spread over seeds of the figures the issue names, plus every seed's own."""
    out: Dict[str, Any] = {"seeds": len(runs), "runs": runs}
    for key in ("final_accuracy", "final_accuracy_seen", "mean_accuracy", "energy_j",
                "train_energy_j", "idle_energy_j", "train_s", "idle_s", "round_latency_s", "updates_per_aggregation", "period1_accuracy",
                "overall_accuracy", "mean_overall_accuracy", "average_accuracy"):
        values = [r.get(key) for r in runs]
        if all(v is None for v in values):
            continue
        stats = _mean_std(values)
        out[key], out[key + "_std"] = stats["mean"], stats["std"]
    per_round = [(r.get("devices_per_round") or {}).get("mean") for r in runs]
    if any(v is not None for v in per_round):
        stats = _mean_std(per_round)
        out["devices_per_round"], out["devices_per_round_std"] = stats["mean"], stats["std"]
    out["time_to_accuracy_s"] = {}
    out["energy_to_accuracy_j"] = {}
    out["reached"] = {}
    for t in thresholds:
        values = [r["time_to_accuracy_s"][str(t)] for r in runs]
        out["time_to_accuracy_s"][str(t)] = _mean_std(values)["mean"]
        # Mean over the seeds that reached it (``reached`` says how many).
        out["energy_to_accuracy_j"][str(t)] = _mean_std(
            [(r.get("energy_to_accuracy_j") or {}).get(str(t)) for r in runs])["mean"]
        out["reached"][str(t)] = sum(v is not None for v in values)
    return out


def read_summary(path: Path) -> Dict[str, Any]:
    """``summary.json`` with its ``methods`` mapping checked; StreamflError names what is wrong."""
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
