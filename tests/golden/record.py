"""Record or check the simulator's figures for every registered method: the refactor guard.

``python tests/golden/record.py --write`` runs ``streamfl sim`` (through ``run_sim``, as the CLI does)
for every method in ``streamfl.sim.methods.METHODS`` on short scenarios with seed 0 and stores
each ``summary.json`` here, less the wall-clock fields. Without ``--write`` it runs the same and
prints the first difference; ``tests/test_golden_sim.py`` does that in the suite and ``make golden``
rewrites the files after a deliberate behaviour change.
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

#: (golden file stem, scenario file, virtual seconds, --set overrides). Short runs that still reach
#: CLP segments, FedAvg deadline rounds and FedCurv's sums, on synthetic and on real (watch) data.
RUNS: List[Tuple[str, str, float, Dict[str, Any]]] = [
    ("smoke", "configs/scenarios/smoke.yaml", 60.0,
     # ST-EWC's methods cross two scheduled period boundaries (the other methods ignore it).
     {"plugins.stewc.boundary": "schedule", "plugins.stewc.period_s": 20.0}),
    ("adaclp-extreme", "configs/scenarios/adaclp-extreme.yaml", 90.0,
     {"plugins.clp.last_regulated_version": 200}),
    # Two session boundaries (100 s, 200 s) with the population changing: the pilot, an auxiliary
    # round, and at 200 s a start weighted over a saved session's gradient.
    ("session-churn", "configs/scenarios/session-churn.yaml", 250.0, {}),
    # Latent states in partial access: DDS admitting by state, SAW weighing, IS and FedOGD's
    # buffers, Adaptive-FedAvg's lr (about 12 FedAvg rounds).
    ("sfedpo-latent", "configs/scenarios/sfedpo-latent-states.yaml", 60.0,
     {"stream.params.access": "partial"}),
]

#: Methods recorded on the session-churn run only (elsewhere no device comes or goes: they would
#: be FedAvg's figures again); the other methods are not recorded there.
SESSION_METHODS = ("previous", "continuous", "average", "session-init", "session-init-beside",
                   "session-init+adaclp")

#: Methods recorded on the first scenario only, since the second one is the slow one (a third of
#: the guard's time): it keeps the methods that read CLP (its point: class periods and CLP
#: segments), ``fedteddi`` (its eq. 18 reads the class periods' norms, which smoke's stream barely
#: moves) and ``fedavg`` as their reference. The scheduling baselines share one plug-in and one
#: code path with ``fedteddi``; ST-EWC, FedCurv and their variants reach their boundaries and sums
#: on smoke; ``fedasync`` is the strategy every CLP method there runs on.
FIRST_SCENARIO_ONLY = ("random", "best-channel", "best-norm", "power-of-choice", "pure-drift",
                       "fedcbs", "fedcgd", "random+adaclp", "fedteddi-fill", "fedteddi-fill+adaclp",
                       "stewc", "timeewc", "stewc-async", "stewc+adaclp", "fedcurv", "afedcurv",
                       "fedasync")


#: Methods recorded on the sfedpo-latent run only: they choose windows by latent state or per
#: round, which the other runs' streams (no states, slow turnover) do not exercise.
SFEDPO_METHODS = ("sfedpo", "dds-only", "saw-only", "sfedpo+adaclp", "is", "is-window", "fedogd", "adapfedavg")


def methods_for(stem: str, registered: List[str]) -> List[str]:
    """The registered methods recorded for the run ``stem``, sorted."""
    if stem == "session-churn":
        return sorted(m for m in registered if m in SESSION_METHODS)
    if stem == "sfedpo-latent":
        return sorted(m for m in registered if m in SFEDPO_METHODS)
    skip = (() if stem == RUNS[0][0] else FIRST_SCENARIO_ONLY) + SESSION_METHODS + SFEDPO_METHODS
    return sorted(m for m in registered if m not in skip)


#: Fields that measure this machine, not the run.
VOLATILE = ("wall_s",)
#: Fields that depend on the size of the frames on the wire, compared within 1 ms or a relative
#: 1e-3: a round's latency includes its upload, timed from the update's frame size, and the
#: typed-extras format (the plug-in refactor) changed the header and tensor names by a few bytes
#: per frame (0.2 ms on the slowest simulated link, seen as 0.1804 s against 0.1806 s after the
#: summary's rounding to 0.1 ms); every other figure (accuracy, energy, versions, staleness,
#: rounds) stayed bit-identical.
WIRE_SIZED = ("round_latency_s",)
WIRE_RTOL = 1e-3
WIRE_ATOL_S = 1e-3
#: Figures made from held-out predictions (any key naming ``accuracy``, within ``ACCURACY_ATOL``,
#: and a period's accumulated gain, a sum of accuracies times the evaluation interval in
#: accuracy-seconds, within ``GAIN_ATOL``): on another CPU torch's kernels round the weights' last
#: bits differently, which now and then flips a few of the held-out predictions. At the same
#: commit session-churn's four methods gave final accuracies 0.457 / 0.541 on the machine that
#: recorded them and 0.456 / 0.542 on another, and accumulated gains up to 0.047 apart (0.618 /
#: 0.571); the other runs matched exactly. Every other figure (energy, versions, rounds,
#: staleness, latency) stays exact and catches a change of behaviour.
ACCURACY_ATOL = 0.01
GAIN_ATOL = 0.1
#: Rounds to an accuracy threshold (any figure under a ``rounds_to`` key) within this many rounds:
#: a flipped prediction at the threshold moves the crossing by one. Seen 2026-11-28: `continuous`
#: on session-churn reached 0.6 in period 1 after 12 rounds on the machine that recorded it and
#: after 11 on another (final accuracy 0.479 against 0.478); every other figure of every other
#: method matched to the digit. A missing crossing (None) stays exact.
ROUNDS_TO_ATOL = 1


def strip(value: Any) -> Any:
    """The summary without wall-clock fields."""
    if isinstance(value, dict):
        return {k: strip(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [strip(v) for v in value]
    return value


def run_one(stem: str, scenario_path: str, duration_s: float, sets: Dict[str, Any],
            methods: List[str], workers: Optional[int] = None) -> Dict[str, Any]:
    """Run ``methods`` on one scenario for seed 0; the stripped summary. ``workers``: each run's
    device rounds in that many worker processes of its own (``--workers``)."""
    from streamfl.sim.driver import run_sim
    from streamfl.sim.scenario import load_scenario
    scenario = load_scenario(ROOT / scenario_path, overrides={"duration_s": duration_s},
                             sets=sorted(sets.items()))
    with tempfile.TemporaryDirectory() as tmp:
        # Two worker processes: the figures are the serial run's (tests/test_sim_jobs.py), in
        # half the time now that 26 methods run.
        summary = run_sim(scenario, Path(tmp), methods=methods, seeds=1, jobs=2, workers=workers)
    return strip(summary)


def first_difference(a: Any, b: Any, path: str = "") -> str:
    """Where two JSON values first differ ('' if equal)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return "%s/%s: only in %s" % (path, key, "golden" if key in a else "new run")
            diff = first_difference(a[key], b[key], "%s/%s" % (path, key))
            if diff:
                return diff
        return ""
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for k, (x, y) in enumerate(zip(a, b)):
            diff = first_difference(x, y, "%s[%d]" % (path, k))
            if diff:
                return diff
        return ""
    if path.rsplit("/", 1)[-1] in WIRE_SIZED and isinstance(a, float) and isinstance(b, float):
        close = abs(a - b) <= max(WIRE_ATOL_S, WIRE_RTOL * max(abs(a), abs(b)))
        return "" if close else "%s: golden %r, now %r" % (path, a, b)
    if "/rounds_to" in path and type(a) is int and type(b) is int:
        return "" if abs(a - b) <= ROUNDS_TO_ATOL else "%s: golden %r, now %r" % (path, a, b)
    key = path.rsplit("/", 1)[-1].split("[", 1)[0]
    atol = GAIN_ATOL if key == "accumulated_gain" else ACCURACY_ATOL if "accuracy" in key else None
    if atol is not None and isinstance(a, float) and isinstance(b, float):
        return "" if abs(a - b) <= atol else "%s: golden %r, now %r" % (path, a, b)
    return "" if a == b else "%s: golden %r, now %r" % (path, a, b)


def main(argv: List[str]) -> int:
    from streamfl.sim.methods import METHODS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="(re)write the golden files")
    args = parser.parse_args(argv)
    status = 0
    for stem, path, duration_s, sets in RUNS:
        got = run_one(stem, path, duration_s, sets, methods_for(stem, list(METHODS)))
        target = HERE / ("%s.json" % stem)
        if args.write:
            target.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
            print("wrote %s" % target)
            continue
        diff = first_difference(json.loads(target.read_text()), json.loads(json.dumps(got)))
        print("%s: %s" % (stem, diff or "identical"))
        status |= bool(diff)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
