"""``streamfl report --section periods``: ST-EWC's metrics table and plot from a domain-incremental run."""
import json

import pytest

from streamfl.errors import StreamflError
from streamfl.methods.stewc.report import periods_for_run, periods_table
from streamfl.sim.summary import continual_figures


def _evals(forget):
    """Evaluations of a 3-period run: each period learned to 0.9, earlier ones decaying by ``forget``."""
    out = []
    for t in range(3):
        for k in range(2):
            acc = [0.9 - forget * (t - p) if p <= t else 0.1 for p in range(3)]
            out.append({"event": "eval", "time_s": 10.0 * (2 * t + k), "period": t, "period_accuracy": acc})
    return out


def test_continual_figures_are_the_papers_three_metrics():
    fig = continual_figures(_evals(0.2))
    assert fig["period1_accuracy"] == pytest.approx(0.5)                 # 0.9 - 2 * 0.2
    assert fig["overall_accuracy"] == pytest.approx((0.5 + 0.7 + 0.9) / 3)
    # eq. 15 at each period's end: mean over the periods seen so far.
    assert fig["average_accuracy_by_period"] == pytest.approx([0.9, 0.8, 0.7])
    assert fig["average_accuracy"] == pytest.approx(0.8)
    assert continual_figures([{"event": "eval", "time_s": 0.0}]) is None


def _summary(tmp_path):
    methods = {}
    for name, forget in (("fedavg", 0.3), ("stewc", 0.1)):
        runs = [continual_figures(_evals(forget)) for _ in range(2)]
        entry = {"seeds": 2, "runs": runs}
        for key in ("period1_accuracy", "average_accuracy", "overall_accuracy", "mean_overall_accuracy"):
            entry[key], entry[key + "_std"] = runs[0][key], 0.0
        methods[name] = entry
    (tmp_path / "summary.json").write_text(json.dumps({"methods": methods}))
    with open(tmp_path / "metrics.jsonl", "w") as f:
        for name, forget in (("fedavg", 0.3), ("stewc", 0.1)):
            for e in _evals(forget):
                f.write(json.dumps(dict(e, method=name, seed=0)) + "\n")
    return json.loads((tmp_path / "summary.json").read_text())


def test_the_table_compares_each_method_with_the_reference_and_the_plot_is_written(tmp_path):
    summary = _summary(tmp_path)
    table = periods_table(summary, "fedavg")
    row = next(line for line in table.splitlines() if "`stewc`" in line)
    assert "0.700 ± 0.000" in row and "+40.0" in row      # period 1: 0.7 against 0.3
    assert "eq. 15 after period 3" in table
    out = periods_for_run(tmp_path, "fedavg")
    assert out == table
    from streamfl.cli import main
    assert main(["report", str(tmp_path), "--section", "periods", "--reference", "fedavg"]) == 0
    assert main(["report", str(tmp_path), str(tmp_path), "--section", "periods"]) == 2  # one folder
    pytest.importorskip("matplotlib")
    assert (tmp_path / "periods.png").stat().st_size > 0


def test_a_run_without_periods_is_refused(tmp_path):
    with pytest.raises(StreamflError):
        periods_table({"methods": {"fedavg": {"final_accuracy": 0.5}}})
