"""A scenario's ``pretrain`` section: version 0 trained beforehand on the initial classes, once per
seed, the same for every method of the seed, and its held-out accuracy in each run's figures."""
import json

import numpy as np
import pytest

from streamfl.errors import ConfigError
from streamfl.models import ModelSpec, model_to_arrays, build_model
from streamfl.sim.driver import Progress, run_sim
from streamfl.sim.pretrain import PretrainConfig, held_out_accuracy, pretrain, select
from streamfl.sim.scenario import scenario_from_dict

pytestmark = pytest.mark.timeout(120)


def frames_scenario(**changes):
    values = {
        "name": "pretrain", "duration_s": 12.0, "model": {"name": "cnn1d", "hidden": 8},
        "data": {"dataset": "digits", "partition": "iid"},
        "stream": {"kind": "new_class_frames", "windows_per_s": 10.0,
                   "params": {"frame_s": 6.0}},
        "devices": [{"count": 4, "board": "jetson-orin-nano", "seconds_per_sample_s": 0.001}],
        "methods": ["fedavg", "random"], "eval_every_s": 2.0, "eval_windows": 300,
        "agent": {"min_buffer": 16, "buffer_capacity": 64, "round_interval_s": 1.0},
        "coordinator": {"hparams": {"lr": 0.01, "batch_size": 16, "local_steps": 1},
                        "fedavg": {"deadline_s": 1.0}},
        "pretrain": {"classes": "initial", "epochs": 30},
    }
    values.update(changes)
    return scenario_from_dict(values)


@pytest.mark.parametrize("bad", [{"classes": "some"}, {"epochs": 0}, {"lr": float("nan")},
                                 {"lr": float("inf")}, {"lr": 0.0}, {"momentum": 1.0},
                                 {"batch_size": 0}, {"epochs": True}])
def test_a_bad_pretrain_value_is_refused_naming_it(bad):
    with pytest.raises(ConfigError, match="pretrain"):
        frames_scenario(pretrain=dict({"classes": "initial"}, **bad))


def test_pretraining_is_deterministic_and_learns_the_chosen_classes():
    from streamfl.sim.datasets import load_dataset
    ds = load_dataset("digits", seed=0)
    spec = ModelSpec(name="cnn1d", in_channels=ds.X.shape[2], window_len=ds.X.shape[1],
                     num_classes=ds.num_classes, hidden=8)
    X, y = select(ds.X[:1200], ds.y[:1200], [0, 1, 2])
    Xh, yh = select(ds.X[1200:], ds.y[1200:], [0, 1, 2])
    config = PretrainConfig(classes="all", epochs=30)
    a, b = pretrain(spec, X, y, config, seed=3), pretrain(spec, X, y, config, seed=3)
    assert all(np.array_equal(a[k], b[k]) for k in a)                    # same seed, same model
    c = pretrain(spec, X, y, config, seed=4)
    assert any(not np.array_equal(a[k], c[k]) for k in a)
    untrained = model_to_arrays(build_model(spec, seed=3))
    assert held_out_accuracy(spec, untrained, Xh, yh) < 0.6
    assert held_out_accuracy(spec, a, Xh, yh) > 0.9                      # three classes learned
    with pytest.raises(ValueError, match="no training windows"):
        pretrain(spec, X[:0], y[:0], config, seed=3)


def test_every_method_of_a_seed_starts_from_the_model_trained_on_the_initial_classes(tmp_path):
    """Serial and in worker processes alike (the same files)."""
    from sim_grid import run_files
    scenario = frames_scenario(duration_s=4.0)
    out = tmp_path / "run"
    summary = run_sim(scenario, out, seeds=2, progress=Progress(1, stream=open("/dev/null", "w")))
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first = {}
    for e in events:
        if e["event"] == "eval" and (e["method"], e["seed"]) not in first:
            first[(e["method"], e["seed"])] = e["accuracy"]
    for seed in (0, 1):
        # Both methods start from one model: version 0's accuracy is the same.
        assert first[("fedavg", seed)] == first[("random", seed)]
    runs = {m: v["runs"] for m, v in summary["methods"].items()}
    for method, method_runs in runs.items():
        for run in method_runs:
            # 6 of the 10 digits learned well, the rest unknown: about 0.6 of all held-out windows.
            assert run["pretrain_accuracy"] > 0.9
            assert 0.45 < first[(method, run["seed"])] < 0.65
    assert runs["fedavg"][0]["pretrain_accuracy"] == runs["random"][0]["pretrain_accuracy"]
    run_sim(scenario, tmp_path / "jobs", seeds=2, jobs=2,
            progress=Progress(1, stream=open("/dev/null", "w")))
    assert run_files(out) == run_files(tmp_path / "jobs")


def test_without_pretraining_version_0_is_the_coordinators_seeded_model(tmp_path):
    summary = run_sim(frames_scenario(pretrain={"classes": "none"}, methods=["fedavg"],
                                      duration_s=3.0), tmp_path / "run",
                      progress=Progress(1, stream=open("/dev/null", "w")))
    assert "pretrain_accuracy" not in summary["methods"]["fedavg"]["runs"][0]


def test_initial_classes_need_a_stream_that_has_them(tmp_path):
    scenario = frames_scenario(stream={"kind": "iid", "windows_per_s": 10.0}, methods=["fedavg"])
    with pytest.raises(ConfigError, match="initial needs a stream with initial classes"):
        run_sim(scenario, tmp_path / "run", progress=Progress(1, stream=open("/dev/null", "w")))


def test_pretraining_is_the_same_on_any_thread_count_and_gives_the_count_back():
    import torch
    from streamfl.sim.datasets import load_dataset
    ds = load_dataset("digits", seed=0)
    spec = ModelSpec(name="cnn1d", in_channels=8, window_len=8, num_classes=10, hidden=8)
    config = PretrainConfig(classes="all", epochs=2)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = pretrain(spec, ds.X[:600], ds.y[:600], config, seed=1)
        assert torch.get_num_threads() == 2
        torch.set_num_threads(1)
        one = pretrain(spec, ds.X[:600], ds.y[:600], config, seed=1)
    finally:
        torch.set_num_threads(before)
    assert all(np.array_equal(one[k], two[k]) for k in one)
