"""Per-frame rounds to a target (FedTeddi's figure): the summary's counts and the Markdown table."""
import json

import pytest

from streamfl.cli import main
from streamfl.errors import StreamflError
from streamfl.methods.schedule.report import (
    frame_rounds, frames_for_run, frames_table, grid_for_runs, grid_table, overview_table,
)
from streamfl.sim.summary import period_figures, rounds_to


def _evals(points):
    return [{"time_s": t, "version": v, "accuracy": a, "accuracy_seen": a, "period": p}
            for t, v, a, p in points]


def test_rounds_count_versions_from_the_frames_first_evaluation():
    evals = _evals([(0, 0, 0.1, 0), (5, 4, 0.6, 0), (10, 9, 0.5, 1), (15, 13, 0.6, 1), (20, 20, 0.8, 1)])
    assert rounds_to(evals[2:], 0.6) == 4 and rounds_to(evals[2:], 0.9) is None
    frames = period_figures(evals, 0.6, 5.0, (0.6, 0.7))
    assert [f["rounds_to_seen"] for f in frames] == [{"0.6": 4, "0.7": None}, {"0.6": 4, "0.7": 11}]
    assert [(f["evaluations"], f["rounds"]) for f in frames] == [(2, 4), (3, 11)]


def _summary(rounds_by_method, span=30):
    def run(rounds):
        return {"periods": [{"period": 0, "rounds_to_seen": {"0.7": 1}, "evaluations": 5, "rounds": span},
                            {"period": 1, "rounds_to_seen": {"0.7": rounds}, "evaluations": 5, "rounds": span},
                            {"period": 2, "rounds_to_seen": {}, "evaluations": 1, "rounds": 0}],
                "train_energy_j": 100.0, "versions": 50}
    return {"methods": {m: {"runs": [run(r) for r in rs], "devices_per_round": 4.0,
                            "final_accuracy": 0.8, "final_accuracy_std": 0.01}
                        for m, rs in rounds_by_method.items()}}


def test_the_table_compares_rounds_and_bounds_a_target_never_reached():
    summary = _summary({"random": [20, 20], "fedteddi": [10, 12], "slow": [None, 10]})
    assert frame_rounds(summary["methods"]["slow"], 1, "0.7") == {
        "rounds": 10.0, "rounds_std": 0.0, "censored": 20.0, "reached": 1, "seeds": 2}
    table = frames_table(summary, ["0.7"], "random")
    lines = {line.split(" | ")[0]: line for line in table.splitlines()}
    assert "frame 2" not in table and "frame 0" not in table  # one evaluation; before the first new data
    # The change of the pooled rounds, and the spread of each seed's own change (-50%, -40%).
    assert "11.0 ± 1.0" in lines["| `fedteddi`"] and "| -45% ± 5 |" in lines["| `fedteddi`"]
    # A seed that never reached the target counts at the frame's 30 rounds: +50% and -50%.
    assert "10.0 ± 0.0 (1/2)" in lines["| `slow`"] and "| ~+0% ± 50 |" in lines["| `slow`"]
    assert "2.0" in lines["| `random`"]  # training joules per round
    only = frames_table(dict(summary, duration_s=100.0), ["0.7"], "random", methods=["fedteddi"])
    rows = [line for line in only.splitlines() if line.startswith("| `")]
    assert len(rows) == 1 and rows[0].startswith("| `fedteddi`") and "-45%" in rows[0]


def test_a_run_without_frames_is_an_error(tmp_path):
    with pytest.raises(StreamflError):
        frames_table({"methods": {"a": {"runs": [{"periods": []}]}}}, ["0.7"])
    (tmp_path / "summary.json").write_text(json.dumps(_summary({"random": [20]})))
    assert main(["report", str(tmp_path), "--section", "frames", "--option", "0.7"]) == 0
    # The flag of before sections were the methods' own still works.
    assert main(["report", str(tmp_path), "--frames", "0.7"]) == 0
    assert main(["report", str(tmp_path), "--section", "frames"]) != 0  # targets needed


