"""bench/bench_parallel_rounds.py at toy size: both runs of a workload in child processes, their
figures identical, the rounds and memory counted (the timing itself is the benchmark's, never
asserted here)."""
import importlib

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
