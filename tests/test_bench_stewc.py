"""bench/bench_stewc.py at toy size: it runs and prints the promised JSON, with each cadence's total
the sum of its parts (the penalties never counted below zero)."""
import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_stewc.py"


def test_a_small_run_gives_every_share_and_consistent_totals(capsys):
    spec = importlib.util.spec_from_file_location("bench_stewc", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rc = bench.main(["--model", "mlp", "--repeats", "2", "--buffer", "64", "--fisher-every", "1", "4"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["round_median_s"] > 0
    for key in ("penalties_share", "penalties_share_as_loss_terms", "s_fdm_share_per_estimate",
                "t_fdm_share_amortized"):
        assert isinstance(out[key], float)
    cadence = out["with_statistics_by_s_fdm_cadence"]
    assert set(cadence) == {"1", "4"}
    assert cadence["4"]["s_fdm_share"] == pytest.approx(out["s_fdm_share_per_estimate"] / 4, abs=1e-4)
    for entry in cadence.values():
        want = max(out["penalties_share"], 0.0) + entry["s_fdm_share"] + out["t_fdm_share_amortized"]
        assert entry["all_share"] == pytest.approx(want, abs=2e-4)
        assert entry["goal_met"] == (entry["all_share"] <= out["goal_share"])