def test_the_grid_sets_runs_side_by_side_and_marks_a_missing_method(tmp_path):
    fast = _summary({"random": [20, 20], "fedteddi": [10, 12]})
    slow = _summary({"random": [20, 20], "fedteddi": [None, 10], "fedcgd": [25, 25]})
    table = grid_table([("T 0.8", fast), ("T 1.2", slow)], ["0.7"], "random")
    header, _, *rows = table.splitlines()
    assert header.count("vs `random`") == 2 and "T 0.8: to 0.7 (rounds)" in header
    lines = {line.split(" | ")[0]: line.split(" | ") for line in rows}
    assert lines["| `fedteddi`"][1:4] == ["11.0 ± 1.0", "-45% ± 5", "4.0"]
    assert lines["| `fedteddi`"][4:6] == ["10.0 ± 0.0 (1/2)", "~+0% ± 50"]
    assert lines["| `fedcgd`"][1:4] == ["–", "–", "–"] and lines["| `fedcgd`"][5] == "+25% ± 0"
    for name, summary in (("a", fast), ("b", slow)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--section", "frames",
                 "--option", "0.7", "--reference", "random", "--methods", "fedteddi,random"]) == 0
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--markdown"]) != 0
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--section", "frames",
                 "--option", "0.7", "--labels", "only one"]) != 0
    grid = grid_for_runs([tmp_path / "a", tmp_path / "b"], ["0.7"], labels=["T 0.8", "T 1.2"])
    assert "| T 0.8: to 0.7 (rounds) |" in grid and "T 1.2: vs `random`" in grid


def test_the_overview_keeps_each_settings_change_and_their_mean(tmp_path):
    a = _summary({"random": [20, 20], "fedteddi": [10, 12], "fedcgd": [30, 30]})
    b = _summary({"random": [20, 20], "fedteddi": [None, 10]})
    table = overview_table([("digits", a, ["0.7"]), ("watch", b, ["0.7"])], "random")
    lines = {line.split(" | ")[0]: line.split(" | ") for line in table.splitlines()[2:]}
    # Each setting's change with its spread over seeds; the mean over the settings (-22.5, to even).
    assert lines["| `fedteddi`"][1:] == ["-45% ± 5", "~+0% ± 50", "~-22% |"]
    assert lines["| `fedcgd`"][1:] == ["+50% ± 0", "–", "+50% |"]
    for name, summary in (("a", a), ("b", b)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    assert main(["report", *dirs, "--section", "frames", "--option", "0.7;0.7", "--overview",
                 "--reference", "random"]) == 0
    assert main(["report", *dirs, "--section", "frames", "--option", "0.7;0.7;0.7", "--overview"]) != 0
    assert main(["report", *dirs, "--section", "frames", "--option", "0.7;0.7"]) != 0  # per-folder targets: overview only


def test_seeds_pair_by_their_number_and_one_seed_has_no_spread():
    summary = _summary({"random": [20, 10], "fedteddi": [10, 10]})
    runs = summary["methods"]["fedteddi"]["runs"]
    runs[0]["seed"], runs[1]["seed"] = 1, 0                   # listed in another order
    for k, run in enumerate(summary["methods"]["random"]["runs"]):
        run["seed"] = k
    row = [l for l in frames_table(summary, ["0.7"]).splitlines() if l.startswith("| `fedteddi`")][0]
    # seed 0: 10 vs 20 (-50%), seed 1: 10 vs 10 (+0%): spread 25; unpaired, it would be 0.
    assert "| -33% ± 25 |" in row
    one = _summary({"random": [20], "fedteddi": [10]})
    row = [l for l in frames_table(one, ["0.7"]).splitlines() if l.startswith("| `fedteddi`")][0]
    assert "| -50% |" in row


def test_the_table_of_a_run_folder_gives_eq17_sigma_and_L_of_the_methods_that_measure_them(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps(_summary({"random": [20], "fedteddi": [10],
                                                                 "fill": [10]})))
    reports = {"event": "schedule", "sigma_from": "reports"}
    lines = [dict(reports, method="fedteddi", frame=0, sigma=9.0, L_mean=9.0),
             dict(reports, method="fedteddi", frame=1, sigma=1.0, L_mean=2.0),
             dict(reports, method="fedteddi", frame=1, sigma=2.0, L_mean=4.0),
             dict(reports, method="fedteddi", frame=1, sigma=1.0, L_mean=None),   # not asked for
             dict(reports, method="fedteddi", frame=1, sigma=9.0, L_mean=9.0, sigma_from="default"),
             dict(reports, method="random", frame=1, sigma=1.0, L_mean=None),
             dict(reports, method="fill", frame=1, sigma=1e9, L_mean=3.0, sigma_from="set"),
             {"event": "eval", "method": "fedteddi", "frame": 1, "sigma": 5.0, "L_mean": 5.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    table = frames_for_run(tmp_path, ["0.7"])
    rows = {l.split(" | ")[0]: l for l in table.splitlines()}
    assert "sigma / L (eq. 17)" in table
    assert rows["| `fedteddi`"].endswith("| 1.50 / 3.00 |")    # frame 0 and other events left out
    assert rows["| `random`"].endswith("| – |")                 # it measures no L
    assert rows["| `fill`"].endswith("| – |")                   # its sigma is set, not measured
