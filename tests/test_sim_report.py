"""Simulator report: plots and an HTML page from a synthetic run directory, and clear input errors."""
import json

import pytest

from streamfl.errors import StreamflError
from streamfl.sim.plots import band_over_seeds
from streamfl.sim.report_html import render_report
from streamfl.sim.summary import method_summary, run_figures
from streamfl.sim.tables import fmt_value, markdown_table, methods_table

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ("accuracy_vs_time.png", "accuracy_vs_rounds.png", "accuracy_vs_energy.png", "clock_levels.png")


def _events(method, seed, speed, clp=False):
    """Evals every 10 s and one update per device per 10 s, accuracy rising at ``speed``."""
    out = []
    for step in range(11):
        t = 10.0 * step
        acc = min(0.95, 0.1 + speed * step + 0.01 * seed)
        out.append({"event": "eval", "method": method, "seed": seed, "time_s": t, "version": step,
                    "accuracy": acc, "accuracy_seen": min(1.0, acc + 0.05), "loss": 1.0 - acc,
                    "energy_j": 50.0 * step * (1 + seed * 0.1), "period": None})
        for dev in range(3):
            clocks = {"cpu0": step % 3} if dev == 2 else {"cpu0": 1, "gpu": (step + dev) % 4}
            out.append({"event": "update", "method": method, "seed": seed, "time_s": t + 1 + dev,
                        "device": "dev%d" % dev, "base_version": step, "version": step + 1,
                        "staleness": dev, "aggregated": True, "num_samples": 32, "energy_j": 4.0,
                        "clock_levels": clocks, "train_s": 0.5, "upload_s": 0.1})
        if clp:
            out.append({"event": "clp", "method": method, "seed": seed, "time_s": t, "version": step,
                        "fisher_global": 10.0 / (1 + step), "in_clp": 2 <= step <= 5})
    return out


def _method(acc, acc_std, energy, energy_std, t2a, seeds=(1, 2), extra=None):
    """A summary entry with per-seed runs whose spread matches the given std."""
    entry = {"final_accuracy": acc, "final_accuracy_std": acc_std, "energy_j": energy,
             "energy_j_std": energy_std, "time_to_accuracy_s": t2a,
             "runs": [{"seed": s, "final_accuracy": acc + (acc_std if i else -acc_std),
                       "energy_j": energy, "time_to_accuracy_s": t2a} for i, s in enumerate(seeds)]}
    entry.update(extra or {})
    return entry


