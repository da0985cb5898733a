"""bench/bench_dvfs_oracle.py at toy size: its JSON has the promised shape, its oracle is the best
fixed level of a sweep over every level, and its figures are the simulator's power model's."""
import importlib.util
import json
from pathlib import Path

import pytest

from streamfl.dvfs.profiles import load_profile
from streamfl.sim.device import DeviceModel, DeviceSpec

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_dvfs_oracle.py"
BOARD = "jetson-orin-nano"


def _load_module():
    spec = importlib.util.spec_from_file_location("bench_dvfs_oracle", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(capsys, *argv):
    """The bench's main on one board; (exit code, parsed JSON)."""
    bench = _load_module()
    rc = bench.main(["--boards", BOARD, "--samples", "5120", "--round-samples", "256"] + list(argv))
    return bench, rc, json.loads(capsys.readouterr().out)


def test_json_shape_and_the_oracle_is_the_best_fixed_level(capsys):
    bench, rc, doc = _run(capsys)
    assert rc == (0 if doc["pass"] else 1)
    assert doc["parameters"]["goal_ratio_total"] == bench.GOAL_RATIO == 1.10
    assert set(doc["goals"]) == set(bench.SETTINGS) and doc["notes"]
    assert doc["settings_meeting_goal"] == [n for n, g in doc["goals"].items() if g["pass"]]
    (row,) = doc["boards"]
    assert row["board"] == BOARD and row["scaled_domains"] == ["gpu"]
    assert (row["rounds"], row["clp_rounds"], row["samples"]) == (20, 6, 5120)
    levels = load_profile(BOARD).domain("gpu").levels_khz
    # The sweep covers every level of the scaled domain, and the levels really differ.
    assert [s[0] for s in row["sweep"]] == list(range(len(levels)))
    assert [s[1] for s in row["sweep"]] == list(levels)
    totals = [s[4] for s in row["sweep"]]
    train_only = [s[3] for s in row["sweep"]]
    assert len(set(totals)) == len(totals) and min(train_only) > 0
    times = [s[2] for s in row["sweep"]]
    assert times == sorted(times, reverse=True)
    # The oracle is no worse than any fixed level, for each energy.
    oracle = row["oracle"]
    assert oracle["total"]["energy_j"] == min(totals) and all(
        oracle["total"]["energy_j"] <= t for t in totals)
    assert totals[oracle["total"]["level"]] == oracle["total"]["energy_j"]
    assert oracle["train_only"]["energy_j"] == min(train_only)
    assert 0 < oracle["total"]["level"] < len(levels) - 1     # an inner optimum on this board
    for name, setting in row["settings"].items():
        assert setting["ratio_total"] == pytest.approx(
            setting["energy_j"] / oracle["total"]["energy_j"], abs=1e-3)
        assert setting["ratio_train_only"] == pytest.approx(
            setting["train_only_j"] / oracle["train_only"]["energy_j"], abs=1e-3)
        assert setting["time_ratio"] == pytest.approx(
            setting["time_s"] / oracle["total"]["time_s"], abs=1e-3)
        assert setting["meets_goal"] == (setting["ratio_total"] <= 1.10)
        assert (setting["why_missed"] is None) == setting["meets_goal"]
        assert setting["train_only_j"] < setting["energy_j"]
    # The paper's policy runs the CLP at the lowest level; the efficient setting at the oracle's.
    assert row["settings"]["paper"]["clp_levels"] == [0]
    assert row["settings"]["efficient"]["clp_levels"] == [oracle["total"]["level"]]


def test_figures_are_the_simulators_power_model(capsys):
    _, _, doc = _run(capsys, "--noise-scale", "0")
    (row,) = doc["boards"]
    dm = DeviceModel(DeviceSpec(board=BOARD, noise_scale=0.0), load_profile(BOARD), 0)
    top = dm.top_levels
    seconds = 5120 * dm.expected_seconds_per_sample(top)
    assert row["sweep"][-1][2] == pytest.approx(seconds, abs=1e-3)
    assert row["sweep"][-1][4] == pytest.approx(dm.train_w(top) * seconds, abs=1e-3)
    assert row["sweep"][-1][3] == pytest.approx((dm.train_w(top) - dm.idle_w) * seconds, abs=1e-3)
    assert row["utilization"] == dm.utilization


def test_schedule_splits_the_work_and_the_clp():
    bench = _load_module()
    plan = bench.schedule(1000, 256, 0.5)
    assert [n for n, _ in plan] == [256, 256, 256, 232]
    assert [c for _, c in plan] == [True, True, False, False]
    assert all(not c for _, c in bench.schedule(100, 10, 0.0))
    assert bench.boards_with_power_model()[0] == "jetson-nano"
    assert "generic-linux" not in bench.boards_with_power_model()


def test_seeds_give_each_ratio_its_spread_and_the_goal_holds_only_on_every_seed(capsys):
    _, rc, one = _run(capsys, "--seed", "3")
    bench, rc3, over = _run(capsys, "--seeds", "3", "--seed", "1")
    assert over["parameters"]["seeds"] == [1, 2, 3]
    assert over["oracle_levels_over_seeds"][BOARD]                    # a level per seed, deduplicated
    for name in bench.SETTINGS:
        spread = over["over_seeds"][name][BOARD]
        assert spread["min"] <= spread["mean"] <= spread["max"] and spread["std"] >= 0.0
        # the last seed's run alone is one of the three, so within their range
        assert spread["min"] <= one["goals"][name]["ratio_total"][BOARD] <= spread["max"]
        assert over["goals"][name]["worst"] == spread["max"]          # one board: its worst seed
        assert over["goals"][name]["pass"] == (spread["max"] <= bench.GOAL_RATIO)
    with pytest.raises(SystemExit):
        bench.main(["--seeds", "0"])
