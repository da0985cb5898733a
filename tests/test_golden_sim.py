"""The refactor guard: every registered method gives the figures recorded before the refactor.

``tests/golden/*.json`` hold ``summary.json`` of ``streamfl sim`` (seed 0, short scenarios)
recorded by ``tests/golden/record.py --write`` (the sessions methods on a churn run of their own); a change that moves any figure fails here. After a
deliberate behaviour change, ``make golden`` rewrites them (say why in the commit).

Every method is checked both ways: with each device round trained in the run's own process (the
serial run), and with the rounds in a worker process of the run's own (``--workers 1``: the
whole parallel path, handing rounds out while the loop goes on, at the serial run's cost on two
cores); both must give the recorded figures. The slow second scenario runs the serial way only:
each of its methods runs on the first scenario both ways.
"""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "golden"))
import record  # noqa: E402


#: Runs checked with round workers too: every run but the slow second scenario, whose methods all
#: run on the first one as well (so every method is checked both ways).
ROUND_WORKER_RUNS = [r for r in record.RUNS if r[0] != "adaclp-extreme"]
CASES = [pytest.param(*run, None, id="%s-serial-rounds" % run[0]) for run in record.RUNS] + \
    [pytest.param(*run, 1, id="%s-round-workers" % run[0]) for run in ROUND_WORKER_RUNS]


def test_every_method_is_checked_with_round_workers_too():
    from streamfl.sim.methods import METHODS
    checked = {m for run in ROUND_WORKER_RUNS for m in record.methods_for(run[0], list(METHODS))}
    everywhere = {m for run in record.RUNS for m in record.methods_for(run[0], list(METHODS))}
    assert checked == everywhere


@pytest.mark.timeout(900)  # every method, one after another on two workers: minutes, not seconds
@pytest.mark.parametrize("stem, scenario, duration_s, sets, workers", CASES)
def test_every_method_matches_its_recorded_figures(stem, scenario, duration_s, sets, workers):
    from streamfl.sim.methods import METHODS
    golden = json.loads((record.HERE / ("%s.json" % stem)).read_text())
    recorded = sorted(golden["methods"])
    missing = sorted(set(record.methods_for(stem, list(METHODS))) - set(recorded))
    methods = [m for m in recorded if m in METHODS]
    assert methods == recorded, "recorded methods no longer registered: %s" % sorted(set(recorded) - set(METHODS))
    got = json.loads(json.dumps(record.run_one(stem, scenario, duration_s, sets, methods, workers)))
    diff = record.first_difference(golden, got)
    assert not diff, "%s: %s" % (stem, diff)
    # A method registered after the recording has no figures to match yet: record it (make golden).
    assert not missing, "methods without golden figures: %s (run make golden)" % missing


def test_figures_compare_exactly_but_accuracy_within_a_few_predictions():
    diff = record.first_difference
    assert diff({"final_accuracy": 0.457}, {"final_accuracy": 0.456}) == ""       # a flipped prediction
    assert diff({"runs": [{"accumulated_gain": 0.618}]}, {"runs": [{"accumulated_gain": 0.571}]}) == ""
    assert "accumulated_gain" in diff({"accumulated_gain": 0.618}, {"accumulated_gain": 0.4})
    assert "final_accuracy" in diff({"final_accuracy": 0.457}, {"final_accuracy": 0.44})
    assert "energy_j" in diff({"energy_j": 1.0}, {"energy_j": 1.001})             # everything else exact
    assert "versions" in diff({"versions": 12}, {"versions": 13})
    # A crossing of an accuracy threshold may move by one round with a flipped prediction, no more.
    assert diff({"rounds_to_seen": {"0.6": 12}}, {"rounds_to_seen": {"0.6": 11}}) == ""
    assert "rounds_to_seen" in diff({"rounds_to_seen": {"0.6": 12}}, {"rounds_to_seen": {"0.6": 10}})
    assert "rounds_to_seen" in diff({"rounds_to_seen": {"0.6": 12}}, {"rounds_to_seen": {"0.6": None}})