def _write_run(run_dir, methods, clp=False, seeds=(1, 2)):
    """A run directory as the simulator writes it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    events = []
    for i, name in enumerate(methods):
        for seed in seeds:
            events += _events(name, seed, 0.05 + 0.03 * i, clp=clp)
    events.sort(key=lambda e: e["time_s"])
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    summary = {"scenario": "har-extreme", "duration_s": 100.0, "seeds": list(seeds),
               "thresholds": [0.5, 0.9], "methods": methods}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return run_dir


def _two_methods(seeds=(1, 2)):
    return {"fedasync": _method(0.8123, 0.0101, 12345.6, 234.5, {"0.5": 40.0, "0.9": None}, seeds,
                                extra={"mean_staleness": 1.25, "mean_staleness_std": 0.5, "note": "x"}),
            "adaclp": _method(0.9, 0.02, 9000.0, 100.0, {"0.5": 20.0, "0.9": 90.0}, seeds)}


def test_report_writes_plots_and_a_page_with_mean_and_spread(tmp_path):
    run = _write_run(tmp_path / "run", _two_methods())
    out = render_report(run)
    assert out == run / "report.html"
    for name in PLOTS:
        assert (run / name).read_bytes()[:8] == PNG_MAGIC
    assert not (run / "clp.png").exists()
    page = out.read_text(encoding="utf-8")
    assert "har-extreme" in page and "fedasync" in page and "adaclp" in page
    assert "0.812 ± 0.010" in page and "12346 ± 234" in page and "0.900 ± 0.020" in page
    assert "not reached" in page and "90.00" in page
    assert "mean_staleness" in page and "1.25 ± 0.50" in page and ">note<" not in page
    for name in PLOTS:
        assert page.count('<img src="%s"' % name) == 1
    assert page.count("<img ") == 4 and "How to read" in page


def _energy_split(method, train, idle, train_std, idle_std):
    """``method`` with training and idle energy (mean, std and per run) as the summary gives them."""
    method.update(train_energy_j=train, train_energy_j_std=train_std, idle_energy_j=idle,
                  idle_energy_j_std=idle_std)
    for run in method["runs"]:
        run.update(train_energy_j=train, idle_energy_j=idle)
    return method


def test_tables_show_training_and_idle_energy_beside_the_total(tmp_path):
    methods = _two_methods()
    _energy_split(methods["fedasync"], 9345.6, 3000.0, 200.0, 50.0)
    _energy_split(methods["adaclp"], 6000.0, 3000.0, 80.0, 40.0)
    summary = {"seeds": [1, 2], "methods": methods}
    table = methods_table(summary)
    header = table.split("</thead>")[0]
    assert ("<th>fleet energy (J)</th><th>training energy (J)</th><th>idle energy (J)</th>"
            in header)
    assert "9346 ± 200" in table and "3000 ± 50" in table and "6000 ± 80" in table
    assert "train_energy_j" not in table and "idle_energy_j" not in table   # not again as extras
    lines = markdown_table(summary).splitlines()
    assert lines[0].startswith("| method | final accuracy | mean accuracy over the run | "
                               "energy (kJ) | training energy (kJ) | idle energy (kJ) |")
    row = next(line for line in lines if line.startswith("| `fedasync`"))
    assert "| 12.3 ± 0.2 | 9.3 ± 0.2 | 3.0 ± 0.1 |" in row
    # A run from before the split (no such figures) shows dashes, not an error.
    del methods["adaclp"]["train_energy_j"], methods["adaclp"]["idle_energy_j"]
    assert "| – | – |" in next(line for line in markdown_table(summary).splitlines()
                                 if line.startswith("| `adaclp`"))
    page = render_report(_write_run(tmp_path / "run", _two_methods())).read_text(encoding="utf-8")
    assert "training energy (J)" in page


def test_summary_carries_training_and_idle_energy_per_run_and_method():
    def evals(train, idle):
        return [{"event": "eval", "time_s": 0.0, "accuracy": 0.1, "energy_j": 0.0,
                 "train_energy_j": 0.0, "idle_energy_j": 0.0, "version": 0},
                {"event": "eval", "time_s": 10.0, "accuracy": 0.5, "energy_j": train + idle,
                 "train_energy_j": train, "idle_energy_j": idle, "version": 3}]
    totals = {"dev-000": {"train_s": 1.0, "idle_s": 9.0, "round_latency_s": 0.5, "energy_j": 5.0}}
    runs = [run_figures(evals(t, i), [], totals, [0.5], 10.0) for t, i in ((30.0, 10.0), (50.0, 12.0))]
    assert [(r["train_energy_j"], r["idle_energy_j"], r["energy_j"]) for r in runs] == [
        (30.0, 10.0, 40.0), (50.0, 12.0, 62.0)]
    summary = method_summary(runs, [0.5])
    assert (summary["train_energy_j"], summary["train_energy_j_std"]) == (40.0, 10.0)
    assert (summary["idle_energy_j"], summary["idle_energy_j_std"]) == (11.0, 1.0)
    assert summary["train_energy_j"] + summary["idle_energy_j"] == summary["energy_j"]
    # Events from before the split: the figures are None and the summary leaves them out.
    old = [dict(e) for e in evals(30.0, 10.0)]
    for e in old:
        del e["train_energy_j"], e["idle_energy_j"]
    figures = run_figures(old, [], totals, [0.5], 10.0)
    assert figures["train_energy_j"] is None and "train_energy_j" not in method_summary([figures], [0.5])


def test_clp_plot_appears_with_clp_events_and_out_dir_is_honoured(tmp_path):
    run = _write_run(tmp_path / "run", _two_methods(), clp=True)
    out = render_report(run, tmp_path / "out" / "nested")
    assert out.parent == tmp_path / "out" / "nested"
    assert (out.parent / "clp.png").read_bytes()[:8] == PNG_MAGIC
    assert '<img src="clp.png"' in out.read_text(encoding="utf-8")
    assert not (run / "report.html").exists()


def test_time_to_accuracy_counts_the_seeds_that_reached_it(tmp_path):
    methods = _two_methods()
    methods["adaclp"]["runs"][1]["time_to_accuracy_s"] = {"0.5": 30.0, "0.9": None}
    methods["adaclp"]["runs"][0]["time_to_accuracy_s"] = {"0.5": 10.0, "0.9": 90.0}
    page = render_report(_write_run(tmp_path / "run", methods)).read_text(encoding="utf-8")
    assert "20.00 ± 10.00" in page and "90.00 (1/2 seeds)" in page


def test_method_names_are_escaped(tmp_path):
    methods = {"fed<script>": _method(0.5, 0.1, 10.0, 1.0, {"0.5": 3.0})}
    page = render_report(_write_run(tmp_path / "run", methods)).read_text(encoding="utf-8")
    assert "fed<script>" not in page and "fed&lt;script&gt;" in page


def test_single_seed_and_a_method_without_evals(tmp_path):
    methods = _two_methods(seeds=(7,))
    methods["idle"] = {"final_accuracy": None, "energy_j": 0.0, "time_to_accuracy_s": {"0.5": None},
                       "runs": []}
    run = _write_run(tmp_path / "run", {k: v for k, v in methods.items() if k != "idle"}, seeds=(7,))
    summary = json.loads((run / "summary.json").read_text())
    summary["methods"]["idle"] = methods["idle"]
    (run / "summary.json").write_text(json.dumps(summary))
    page = render_report(run).read_text(encoding="utf-8")
    assert "0.812<" in page and "± " not in page.split("<table>")[1].split("</table>")[0]
    assert "idle" in page
    for name in PLOTS:
        assert (run / name).exists()


def test_updates_without_clock_levels_give_no_clock_plot(tmp_path):
    run = _write_run(tmp_path / "run", _two_methods())
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for rec in lines:
        rec.pop("clock_levels", None)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    page = render_report(run).read_text(encoding="utf-8")
    assert not (run / "clock_levels.png").exists() and "clock_levels.png" not in page
    assert (run / "accuracy_vs_time.png").exists()


def test_many_devices_are_capped_and_said_so(tmp_path, caplog):
    run = _write_run(tmp_path / "run", {"m": _method(0.5, 0.0, 1.0, 0.0, {})}, seeds=(1,))
    extra = [{"event": "update", "method": "m", "seed": 1, "time_s": float(d), "device": "d%d" % d,
              "clock_levels": {"gpu": d % 3}} for d in range(20)]
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write("".join(json.dumps(e) + "\n" for e in extra))
    render_report(run)
    assert (run / "clock_levels.png").read_bytes()[:8] == PNG_MAGIC
    assert "clock levels of m: 12 of 23 devices shown" in caplog.text


def test_malformed_metrics_line_names_file_and_line(tmp_path):
    run = _write_run(tmp_path / "run", _two_methods())
    text = (run / "metrics.jsonl").read_text().splitlines()
    text[2] = '{"event": "eval", "method": '
    (run / "metrics.jsonl").write_text("\n".join(text) + "\n")
    with pytest.raises(StreamflError, match=r"metrics\.jsonl line 3"):
        render_report(run)
    text[2] = json.dumps({"event": "eval", "method": "m", "seed": 1, "time_s": "soon"})
    (run / "metrics.jsonl").write_text("\n".join(text) + "\n")
    with pytest.raises(StreamflError, match=r"metrics\.jsonl line 3.*time_s"):
        render_report(run)


def test_missing_or_malformed_summary_is_a_clear_error(tmp_path):
    run = _write_run(tmp_path / "run", _two_methods())
    (run / "summary.json").write_text('{"methods": {\n  "a": 1,,\n}')
    with pytest.raises(StreamflError, match=r"summary\.json line 2"):
        render_report(run)
    (run / "summary.json").unlink()
    with pytest.raises(StreamflError, match=r"summary\.json: not found"):
        render_report(run)
    (run / "metrics.jsonl").unlink()
    with pytest.raises(StreamflError, match=r"metrics\.jsonl: not found"):
        render_report(run)


def test_band_counts_only_seeds_covering_each_point():
    grid, mean, lo, hi, count = band_over_seeds([([0, 10], [0.0, 1.0]), ([0, 5, 5], [0.2, 0.1, 0.4])],
                                                points=3)
    assert list(grid) == [0.0, 5.0, 10.0]
    assert list(count) == [2, 2, 1]
    assert mean[0] == pytest.approx(0.1) and mean[1] == pytest.approx(0.45) and mean[2] == 1.0
    assert (lo[1], hi[1]) == (0.4, 0.5)
    assert band_over_seeds([([], [])]) is None


def test_value_format_follows_magnitude():
    assert fmt_value(0.8123, 0.0101) == "0.812 ± 0.010"
    assert fmt_value(45.678, 1.2) == "45.68 ± 1.20"
    assert fmt_value(12345.6) == "12346" and fmt_value(None) == "–"
    assert fmt_value(0.0) == "0.000"
