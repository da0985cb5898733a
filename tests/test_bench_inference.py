"""bench/bench_inference.py at smoke size: it runs and prints every promised figure, finite and above
zero, with the goal and the board estimates consistent with them (no timed asserts)."""
import json
import math

import pytest

from bench_scripts import load_bench


def _finite_positive(value):
    return isinstance(value, float) and math.isfinite(value) and value > 0


def test_a_quick_run_gives_every_figure_of_the_default_model_and_its_board_estimates(capsys):
    rc = load_bench("bench_inference").main(["--quick"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["benchmark"] == "inference"
    assert set(out["families"]) == {"lstm"}
    lstm = out["families"]["lstm"]
    # Through the agent's real Predictor: every offered window predicted, none skipped or dropped.
    assert out["path"] == lstm["path"] == "predictor"
    counters = lstm["counters"]
    assert counters["predicted"] == counters["offered"] > 20
    assert counters["skipped_rate"] == counters["dropped"] == counters["publish_errors"] == 0
    assert lstm["default"] is True and lstm["torch_threads"] == 1 and lstm["window"] == [50, 6]
    for key in ("p50", "p99", "mean"):
        assert _finite_positive(lstm["ms_per_window"][key])
    assert lstm["ms_per_window"]["p99"] >= lstm["ms_per_window"]["p50"]
    rss = lstm["rss_mib"]
    for key in ("before_torch", "after_import", "after_warmup", "added"):
        assert _finite_positive(rss[key])
    assert rss["added"] == pytest.approx(rss["after_warmup"] - rss["before_torch"])
    assert set(lstm["cpu_share"]) == {"1", "10"}
    for rate, entry in lstm["cpu_share"].items():
        assert entry["rate_hz"] == float(rate) and entry["windows"] >= 1
        assert _finite_positive(entry["share"])
        assert entry["wall_s"] >= entry["windows"] / entry["rate_hz"] - 1e-3
    goal = out["goal"]
    assert goal["model"] == "lstm" and goal["cpu_share_below"] == 0.01
    assert goal["met_here"] == (goal["share_here"] < 0.01)
    boards = out["boards"]["estimates"]
    pi4 = boards["raspberry-pi-4"]
    if pi4.get("estimate", True) is None:  # a machine that says nothing of its clock
        pytest.skip("no CPU clock readable here: %s" % pi4["why_not"])
    assert pi4["top_cpu_mhz"] == 1500.0
    assert pi4["slowdown"] == pytest.approx(pi4["slowdown_clock_only"] * 2.0)
    est = pi4["families"]["lstm"]
    assert est["ms_p50"] == pytest.approx(lstm["ms_per_window"]["p50"] * pi4["slowdown"])
    assert est["cpu_share"]["1"] == pytest.approx(lstm["cpu_share"]["1"]["share"] * pi4["slowdown"])
    assert pi4["goal_met_estimate"] == (est["cpu_share"]["1"] < 0.01)
    assert goal["met_on_raspberry_pi_4_estimate"] == pi4["goal_met_estimate"]
    assert pi4["per_clock_slowdown_at_goal"] * pi4["slowdown_clock_only"] * lstm["cpu_share"]["1"]["share"] \
        == pytest.approx(0.01)


def test_the_forward_path_measures_the_inline_forward_of_a_family(capsys):
    rc = load_bench("bench_inference").main(["--quick", "--path", "forward", "--families", "mlp"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["path"] == "forward" and set(out["families"]) == {"mlp"}
    mlp = out["families"]["mlp"]
    assert mlp["default"] is False and out["goal"]["model"] is None and "met_here" not in out["goal"]
    assert mlp["counters"]["predicted"] > 20
    assert _finite_positive(mlp["ms_per_window"]["p50"])


@pytest.mark.parametrize("argv", [["--rate-seconds", "0"], ["--per-clock-slowdown", "nan"],
                                  ["--families", "resnet"]])
def test_bad_options_are_refused_with_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        load_bench("bench_inference").main(argv)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err
