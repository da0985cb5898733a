"""``streamfl demo`` end to end: a real broker, coordinator and agent processes, and the run folder
it leaves behind (metrics.jsonl, summary.json, accuracy.png) agreeing with what it printed."""
import json
import re
import subprocess
import sys

import pytest


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_short_demo_run_leaves_metrics_summary_and_plot(tmp_path):
    import matplotlib.image

    from streamfl.coordinator.metrics import read_metrics

    run_dir = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "streamfl.cli", "demo", "--agents", "2", "--duration", "25",
         "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=150)
    out = proc.stdout.decode(errors="replace")

    def logs():
        tails = []
        for log in sorted(run_dir.glob("*.log")):
            tails.append("---- %s ----\n%s" % (log.name, log.read_text(errors="replace")[-1500:]))
        return "\n".join(["---- demo output ----", out[-3000:]] + tails)

    assert proc.returncode == 0, logs()
    assert "== streamfl demo summary ==" in out, logs()
    assert "all processes exited cleanly: yes" in out, logs()

    metrics = read_metrics(run_dir / "metrics.jsonl")
    updates = [m for m in metrics if m["event"] == "update"]
    evals = [m for m in metrics if m["event"] == "eval"]
    assert {u["device"] for u in updates} == {"demo-01", "demo-02"}, logs()
    assert len(evals) >= 2, logs()

    run_summary = json.loads((run_dir / "summary.json").read_text())
    summary = run_summary["demo"]
    assert summary["ok"] is True and summary["agents"] == 2, summary
    assert summary["final_accuracy"] is not None, summary
    assert summary["final_version"] > 0, summary
    assert summary["final_version"] == max(m["version"] for m in metrics if "version" in m), summary
    assert summary["final_accuracy"] == evals[-1]["accuracy"], summary
    assert summary["updates"] == len(updates) and summary["devices"] == ["demo-01", "demo-02"]
    # What it printed is what it wrote.
    printed = re.search(r"versions: (\d+)\s+updates received: (\d+)", out)
    assert printed and int(printed.group(1)) == summary["final_version"], out[-2000:]
    assert int(printed.group(2)) == summary["updates"], out[-2000:]
    assert "end %.3f" % summary["final_accuracy"] in out, out[-2000:]

    png = run_dir / "accuracy.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(str(png))
    assert image.ndim == 3 and image.shape[0] >= 200 and image.shape[1] >= 300, image.shape
    # A drawn plot, not an empty canvas: axes, text and the accuracy line give many colours.
    assert len(set(map(tuple, image.reshape(-1, image.shape[2])[::7].round(2).tolist()))) > 20
    assert "plot: %s" % png in out, out[-2000:]
    # Simulated boards: each device reports energy, and the clock plot shows their levels.
    assert summary["boards"] == {"demo-01": "jetson-orin-nano", "demo-02": "raspberry-pi-4"}
    assert set(summary["energy_j"]) == {"demo-01", "demo-02"}
    assert all(j > 0 for j in summary["energy_j"].values()), summary["energy_j"]
    assert "demo-02 (raspberry-pi-4) %.1f J" % summary["energy_j"]["demo-02"] in out, out[-2000:]
    assert all(u["clock_levels"] for u in updates)
    # Every board predicts on its live windows; the demo prints the newest beside the accuracy.
    assert summary["predictions_received"] > 0 and set(summary["latest_predictions"]) == {"demo-01", "demo-02"}
    assert "live predictions (%d received): demo-01 class-" % summary["predictions_received"] in out, out[-2000:]
    # Every update received is accounted for by its fate, and the coordinator's own summary of the
    # run is there beside the demo's: streamfl report reads the folder.
    assert sum(summary["updates_by_outcome"].values()) == summary["updates"], summary
    (method, entry), = run_summary["methods"].items()
    assert method == "fedasync" and entry["runs"][0]["updates"] == summary["updates"], run_summary
    report = subprocess.run([sys.executable, "-m", "streamfl.cli", "report", str(run_dir)],
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0 and (run_dir / "report.html").is_file(), report.stderr
    assert (run_dir / "clocks.png").read_bytes()[:4] == b"\x89PNG"


def test_a_full_length_demo_that_ends_near_chance_is_not_ok():
    from streamfl.sim.demo import learned
    assert learned({"final_accuracy": 0.9, "chance": 1 / 6}, 120.0)
    assert not learned({"final_accuracy": 0.2, "chance": 1 / 6}, 120.0)
    assert not learned({"final_accuracy": None, "chance": 1 / 6}, 120.0)
    assert learned({"final_accuracy": 0.2, "chance": 1 / 6}, 25.0)   # a smoke run only must evaluate
