"""bench/load.py at toy size: a real coordinator and paho agents over mosquitto lose no update, and
each board receives about one model per round it starts."""
import json
import shutil
import subprocess
import sys

import pytest

from bench_scripts import BENCH_DIR, load_bench

BENCH = BENCH_DIR / "load.py"


def test_loss_tag_names_an_update_exactly_through_json():
    load = load_bench("load")
    for seq in (0, 1, 7, 12345):
        assert load.seq_of(json.loads(json.dumps(load.loss_tag(seq)))) == seq
    assert load.seq_of(0.25) is None
    assert load.seq_of(load.loss_tag(3) + 1e-9) is None


@pytest.mark.skipif(shutil.which("mosquitto") is None, reason="needs mosquitto")
def test_every_acknowledged_update_is_aggregated_and_boards_fetch_one_model_per_round():
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--agents", "8", "--procs", "2", "--duration-s", "12",
         "--update-interval-s", "2", "--model", "mlp", "--hidden", "8", "--warmup-s", "2",
         "--drain-s", "20", "--settle-s", "20"],
        capture_output=True, text=True, timeout=180)
    assert proc.stdout.strip(), "no JSON printed (exit %d):\n%s" % (proc.returncode, proc.stderr[-3000:])
    report = json.loads(proc.stdout)
    assert report["sent"] > 0
    assert report["sent"] == report["aggregated"], report
    assert report["lost"] == 0 and report["unacked_at_end"] == 0, report
    assert report["latency_s"]["n"] == report["aggregated"]
    assert report["coordinator"]["final_exit_code"] == 0
    # The boards' downlink: about one model per round started, counted from real messages.
    down = report["downlink"]
    assert down["mode"] == "fetch" and down["rounds_started"] >= report["sent"] > 0, down
    assert down["models_per_round_started"] <= down["goal_models_per_round"] and down["pass"], down
    assert down["bytes_per_board_per_round"] > 0 and report["broker"]["model_bytes_out_per_s"] > 0
