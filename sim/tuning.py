"""``streamfl tune``: each method at its best learning rate, from a small sweep, before a comparison.

A comparison at one shared learning rate favours whichever method that rate suits (docs/results.md:
FedAsync's accuracy on single-class streams rises with its rate). The sweep runs every method at
every rate on the scenario's first ``seeds`` seeds (``run_sim``, so ``jobs`` runs go in parallel),
picks each method's rate with the best mean accuracy over the run, and writes into ``out_dir``:
``sweep-LR/`` (each rate's run folder), ``tuned.json`` (per method: the chosen rate and every
rate's figures) and ``tuned.flags`` (``--set method_lr.NAME=LR`` for ``streamfl sim``).
"""
import json
import logging
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from streamfl.errors import ConfigError, StorageError
from streamfl.sim.driver import run_sim
from streamfl.sim.scenario import Scenario, with_overrides

log = logging.getLogger(__name__)

#: What a rate is judged by: the run's mean accuracy (the comparison's own figure).
CRITERION = "mean_accuracy"


def tune_lr(scenario: Scenario, methods: Sequence[str], lrs: Sequence[float], out_dir: Path,
            seeds: int = 1, jobs: Optional[int] = None, also: Optional[Dict[str, str]] = None,
            **run_options: Any) -> Dict[str, Any]:
    """Sweep ``lrs`` for every method; returns ``{method: {"lr": best, "sweep": {lr: figures}}}``."""
    if not lrs or any(not 0.0 < float(lr) <= 10.0 for lr in lrs):
        raise ConfigError("tune: learning rates must be in (0, 10], got %r" % (list(lrs),))
    if not methods:
        raise ConfigError("tune: name at least one method")
    out_dir = Path(out_dir)
    sweep: Dict[str, Dict[str, Dict[str, Any]]] = {m: {} for m in methods}
    for lr in sorted(float(x) for x in lrs):
        tuned = with_overrides(scenario, method_lr={m: lr for m in methods})
        summary = run_sim(tuned, out_dir / ("sweep-%g" % lr), methods=list(methods),
                          seeds=seeds, jobs=jobs, **run_options)
        for name, figures in summary["methods"].items():
            sweep[name]["%g" % lr] = {key: figures.get(key) for key in
                                      (CRITERION, CRITERION + "_std", "final_accuracy", "energy_j", "seeds")}
            if figures.get("failed"):
                sweep[name]["%g" % lr]["failed"] = figures["failed"]
    result: Dict[str, Any] = {}
    for name, by_lr in sweep.items():
        # A rate with a failed run is scored on fewer seeds than the others: it is not chosen.
        scored = [(v[CRITERION], float(lr)) for lr, v in by_lr.items()
                  if v[CRITERION] is not None and not v.get("failed")]
        best = max(scored)[1] if scored else None
        result[name] = {"lr": best, "sweep": by_lr}
        log.info("%s: best lr %s (%s)", name, best, ", ".join(
            "%s: %.3f" % (lr, v[CRITERION]) for lr, v in by_lr.items() if v[CRITERION] is not None))
    write_tuning(result, out_dir, also)
    return result


def write_tuning(result: Dict[str, Any], out_dir: Path,
                 also: Optional[Dict[str, str]] = None) -> None:
    """``tuned.json`` and ``tuned.flags`` (one ``--set method_lr.NAME=LR`` per tuned method, and
    per method of ``also``, which takes the rate of the tuned method it names: an ablation of a
    method starts from the method's rate)."""
    rates = {name: r["lr"] for name, r in result.items() if r["lr"] is not None}
    for name, source in (also or {}).items():
        if source not in result:
            raise ConfigError("tune: --also %s=%s names a method that was not tuned" % (name, source))
        if rates.get(source) is not None:
            rates[name] = rates[source]
    flags = " ".join("--set method_lr.%s=%g" % (name, lr) for name, lr in rates.items())
    try:
        (out_dir / "tuned.json").write_text(json.dumps(result, indent=1))
        (out_dir / "tuned.flags").write_text(flags + "\n")
    except OSError as exc:
        raise StorageError("cannot write the tuning results to %s: %s" % (out_dir, exc)) from exc


def tuning_table(result: Dict[str, Any]) -> str:
    """Markdown: mean accuracy over the run per method and rate (``± std`` over the seeds where
    the sweep ran more than one), the chosen rate in bold."""
    lrs: List[str] = sorted({lr for r in result.values() for lr in r["sweep"]}, key=float)
    lines = ["| method | " + " | ".join("lr %s" % lr for lr in lrs) + " | chosen |",
             "|---|" + "---|" * (len(lrs) + 1)]
    for name, r in result.items():
        cells = []
        for lr in lrs:
            figures = r["sweep"].get(lr, {})
            v, std = figures.get(CRITERION), figures.get(CRITERION + "_std")
            std = std if (figures.get("seeds") or 0) > 1 else None  # one seed has no spread
            text = "-" if v is None else "%.3f" % v if std is None else "%.3f ± %.3f" % (v, std)
            if figures.get("failed"):
                text += " (%d failed)" % len(figures["failed"])
            cells.append("**%s**" % text if r["lr"] is not None and float(lr) == r["lr"] else text)
        lines.append("| `%s` | %s | %s |" % (name, " | ".join(cells), "-" if r["lr"] is None
                                                else "%g" % r["lr"]))
    return "\n".join(lines)
