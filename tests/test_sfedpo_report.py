"""SFedPO's report on hand-made metrics: accuracy at the end and over the run per method, the best
baseline and sfedpo's margin over it per folder, the buffer class mix, and the CLI flag."""
import json

import numpy as np
import pytest

from streamfl.errors import StreamflError
from streamfl.methods.sfedpo.report import buffer_mix, margin, method_figures, sfedpo_for_runs


def _evals(method, accs, seed=0, counts=None):
    return [{"event": "eval", "method": method, "seed": seed, "time_s": 10.0 * i, "accuracy": a,
             "buffer_counts": counts} for i, a in enumerate(accs)]


def _rows():
    return (_evals("fedavg", [0.1, 0.5, 0.7]) + _evals("fedavg", [0.1, 0.5, 0.8], seed=1)
            + _evals("is", [0.1, 0.6, 0.78]) + _evals("is", [0.1, 0.6, 0.78], seed=1)
            + _evals("sfedpo", [0.1, 0.7, 0.82], counts=[3, 1]) + _evals("sfedpo", [0.1, 0.7, 0.84], seed=1))


def test_final_and_mean_accuracy_per_seed_and_the_margin():
    figs = method_figures(_rows())
    assert figs["fedavg"]["final"] == [0.7, 0.8]
    assert figs["sfedpo"]["mean"] == pytest.approx([(0.1 + 0.7 + 0.82) / 3, (0.1 + 0.7 + 0.84) / 3])
    best, gap = margin(figs)
    assert best == "is" and gap == pytest.approx(100 * (0.83 - 0.78))
    assert margin({"fedavg": figs["fedavg"]}) == (None, None)
    # the paper's per-window IS is a baseline too
    figs["is-window"] = {"final": [0.85, 0.85], "mean": [0.5, 0.5]}
    best, gap = margin(figs)
    assert best == "is-window" and gap == pytest.approx(100 * (0.83 - 0.85))


def test_buffer_mix_is_the_class_shares_over_time():
    times, shares = buffer_mix(_rows(), "sfedpo")
    assert times == [0.0, 10.0, 20.0] and np.allclose(shares, [[0.75, 0.25]] * 3)
    assert buffer_mix(_rows(), "fedavg")[0] == []


def test_table_over_folders_with_the_plots(tmp_path):
    for name in ("sfedpo-x-full", "sfedpo-x-partial"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in _rows()) + "\n")
    text = sfedpo_for_runs([tmp_path / "sfedpo-x-full", tmp_path / "sfedpo-x-partial"])
    assert "| sfedpo-x-partial | `is` (best baseline) | 0.780 +- 0.000 |" in text
    assert text.index("`fedavg`") < text.index("`is`") < text.index("`sfedpo`")  # baselines first
    assert "- sfedpo-x-full: `sfedpo` +5.0 points over the best baseline, `is`." in text
    pytest.importorskip("matplotlib")
    assert (tmp_path / "sfedpo.png").exists() and (tmp_path / "sfedpo-buffer.png").exists()


def test_a_folder_without_metrics_is_an_error(tmp_path):
    with pytest.raises(StreamflError, match="no metrics"):
        sfedpo_for_runs([tmp_path / "missing"])


def test_streamfl_report_sfedpo(tmp_path, capsys):
    from streamfl.cli import main
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in _rows()) + "\n")
    assert main(["report", str(tmp_path / "a"), "--section", "sfedpo", "--methods", "sfedpo,fedavg"]) == 0
    out = capsys.readouterr().out
    assert "`sfedpo`" in out and "`is`" not in out.split("\n\n")[0]
