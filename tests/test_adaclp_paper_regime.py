"""AdaCLP's own regime in the simulator: class-incomplete users, periods counted in aggregations,
and streamfl's ``learned`` CLP rule (rest and a lower rate once a device's data is learned)."""
import json
import math
from pathlib import Path

import numpy as np
import pytest

from streamfl.methods.clp.learned import learned_lr, should_rest
from streamfl.agent.plugins.base import RoundContext
from streamfl.methods.clp.agent import ClpAgentConfig, ClpAgentPlugin
from streamfl.errors import ConfigError
from streamfl.methods.clp.payloads import ClpState
from streamfl.sensors.datasets import Dataset
from streamfl.sim.driver import Progress, run_sim
from streamfl.sim.partition import keep_class_subsets, partition
from streamfl.sim.scenario import load_scenario, scenario_from_dict
from streamfl.sim.stream_timeline import AggregationClock
from streamfl.sim.streams import make_streams

K = 6
REPO = Path(__file__).resolve().parents[1]


def _dataset(n=600):
    rng = np.random.default_rng(0)
    y = np.arange(n, dtype=np.int64) % K
    subject = (np.arange(n, dtype=np.int64) // K) % 3   # 3 users, each with every class
    return Dataset(rng.normal(size=(n, 4, 3)).astype(np.float32), y, subject,
                   np.asarray(["c%d" % c for c in range(K)]))


DS = _dataset()


def test_class_subsets_keep_lo_to_hi_of_each_users_classes_and_repeat_by_seed():
    parts = partition(DS, 8, "subject", seed=3, classes_per_device=(2, 4))
    assert len(parts) == 8
    kept = [set(np.unique(DS.y[p]).tolist()) for p in parts]
    assert all(2 <= len(k) <= 4 for k in kept)
    assert len({frozenset(k) for k in kept}) > 1          # devices sharing a user differ
    for p, k in zip(parts, kept):                          # all of the kept classes' windows
        user = np.unique(DS.subject[p])
        assert len(user) == 1
        assert len(p) == int(np.sum((DS.subject == user[0]) & np.isin(DS.y, list(k))))
    again = partition(DS, 8, "subject", seed=3, classes_per_device=(2, 4))
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    whole = keep_class_subsets(DS, [np.arange(len(DS.y))], (K, K + 3), seed=0)
    assert np.array_equal(whole[0], np.arange(len(DS.y)))  # at most hi classes: kept whole
    with pytest.raises(ConfigError, match="classes_per_device"):
        keep_class_subsets(DS, parts, (3, 2), seed=0)


def test_periods_counted_in_aggregations_switch_when_the_clock_reaches_them():
    clock = AggregationClock()
    parts = partition(DS, 3, "iid", seed=0)
    streams = make_streams(DS, parts, "extreme", 0, 10.0, 100.0, clock=clock,
                           mu_aggregations=5, sigma_aggregations=0, shared_order=True)
    s = streams[0]
    first = s.class_distribution(50.0)                     # no aggregation yet: still period 0
    assert s.period(50.0) == 0
    for k in range(5):
        clock.record(60.0 + k)                             # the 5th aggregation at t = 64
    assert s.period(63.9) == 0 and s.period(64.0) == 1
    assert not np.array_equal(s.class_distribution(64.5), first)
    assert s.period(1000.0) == 1                           # the next boundary is not reached
    for k in range(5):
        clock.record(70.0 + k)
    assert s.period(74.0) == 2
    assert list(s.period_bounds_s) == [0.0, 64.0, 74.0]
    _, y = s.windows(64.0, 74.0)                            # one class per period, as in seconds
    assert len(set(y.tolist())) == 1


def test_periods_in_aggregations_need_a_clock():
    parts = partition(DS, 2, "iid", seed=0)
    with pytest.raises(ConfigError, match="aggregation clock"):
        make_streams(DS, parts, "extreme", 0, 10.0, 100.0, mu_aggregations=5)


def test_learned_rule_lowers_the_rate_and_rests_only_below_its_loss_levels():
    ln_k = math.log(7)
    assert learned_lr(None, 7, 0.05, 0.0005, 0.25) == 0.05
    assert learned_lr(ln_k, 7, 0.05, 0.0005, 0.25) == 0.05            # not learned: full rate
    assert learned_lr(0.125 * ln_k, 7, 0.05, 0.0005, 0.25) == pytest.approx(0.025)
    assert learned_lr(0.0, 7, 0.05, 0.0005, 0.25) == 0.0005            # floor
    assert should_rest(0.04 * ln_k, 7, 0.05) and not should_rest(0.06 * ln_k, 7, 0.05)
    assert not should_rest(None, 7, 0.05) and not should_rest(0.0, 7, 0.0)


def _state(regulating=True):
    return ClpState(version=3, fisher_global=2.0, fisher_global_prev=2.0, in_clp=True, segment=0,
                    segment_start_version=0, regulating=regulating)


class _GM:
    def __init__(self, state):
        self.extras = {"clp": state}


def _after_round(plugin, loss):
    ctx = RoundContext(model=None, tensors={}, round_index=0, seed=0, sample=None, buffer_len=0,
                       loss=loss + 5.0, start_loss=loss, num_classes=7)
    plugin.after_round(ctx)                             # buffer_len 0: no Fisher trace computed here


def test_the_clp_plugin_rests_for_rest_rounds_round_lengths_then_measures_again():
    plugin = ClpAgentPlugin(ClpAgentConfig(initial_lr=0.05, lr_max=0.05, lr_min=0.0005, lr_rule="learned",
                                           rest_loss_frac=0.05, rest_rounds=3.0))
    hparams = {"lr": 0.05, "batch_size": 32, "dropout": 0.0}
    plugin.on_model_received(_GM(_state()), hparams)
    assert plugin.on_round_opportunity(0.0)              # a round starts at 0 ...
    _after_round(plugin, 0.01)                           # ... learned data ...
    assert not plugin.on_round_opportunity(2.0)          # ... took 2 s: rest 6 s
    assert not plugin.on_round_opportunity(7.9)
    assert plugin.on_round_opportunity(8.0) and plugin.rests == 1
    _after_round(plugin, 1.5)                            # not learned: train on
    assert plugin.on_round_opportunity(9.0)
    assert plugin.on_model_received(_GM(_state()), hparams).hparams["lr"] == 0.05
    paper = ClpAgentPlugin(ClpAgentConfig(initial_lr=0.05, lr_max=0.05, lr_min=0.0005))
    paper.on_model_received(_GM(_state()), hparams)
    paper.on_round_opportunity(0.0)
    _after_round(paper, 0.01)
    assert paper.on_round_opportunity(2.0)               # the paper's rule never rests
    after_r_end = ClpAgentPlugin(ClpAgentConfig(lr_rule="learned"))
    after_r_end.on_model_received(_GM(_state(regulating=False)), hparams)
    after_r_end.on_round_opportunity(0.0)
    _after_round(after_r_end, 0.0)
    assert after_r_end.on_round_opportunity(2.0)         # after R_end: plain FedAsync
    with pytest.raises(ValueError, match="lr_rule"):
        ClpAgentConfig(lr_rule="other")


def test_paper_scenarios_load_with_the_papers_board_mix_and_units():
    for name in ("adaclp-paper-extreme", "adaclp-paper-nonextreme"):
        sc = load_scenario(REPO / "configs" / "scenarios" / (name + ".yaml"))
        boards = {}
        for group in sc.devices:
            boards[group["board"]] = boards.get(group["board"], 0) + group["count"]
        assert 40 <= sc.num_devices <= 120
        assert boards["raspberry-pi-4"] == 0.4 * sc.num_devices   # 20/20/20/40 (sec. 5.1)
        assert sc.stream.params["mu_aggregations"] == 400
        assert sc.stream.params["missing"] == "local"
        assert sc.data.classes_per_device is not None


def test_a_run_with_counted_periods_switches_classes_by_aggregations(tmp_path):
    values = {
        "name": "counted", "duration_s": 20.0, "model": {"name": "cnn1d", "hidden": 8},
        "data": {"dataset": "synthetic", "n_windows": 600, "partition": "subject",
                 "classes_per_device": [2, 3]},
        "stream": {"kind": "extreme", "windows_per_s": 5.0,
                   "params": {"mu_aggregations": 20, "sigma_aggregations": 0, "missing": "local"}},
        "devices": [{"count": 3, "board": "jetson-orin-nano"}],
        "methods": ["fedasync"], "eval_every_s": 1.0, "eval_windows": 100,
        "agent": {"min_buffer": 8, "buffer_capacity": 16, "round_interval_s": 0.05},
        "coordinator": {"hparams": {"lr": 0.05, "batch_size": 8, "local_steps": 2}},
    }
    out = tmp_path / "run"
    run_sim(scenario_from_dict(values), out, progress=Progress(1, stream=open("/dev/null", "w")))
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [e for e in events if e["event"] == "eval" and not e["final"]]
    versions = [e["version"] for e in evals]
    periods = [e["period"] for e in evals]
    assert versions[-1] > 60 and periods[-1] >= 2
    assert periods == [v // 20 for v in versions]        # 20 aggregations a period, exactly


def test_tune_keeps_each_methods_best_rate_and_its_flags_reproduce_the_sweep(tmp_path):
    from streamfl.cli import main
    from streamfl.sim.scenario import parse_sets
    smoke = str(REPO / "configs" / "scenarios" / "smoke.yaml")
    out = tmp_path / "tune"
    # The sweep's rounds in a worker process (--workers), the run again serially: the same figures.
    assert main(["tune", smoke, "--methods", "fedasync", "--lrs", "0.001,0.2", "--duration", "40",
                 "--workers", "1", "--out", str(out)]) == 0
    tuned = json.loads((out / "tuned.json").read_text())["fedasync"]
    sweep = {float(lr): v["mean_accuracy"] for lr, v in tuned["sweep"].items()}
    assert set(sweep) == {0.001, 0.2} and tuned["lr"] == max(sweep, key=sweep.get)
    flags = (out / "tuned.flags").read_text().split()
    assert flags == ["--set", "method_lr.fedasync=%g" % tuned["lr"]]
    again = run_sim(load_scenario(Path(smoke), {"duration_s": 40}, parse_sets(flags[1:])),
                    tmp_path / "again", methods=["fedasync"], seeds=1,
                    progress=Progress(1, stream=open("/dev/null", "w")))
    assert again["methods"]["fedasync"]["mean_accuracy"] == sweep[tuned["lr"]]
    with pytest.raises(ConfigError, match="method_lr"):
        load_scenario(Path(smoke), None, parse_sets(["method_lr.fedasync=-1"]))


def test_energy_to_a_target_accuracy_is_the_energy_at_the_first_evaluation_reaching_it():
    from streamfl.sim.summary import energy_to, method_summary
    from streamfl.sim.tables import markdown_table
    evals = [{"time_s": 0, "accuracy": 0.1, "energy_j": 0.0},
             {"time_s": 1, "accuracy": 0.45, "energy_j": 120.0},
             {"time_s": 2, "accuracy": 0.3, "energy_j": 250.0},
             {"time_s": 3, "accuracy": 0.55, "energy_j": 400.0}]
    assert energy_to(evals, 0.4) == 120.0 and energy_to(evals, 0.5) == 400.0
    assert energy_to(evals, 0.9) is None
    runs = [{"time_to_accuracy_s": {"0.4": 1.0, "0.5": None}, "energy_to_accuracy_j":
             {"0.4": 1200.0, "0.5": None}, "mean_accuracy": 0.4, "energy_j": 5000.0},
            {"time_to_accuracy_s": {"0.4": 2.0, "0.5": 3.0}, "energy_to_accuracy_j":
             {"0.4": 1800.0, "0.5": 4000.0}, "mean_accuracy": 0.5, "energy_j": 6000.0}]
    m = method_summary(runs, [0.4, 0.5])
    assert m["energy_to_accuracy_j"] == {"0.4": 1500.0, "0.5": 4000.0}
    assert m["reached"] == {"0.4": 2, "0.5": 1}
    other = method_summary([dict(runs[0])], [0.4, 0.5])
    table = markdown_table({"methods": {"a": m, "b": other}}, reference="a")
    assert "energy to 0.4 accuracy" in table          # the highest target every method reached
    assert "| 1.5 (2/2) |" in table and "| 1.2 (1/1) |" in table


def test_efficient_clocks_get_their_power_table_from_the_board_profile():
    from streamfl.dvfs.config import DvfsConfig
    from streamfl.dvfs.profiles import load_profile
    from streamfl.dvfs.utilization import power_table, training_utilization
    cfg = DvfsConfig(backend="simulated", board="jetson-nano", policy="clp-aware",
                     policy_options={"clp_level": "efficient", "climb_energy_ratio": 1.1})
    profile = load_profile("jetson-nano")
    assert cfg.policy_kwargs()["power_w"] == power_table(profile, training_utilization(profile))
    plain = DvfsConfig(backend="simulated", board="jetson-nano", policy="clp-aware")
    assert "power_w" not in plain.policy_kwargs()               # the paper's policy needs none
    with pytest.raises(ValueError, match="power_w"):
        # No board to read watts from (the agent config checks it once its top-level board is in).
        DvfsConfig(backend="simulated", policy="clp-aware",
                   policy_options={"clp_level": "efficient"}).check_policy()


def test_the_warmup_reference_travels_in_the_global_model_and_is_absent_until_known():
    from streamfl.protocol.codec import Decoder, encode
    from streamfl.protocol.messages import GlobalModel
    from streamfl.models import ModelSpec, tensor_spec
    from streamfl.models.registry import build_model
    from streamfl.models.serialize import model_to_arrays
    spec = ModelSpec(name="cnn1d", in_channels=3, window_len=8, num_classes=4, hidden=8)
    tensors = model_to_arrays(build_model(spec))
    decoder = Decoder({spec.arch_id: tensor_spec(spec)})
    for ref in (None, 3.5):
        state = ClpState(version=2, fisher_global=1.0, fisher_global_prev=None, in_clp=True,
                         segment=0, segment_start_version=0, regulating=True, fisher_reference=ref)
        assert ("fisher_reference" in state.fields()) == (ref is not None)
        gm = GlobalModel(version=2, arch_id=spec.arch_id, tensors=tensors,
                         hparams={"lr": 0.05}, extras={"clp": state})
        assert decoder.decode(encode(gm)).extras["clp"] == state


def test_tuned_flags_give_an_ablation_the_rate_of_the_method_it_varies(tmp_path):
    from streamfl.sim.tuning import tuning_table, write_tuning
    result = {"adaclp": {"lr": 0.2, "sweep": {"0.1": {"mean_accuracy": 0.3},
                                              "0.2": {"mean_accuracy": 0.4}}}}
    write_tuning(result, tmp_path, {"adaclp-no-dvfs": "adaclp"})
    assert (tmp_path / "tuned.flags").read_text().split() == [
        "--set", "method_lr.adaclp=0.2", "--set", "method_lr.adaclp-no-dvfs=0.2"]
    assert "| `adaclp` | 0.300 | **0.400** | 0.2 |" in tuning_table(result)
    with pytest.raises(ConfigError, match="not tuned"):
        write_tuning(result, tmp_path, {"x": "fedasync"})
    # Swept over several seeds: each cell gives the spread too.
    result["adaclp"]["sweep"]["0.2"].update(mean_accuracy_std=0.0125, seeds=3)
    result["adaclp"]["sweep"]["0.1"].update(mean_accuracy_std=0.0, seeds=1)
    assert "| `adaclp` | 0.300 | **0.400 ± 0.013** | 0.2 |" in tuning_table(result)


def test_periods_can_count_merged_updates_so_a_fedavg_round_counts_its_updates():
    clock = AggregationClock()
    parts = partition(DS, 2, "iid", seed=0)
    by_updates = make_streams(DS, parts, "extreme", 0, 10.0, 100.0, clock=clock,
                              mu_aggregations=4, sigma_aggregations=0, count="updates")[0]
    by_rounds = make_streams(DS, parts, "extreme", 0, 10.0, 100.0, clock=clock,
                             mu_aggregations=4, sigma_aggregations=0)[0]
    clock.record(10.0, merged=3)                         # a FedAvg round of 3 updates
    clock.record(20.0, merged=3)
    assert by_updates.period(20.0) == 1 and by_updates.period_bounds_s[1] == 20.0
    assert by_rounds.period(20.0) == 0                   # 2 of 4 rounds
    with pytest.raises(ConfigError, match="count"):
        make_streams(DS, parts, "extreme", 0, 10.0, 100.0, clock=clock, mu_aggregations=4,
                     count="versions")
