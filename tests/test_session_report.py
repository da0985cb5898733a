"""The session report's figures on hand-made metrics: rounds (FedAvg rounds plus auxiliary rounds,
switches not counted), seconds and joules to a share of session-init's peak, the accumulated gain
over previous, and the Markdown table over several run folders."""
import json

import pytest

from streamfl.errors import StreamflError
from streamfl.methods.sessions.report import session_figures, sessions_for_runs, summarize


def _evals(method, accs, t0, period, energy_per_s=10.0):
    return [{"event": "eval", "method": method, "seed": 0, "time_s": t0 + i, "period": period,
             "accuracy": a, "accuracy_now": a, "energy_j": (t0 + i) * energy_per_s, "version": 0}
            for i, a in enumerate(accs)]


def _rounds(method, times, n=2):
    return [{"event": "aggregate", "method": method, "seed": 0, "time_s": t, "n": n} for t in times]


def _rows():
    rows = []
    # session 0 (left out), then session 1 from t = 10
    rows += _evals("previous", [0.9] * 10, 0, 0) + _evals("session-init", [0.9] * 10, 0, 0)
    rows += _evals("previous", [0.0, 0.1, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.96, 0.96], 10, 1)
    rows += _evals("session-init", [0.0, 0.0, 0.9, 0.97, 0.98, 1.0, 1.0, 1.0, 1.0, 1.0], 10, 1)
    rows += _rounds("previous", [10.5, 11.5, 12.5, 13.5, 14.5, 15.5, 16.5, 17.5, 18.5])
    # session-init: the switch to the pilot (n = 0), its aux round closing with the switch (an init
    # event with answers), then FedAvg rounds
    rows += _rounds("session-init", [10.2], n=0)
    rows += [{"event": "session", "method": "session-init", "seed": 0, "time_s": 11.5, "what": "init",
              "answers": 3}]
    rows += _rounds("session-init", [11.5], n=0) + _rounds("session-init", [12.8, 13.5, 14.5])
    # a session the run's end just opened: too short to count
    rows += _evals("previous", [0.5], 20, 2) + _evals("session-init", [0.5], 20, 2)
    return rows


def test_rounds_seconds_joules_and_gain_per_transition():
    figs = session_figures(_rows(), targets=(0.95,))
    prev, init = figs["previous"]["transitions"], figs["session-init"]["transitions"]
    assert len(prev) == len(init) == 1 and init[0]["session"] == 1 and init[0]["peak"] == 1.0
    # target 0.95: session-init at t = 13 (its aux round at 11.5 and one FedAvg round at 12.8)
    assert init[0]["0.95"] == {"reached": True, "rounds": 2, "seconds": 3.0, "joules": 30.0}
    # previous at t = 17: seven rounds (10.5 ... 16.5)
    assert prev[0]["0.95"] == {"reached": True, "rounds": 7, "seconds": 7.0, "joules": 70.0}
    gain = sum([0.0, -0.1, 0.6, 0.47, 0.28, 0.2, 0.1, 0.05, 0.04, 0.04])
    assert init[0]["gain_vs_baseline"] == pytest.approx(gain, abs=1e-3) and prev[0]["gain_vs_baseline"] == 0.0
    # 0.99 of the peak: previous never gets there; counted as the session's rounds plus one
    late = session_figures(_rows(), targets=(0.99,))["previous"]["transitions"][0]["0.99"]
    assert late == {"reached": False, "rounds": 10, "seconds": None, "joules": None}
    table = summarize(figs, targets=(0.95,))
    assert table["session-init"]["0.95"]["within_2"] == 1.0 and table["previous"]["0.95"]["within_2"] == 0.0


def test_spreads_are_over_seeds_and_absent_with_one_seed():
    from streamfl.methods.sessions.report import sessions_table
    one = _rows()
    assert summarize(session_figures(one, targets=(0.95,)), targets=(0.95,))["previous"]["0.95"]["rounds_std"] is None
    # seed 1: the same run, but previous reaches the target three evaluations (rounds) later
    later = [dict(r, seed=1) for r in one]
    for r in later:
        if r["method"] == "previous" and r.get("event") == "eval" and r["period"] == 1:
            r["accuracy_now"] = {0.95: 0.9, 0.96: 0.9}.get(r["accuracy_now"], r["accuracy_now"])
    table = summarize(session_figures(one + later, targets=(0.95,)), targets=(0.95,))
    prev = table["previous"]
    assert prev["seeds"] == 2 and prev["0.95"]["rounds"] == pytest.approx(8.5)  # 7 and 10 (censored)
    assert prev["0.95"]["rounds_std"] == pytest.approx(2.1213, abs=1e-3)  # std of 7 and 10, over seeds
    assert prev["0.95"]["reached"] == 0.5
    assert table["session-init"]["mean_accuracy_std"] == 0.0
    cells = sessions_table(table, targets=(0.95,))[0]
    assert cells[:4] == ["`previous`", "8.5 ± 2.1 (8)", "0% ± 0", "50%"]
    assert cells[-1].count(" ± ") == 1 and cells[-2].startswith("+0.0 ± ")


def test_table_over_folders_and_a_run_without_sessions(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        with open(tmp_path / name / "metrics.jsonl", "w") as f:
            f.write("\n".join(json.dumps(r) for r in _rows()) + "\n")
    text = sessions_for_runs([tmp_path / "a", tmp_path / "b"])
    assert text.count("| `session-init` |") == 4 and "| a | all |" in text and "| b | 2+ |" in text
    assert "rounds to 95%" in text
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "metrics.jsonl").write_text(json.dumps({"event": "eval", "time_s": 1.0}) + "\n")
    with pytest.raises(StreamflError, match="accuracy_now"):
        sessions_for_runs([tmp_path / "c"])
    with pytest.raises(StreamflError, match="no metrics"):
        sessions_for_runs([tmp_path / "missing"])


def test_streamfl_report_sessions(tmp_path, capsys):
    from streamfl.cli import main
    (tmp_path / "a").mkdir()
    with open(tmp_path / "a" / "metrics.jsonl", "w") as f:
        f.write("\n".join(json.dumps(r) for r in _rows()) + "\n")
    assert main(["report", str(tmp_path / "a"), "--section", "sessions", "--option", "0.9",
                 "--methods", "session-init"]) == 0
    out = capsys.readouterr().out
    assert "rounds to 90%" in out and "| `session-init` |" in out and "| `previous` |" not in out
    pytest.importorskip("matplotlib")
    assert (tmp_path / "a" / "sessions.png").stat().st_size > 1000
    assert main(["report", str(tmp_path / "a"), "--section", "sessions", "--option", "1.5"]) == 2
    assert "shares must be in (0, 1]" in capsys.readouterr().err
