"""bench/bench_scheduler.py at toy size: it runs, prints the promised JSON, and its selection fits
the channel it allocated."""
import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_scheduler.py"


def test_a_small_fleet_gives_the_json_and_a_selection_within_the_band(capsys):
    spec = importlib.util.spec_from_file_location("bench_scheduler", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rc = bench.main(["--devices", "300", "--classes", "5", "--repeats", "2", "--long-steps", "5"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["met"] is True
    assert out["devices"] == 300 and out["classes"] == 5
    assert 1 <= out["selected"] <= out["feasible_devices"] <= 300
    assert 0 < out["bandwidth_used_hz"] <= 20e6
