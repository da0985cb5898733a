"""bench/bench_parallel_rounds.py at toy size: both runs of a workload in child processes, their
figures identical, the rounds and memory counted (the timing itself is the benchmark's, never
asserted here)."""
import importlib

import pytest

from bench_scripts import BENCH_DIR


def test_a_toy_workload_runs_both_ways_with_identical_figures(monkeypatch):
    # Imported by its own name from bench/ (on the path the spawned children inherit), so that
    # they can import the functions they run.
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    module = importlib.import_module("bench_parallel_rounds")
    report = module.compare("fedavg", module.fedavg_values(devices=4, rounds=2), workers=1)
    assert report["identical_figures"]
    serial, parallel = report["serial"], report["parallel"]
    assert serial["rounds"] == parallel["rounds"] >= 4 and serial["overlapped"] == 0
    assert 0 < parallel["overlapped"] <= parallel["rounds"]
    assert parallel["peak_tree_pss_mb"] > 0 and parallel["peak_tree_rss_mb"] >= parallel["peak_tree_pss_mb"]


def test_repeats_take_turns_and_quote_the_least_time_of_each_kind(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    module = importlib.import_module("bench_parallel_rounds")
    report = module.compare("fedavg", module.fedavg_values(devices=4, rounds=2), workers=1,
                            repeats=2, floor=True)
    assert report["identical_figures"] and len(report["repeats"]) == 2
    rows = report["repeats"]
    assert report["serial"]["wall_s"] == min(r["serial_wall_s"] for r in rows)
    assert report["parallel"]["wall_s"] == min(r["parallel_wall_s"] for r in rows)
    assert report["bare_floor_s"] == min(r["bare_floor_s"] for r in rows) > 0
    assert min(r["speedup"] for r in rows) <= report["speedup_median"] <= max(r["speedup"] for r in rows)
    # the quoted ratio is of the unrounded times
    assert report["floor_ratio"] == pytest.approx(report["parallel"]["wall_s"] / report["bare_floor_s"],
                                                  abs=0.005)


def test_no_repeats_is_refused(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    module = importlib.import_module("bench_parallel_rounds")
    with pytest.raises(SystemExit, match="at least 1"):
        module.compare("fedavg", module.fedavg_values(devices=4, rounds=2), workers=1, repeats=0)
