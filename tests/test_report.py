"""A coordinator's run folder read back: the metrics reader, elapsed time that stays right across a
coordinator restart, the demo's summary and its plots."""
import pytest

from streamfl.coordinator.metrics import elapsed_s, read_metrics
from streamfl.errors import StreamflError
from streamfl.sim.demo import energy_by_device, summarize
from streamfl.sim.plots import plot_accuracy, plot_clock_levels


def test_elapsed_uses_wall_time_across_a_restart():
    # time_s restarts at 0 when the coordinator restarts; wall_s keeps counting.
    evals = [{"event": "eval", "time_s": 0.0, "wall_s": 1000.0},
             {"event": "eval", "time_s": 50.0, "wall_s": 1050.0},
             {"event": "eval", "time_s": 2.0, "wall_s": 1070.0}]
    assert elapsed_s(evals) == [0.0, 50.0, 70.0]


def test_elapsed_falls_back_to_monotonic_time_for_old_records():
    evals = [{"time_s": 3.0}, {"time_s": 5.5, "wall_s": 9.0}]
    assert elapsed_s(evals) == [0.0, 2.5]
    assert elapsed_s([]) == []


def test_summary_counts_updates_staleness_and_accuracy():
    metrics = [{"event": "eval", "version": 0, "accuracy": 0.2},
               {"event": "update", "device": "b", "version": 1, "staleness": 0, "aggregated": True},
               {"event": "update", "device": "a", "version": 1, "staleness": 3, "aggregated": False},
               {"event": "eval", "version": 1, "accuracy": 0.9},
               {"event": "eval", "version": 1, "accuracy": 0.8}]
    s = summarize(metrics, num_classes=4)
    assert s["final_version"] == 1 and s["updates"] == 2 and s["aggregated"] == 1
    assert s["devices"] == ["a", "b"] and s["mean_staleness"] == 1.5 and s["max_staleness"] == 3
    assert (s["initial_accuracy"], s["final_accuracy"], s["best_accuracy"]) == (0.2, 0.8, 0.9)
    assert s["chance"] == 0.25 and s["evaluations"] == 3


def test_read_metrics_skips_a_half_written_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"event": "eval", "accuracy": 0.5}\n\n{"event": "upd')
    assert read_metrics(path) == [{"event": "eval", "accuracy": 0.5}]
    assert read_metrics(tmp_path / "missing.jsonl") == []


def test_strict_read_names_file_and_line_and_keeps_chosen_events(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"event": "eval", "method": "m", "seed": 0, "time_s": 1.0}\n'
                    '{"event": "aggregate", "time_s": 1.0}\n')
    got = read_metrics(path, strict=True, events=("eval",), required=("method", "seed", "time_s"))
    assert got == [{"event": "eval", "method": "m", "seed": 0, "time_s": 1.0}]
    path.write_text('{"event": "eval", "method": "m", "seed": 0}\n')
    with pytest.raises(StreamflError, match=r"line 1: eval event with a missing or bad 'time_s'"):
        read_metrics(path, strict=True, required=("time_s",))
    path.write_text('{"event": "eval"}\n{"event": "upd')
    with pytest.raises(StreamflError, match=r"metrics\.jsonl line 2: not valid JSON"):
        read_metrics(path, strict=True)
    with pytest.raises(StreamflError, match="not found"):
        read_metrics(tmp_path / "missing.jsonl", strict=True)


def test_plot_written_for_evals_and_skipped_without(tmp_path):
    pytest.importorskip("matplotlib")
    evals = [{"event": "eval", "time_s": t, "wall_s": 100.0 + t, "version": v, "accuracy": a}
             for t, v, a in [(0.0, 0, 0.1), (5.0, 3, 0.6), (9.0, 7, 0.9)]]
    out = plot_accuracy(evals, tmp_path / "acc.png")
    assert out is not None and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_accuracy([{"event": "update"}], tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_energy_adds_up_per_device_and_clock_levels_are_plotted(tmp_path):
    pytest.importorskip("matplotlib")
    updates = [{"event": "update", "device": d, "time_s": t, "wall_s": 50.0 + t, "energy_j": j,
                "clock_levels": lv}
               for d, t, j, lv in [("a", 0.0, 1.5, {"gpu": 0, "cpu0": 3}), ("b", 1.0, None, {"cpu0": 0}),
                                   ("a", 2.0, 2.0, {"gpu": 1, "cpu0": 3}), ("b", 3.0, 0.25, {"cpu0": 1})]]
    assert energy_by_device(updates + [{"event": "eval", "energy_j": 9.0}]) == {"a": 3.5, "b": 0.25}
    out = plot_clock_levels(updates, tmp_path / "clocks.png", boards={"a": "jetson-nano"})
    assert out is not None and out.read_bytes()[:4] == b"\x89PNG"
    assert plot_clock_levels([{"event": "update", "device": "a"}], tmp_path / "none.png") is None
