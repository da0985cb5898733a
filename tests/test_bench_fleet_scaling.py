"""bench/bench_fleet_scaling.py at toy size: its fleet's Hellos and updates go through the real core
and every update is admitted (the timing itself is the benchmark's, never asserted here)."""
from bench_scripts import load_bench


import pytest


@pytest.mark.parametrize("strategy", ["fedasync", "fedavg"])
def test_a_small_fleet_runs_through_the_core(strategy):
    module = load_bench("bench_fleet_scaling")
    module.MEASURED_UPDATES = 40
    assert module.per_update_us(30, strategy=strategy) > 0
