"""``streamfl sim --keep-going`` and ``streamfl tune --keep-going``: a run that fails costs that
run, not the grid; the others write what a grid without it writes, and the failure is named."""
import json
import multiprocessing

import pytest

from sim_grid import GRID, SMOKE, run_files, serial_files
from streamfl.cli import main
from streamfl.sim.tables import markdown_table, methods_table

# clp's settings are checked when a run builds its coordinator: every adaclp run fails at once,
# while fedasync and fedavg (which do not read them) run as in the plain grid.
BREAK_ADACLP = ["--set", "plugins.clp.nonsense=1"]
WITH_ADACLP = [*GRID[:-1], "fedasync,adaclp,fedavg", *BREAK_ADACLP]


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    return serial_files(tmp_path_factory)


@pytest.mark.parametrize("jobs", [[], ["--jobs", "2"]], ids=["serial", "jobs-2"])
def test_the_other_runs_write_the_plain_grids_files_and_the_failures_are_named(
        serial, tmp_path, capsys, jobs):
    out = tmp_path / "run"
    assert main(["sim", str(SMOKE), *WITH_ADACLP, *jobs, "--keep-going", "--out", str(out)]) == 1
    captured = capsys.readouterr()
    err = captured.err
    assert "adaclp           failed in every seed" in captured.out
    assert "failed: adaclp seed 0: run of method adaclp, seed 0 failed" in err and "nonsense" in err
    assert "failed: adaclp seed 1" in err and "2 run(s) failed" in err
    lines, summary, _ = run_files(out)
    plain_lines, plain_summary, _ = serial
    assert lines == plain_lines  # the failed runs left no line behind
    for name in ("fedasync", "fedavg"):
        assert summary["methods"][name].pop("failed") == []
        assert summary["methods"][name] == plain_summary["methods"][name]
    adaclp = summary["methods"]["adaclp"]
    assert adaclp["seeds"] == 0 and adaclp["runs"] == []
    assert [f["seed"] for f in adaclp["failed"]] == [0, 1]
    assert summary["failed_runs"] == 2
    assert "Failed runs, left out of the figures: adaclp seed 0" in markdown_table(summary)
    assert "<li>adaclp seed 1: run of method adaclp" in methods_table(summary)  # the report page
    assert multiprocessing.active_children() == []


def test_without_keep_going_the_first_failure_still_ends_the_grid(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["sim", str(SMOKE), *WITH_ADACLP, "--out", str(out)])
    assert rc != 0 and "nonsense" in capsys.readouterr().err
    assert not (out / "summary.json").exists()


def test_a_plain_grid_writes_no_failure_keys(tmp_path):
    out = tmp_path / "run"
    assert main(["sim", str(SMOKE), *GRID[:-1], "fedasync", "--seeds", "1", "--keep-going",
                 "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed_runs"] == 0 and summary["methods"]["fedasync"]["failed"] == []
    assert "Failed runs" not in markdown_table(summary) + methods_table(summary)


def test_tune_keeps_going_and_chooses_no_rate_with_a_failed_run(tmp_path, capsys):
    out = tmp_path / "tune"
    rc = main(["tune", str(SMOKE), "--methods", "fedasync,adaclp", "--lrs", "0.1,0.2",
               "--duration", "30", *BREAK_ADACLP, "--keep-going", "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 1 and "failed: adaclp at lr 0.1 seed 0" in captured.err
    tuned = json.loads((out / "tuned.json").read_text())
    assert tuned["fedasync"]["lr"] in (0.1, 0.2) and tuned["adaclp"]["lr"] is None
    assert "(1 failed)" in captured.out
    assert "method_lr.fedasync=" in (out / "tuned.flags").read_text()
    assert "adaclp" not in (out / "tuned.flags").read_text()
