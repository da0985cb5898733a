"""``streamfl dataset`` (streamfl.recordings): CSV recordings and folders of them become train.npz
and eval.npz that the simulator, the replay sensor and the coordinator's evaluator load; windows
never cross a subject, a label or a pause; the split holds out whole subjects; bad input is a
clear error with the CLI's exit code."""
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from streamfl import cli, recordings
from streamfl.sensors.config import SensorConfig

ROOT = Path(__file__).resolve().parent.parent
CHANNELS = ("ax", "ay", "az")
#: A log line (the tests' conftest turns streamfl's INFO on), not the command's own output.
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+ [A-Z]+ ")


def write_csv(path: Path, header, rows) -> Path:
    """A CSV file of ``header`` and ``rows`` (lists of values), folders made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(",".join(str(v) for v in row) for row in [header] + list(rows)) + "\n",
                    encoding="utf-8")
    return path


def tagged_rows(subject: str, s: int, labels, samples: int, t0: float = 0.0, dt: float = 0.02):
    """Rows ``time, subject, label, ax, ay, az, note`` whose channels say where they come from:
    ax = 1000 * subject index + 100 * index in LABELS (else in ``labels``), ay = sample index in
    its run, az = noise."""
    rng = np.random.default_rng(s)
    rows, t = [], t0
    for k, label in enumerate(labels):
        for i in range(samples):
            t += dt
            tag = LABELS.index(label) if label in LABELS else k
            rows.append(["%.3f" % t, subject, label, 1000 * s + 100 * tag, i,
                         "%.4f" % rng.normal(), "n"])
    return rows, t


HEADER = ["time", "subject", "label"] + list(CHANNELS) + ["note"]
LABELS = ("walk", "sit", "run")


def fleet_csv(tmp_path: Path, subjects=("s0", "s1", "s2", "s3"), samples: int = 30) -> Path:
    """One CSV: every subject records walk, sit, run for ``samples`` samples each, every other one
    in reverse order, so that one subject's last label is the next one's first."""
    rows, t = [], 0.0
    for s, name in enumerate(subjects):
        more, t = tagged_rows(name, s, LABELS[::-1] if s % 2 else LABELS, samples, t)
        rows += more
    return write_csv(tmp_path / "rec.csv", HEADER, rows)


def run(argv, capsys):
    """``streamfl dataset ARGV``: (exit code, stdout, stderr)."""
    code = cli.main(["dataset"] + [str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def load(path: Path) -> dict:
    """Every key of a written .npz, read as a reader outside streamfl would (no pickle)."""
    with np.load(str(path), allow_pickle=False) as npz:
        return {key: npz[key] for key in npz.files}


def test_a_csv_becomes_train_and_eval_in_the_dataset_layout(tmp_path, capsys):
    out = tmp_path / "out"
    code, text, err = run([fleet_csv(tmp_path), "--out", out, "--window", 10, "--step", 5,
                           "--eval-subjects", "s3"], capsys)
    assert code == 0, err
    train, held = load(out / "train.npz"), load(out / "eval.npz")
    for data in (train, held):
        assert data["X"].dtype == np.float32 and data["X"].ndim == 3 and data["X"].shape[1:] == (10, 3)
        assert data["y"].dtype == np.int64 and data["subject"].dtype == np.int64
        assert data["y"].shape == data["subject"].shape == (data["X"].shape[0],)
        # Sorted class names; the source columns, in X's channel order.
        assert data["classes"].tolist() == ["run", "sit", "walk"]
        assert data["channels"].tolist() == list(CHANNELS)
        assert data["subject_ids"].dtype == np.int64
    # 30 samples per run, windows of 10 every 5: 5 windows per (subject, label).
    assert train["X"].shape[0] == 3 * 3 * 5 and held["X"].shape[0] == 3 * 5
    # Subjects are numbered in sorted name order; s3 only in eval, nowhere in train.
    assert train["subject_names"].tolist() == ["s0", "s1", "s2"]
    assert set(train["subject"].tolist()) == {0, 1, 2} and set(held["subject"].tolist()) == {3}
    assert held["subject_names"].tolist() == ["s3"] and held["subject_ids"].tolist() == [3]
    for data in (train, held):
        ax, ay = data["X"][:, :, 0], data["X"][:, :, 1]
        # No window crosses a subject or a label: its tag is one value throughout ...
        assert (ax == ax[:, :1]).all()
        # ... and it is the window's own subject and label.
        label_of_tag = {k: data["classes"].tolist().index(name) for k, name in enumerate(LABELS)}
        tags = ax[:, 0].astype(int)
        assert (tags // 1000 == data["subject"]).all()
        assert [label_of_tag[k] for k in (tags % 1000) // 100] == data["y"].tolist()
        # Consecutive samples of a run, starting every 5.
        assert (np.diff(ay, axis=1) == 1).all()
        assert sorted(set(ay[:, 0].astype(int).tolist())) == [0, 5, 10, 15, 20]
    assert "eval subjects: s3" in text and "columns not used: note" in text
    assert "class 2 walk" in text and "subject s3 (id 3)" in text


def test_the_files_load_in_the_simulator_the_replay_sensor_and_the_coordinators_evaluator(
        tmp_path, capsys):
    from streamfl.coordinator.evaluation import evaluator_from_path
    from streamfl.models import ModelSpec, build_model, model_to_arrays
    from streamfl.sensors.factory import make_source
    from streamfl.sim.datasets import dataset_shape, load_dataset

    out = tmp_path / "out"
    code, _, err = run([fleet_csv(tmp_path), "--out", out, "--window", 10, "--step", 5,
                        "--eval-fraction", 0.25, "--seed", 3], capsys)
    assert code == 0, err
    # What 'streamfl sim --dataset' loads (the scenario's data: npz at that path).
    ds = load_dataset("npz", path=str(out / "train.npz"))
    assert dataset_shape(ds) == (10, 3, 3) and len(np.unique(ds.subject)) == 3
    # The coordinator's eval_path.
    spec = ModelSpec(name="mlp", in_channels=3, window_len=10, num_classes=3, hidden=8)
    evaluator = evaluator_from_path(out / "eval.npz", spec)
    assert len(evaluator) == 15
    accuracy, loss = evaluator.evaluate(model_to_arrays(build_model(spec, seed=0)))
    assert 0.0 <= accuracy <= 1.0 and np.isfinite(loss)
    # A board's replay sensor, one subject of the file.
    subject = int(ds.subject[0])
    source = make_source(SensorConfig(kind="replay", path=str(out / "train.npz"), window_len=10,
                                      stride=5, channels=3, num_classes=3, subject=subject,
                                      loop=False, windows_per_s=0.0), "board-1")
    windows = list(source.windows())
    assert len(windows) == 15
    assert all(int(w.x[0, 0]) // 1000 == subject for w in windows)


def test_the_eval_fraction_holds_out_whole_subjects_chosen_by_the_seed(tmp_path, capsys):
    path = fleet_csv(tmp_path, subjects=tuple("p%d" % i for i in range(10)), samples=10)
    held = {}
    for seed in (0, 0, 1):
        out = tmp_path / ("out%d" % len(held.get(seed, [])))
        code, _, err = run([path, "--out", out, "--window", 10, "--step", 10, "--seed", seed],
                           capsys)
        assert code == 0, err
        train, evaluation = load(out / "train.npz"), load(out / "eval.npz")
        subjects = set(evaluation["subject"].tolist())
        assert len(subjects) == 2  # the default share, 0.2 of 10
        assert not subjects & set(train["subject"].tolist())
        held.setdefault(seed, []).append(subjects)
    assert held[0][0] == held[0][1]
    code, text, err = run([path, "--out", tmp_path / "none", "--window", 10, "--eval-fraction", 0],
                          capsys)
    assert code == 0, err
    assert (tmp_path / "none" / "train.npz").is_file()
    assert not (tmp_path / "none" / "eval.npz").exists()
    assert "train.npz only" in text


def test_a_subject_label_folder_needs_no_columns_and_keeps_numeric_subject_ids(tmp_path, capsys):
    root = tmp_path / "recordings"
    for subject in ("3", "7", "12"):
        for k, label in enumerate(("idle", "shake")):
            rows = [[100 * k + i, -i] for i in range(22)]
            write_csv(root / subject / label / "take1.csv", ["gx", "gy"], rows)
    (root / "README.txt").write_text("not data")
    out = tmp_path / "out"
    code, text, err = run([root, "--out", out, "--window", 8, "--step", 4, "--eval-subjects", "12"],
                          capsys)
    assert code == 0, err
    train, held = load(out / "train.npz"), load(out / "eval.npz")
    assert set(train["subject"].tolist()) == {3, 7} and set(held["subject"].tolist()) == {12}
    assert train["classes"].tolist() == ["idle", "shake"]
    # 22 samples, windows of 8 every 4: 4 windows, the last 2 samples in none (of 6 files).
    assert train["X"].shape == (2 * 2 * 4, 8, 2)
    assert ((train["X"][:, :, 0] >= 100) == (train["y"] == 1)[:, None]).all()
    assert "files not ending in .csv left out: 1" in text
    assert "tails and steps past the window: 12" in text


def test_subject_folders_with_a_label_column_and_flat_files_named_for_subjects(tmp_path, capsys):
    root = tmp_path / "by-subject"
    for s, subject in enumerate(("ann", "ben")):
        rows, _ = tagged_rows(subject, s, ("a", "b"), 12)
        # The folder gives the subject: the file has none of its own here.
        write_csv(root / subject / "day1.csv", ["time", "label", "x", "y", "z"],
                  [[r[0], r[2], r[3], r[4], r[5]] for r in rows])
    code, _, err = run([root, "--out", tmp_path / "o1", "--window", 6, "--step", 6,
                        "--eval-subjects", "ben"], capsys)
    assert code == 0, err
    assert load(tmp_path / "o1" / "train.npz")["subject_names"].tolist() == ["ann"]
    # Flat files without a subject column: each file is one subject, named for the file.
    flat = tmp_path / "flat"
    for s, subject in enumerate(("cat", "dog", "eel")):
        rows, _ = tagged_rows(subject, s, ("a", "b"), 12)
        write_csv(flat / ("%s.csv" % subject), ["label", "x", "y"], [[r[2], r[3], r[4]] for r in rows])
    code, text, err = run([flat, "--out", tmp_path / "o2", "--window", 6, "--eval-subjects", "eel"],
                          capsys)
    assert code == 0, err
    train = load(tmp_path / "o2" / "train.npz")
    assert train["subject_names"].tolist() == ["cat", "dog"]
    # Label folders, subjects from the file names.
    by_label = tmp_path / "by-label"
    for k, label in enumerate(("up", "down")):
        for subject in ("u1", "u2"):
            write_csv(by_label / label / ("%s.csv" % subject), ["v"], [[k]] * 6)
    code, _, err = run([by_label, "--layout", "label", "--out", tmp_path / "o3", "--window", 3,
                        "--step", 3, "--eval-subjects", "u2"], capsys)
    assert code == 0, err
    train = load(tmp_path / "o3" / "train.npz")
    assert train["classes"].tolist() == ["down", "up"]
    assert (train["X"][:, 0, 0] == np.where(train["y"] == 1, 0, 1)).all()


def test_majority_windows_cross_label_changes_and_pure_ones_count_what_they_leave(tmp_path, capsys):
    # One subject per file: 14 x walk, 4 x sit, 14 x walk, 8 x run.
    labels = ["walk"] * 14 + ["sit"] * 4 + ["walk"] * 14 + ["run"] * 8
    for s in range(2):
        write_csv(tmp_path / "in" / ("p%d.csv" % s), ["label", "v"],
                  [[lab, i] for i, lab in enumerate(labels)])
    common = [tmp_path / "in", "--window", 8, "--step", 4, "--eval-subjects", "p1"]
    code, text, err = run(common + ["--out", tmp_path / "pure", "--classes", "walk,sit,run"], capsys)
    # Pure: sit's 4 samples make no window of 8, so the class has none.
    assert code == 2 and "'sit' have no window" in err, err
    code, text, err = run(common + ["--out", tmp_path / "pure", "--ignore-label", "sit"], capsys)
    assert code == 0, err
    pure = load(tmp_path / "pure" / "train.npz")
    assert pure["classes"].tolist() == ["run", "walk"]
    assert pure["X"][:, 0, 0].astype(int).tolist() == [0, 4, 18, 22, 32]
    assert pure["y"].tolist() == [1, 1, 1, 1, 0]
    assert "rows of ignored labels: 8" in text
    code, text, err = run(common + ["--out", tmp_path / "maj", "--label-windows", "majority"],
                          capsys)
    assert code == 0, err
    maj = load(tmp_path / "maj" / "train.npz")
    assert maj["classes"].tolist() == ["run", "sit", "walk"]
    starts = maj["X"][:, 0, 0].astype(int).tolist()
    assert starts == list(range(0, 40 - 8 + 1, 4))  # straight over the label changes
    by_start = dict(zip(starts, maj["y"].tolist()))
    # 8..15: 6 walk, 2 sit; 12..19: 4 sit, 4 walk, a tie to the lower id (sit); 28..35: 4 walk,
    # 4 run, to run.
    assert (by_start[8], by_start[12], by_start[16], by_start[28], by_start[32]) == (2, 1, 2, 0, 0)


def test_a_pause_in_the_time_column_cuts_windows(tmp_path, capsys):
    rows = []
    for s in ("a", "b"):
        # 20 samples at 0.1 s, a 5 s pause, 20 more.
        times = [0.1 * i for i in range(20)] + [7.0 + 0.1 * i for i in range(20)]
        rows += [[s, "go", "%.2f" % t, i] for i, t in enumerate(times)]
        rows += [[s, "stop", "%.2f" % (9.0 + 0.1 * i), 100 + i] for i in range(20)]
    path = write_csv(tmp_path / "r.csv", ["subject", "label", "time", "v"], rows)
    code, text, err = run([path, "--out", tmp_path / "o", "--window", 10, "--step", 5,
                           "--eval-subjects", "b"], capsys)
    assert code == 0, err
    v = load(tmp_path / "o" / "train.npz")["X"][:, :, 0]
    assert not ((v[:, 0] < 20) & (v[:, -1] >= 20)).any()
    assert len(v) == 3 + 3 + 3 and "pauses cut: 2" in text
    # --max-gap inf: the pause is no pause.
    code, text, err = run([path, "--out", tmp_path / "o2", "--window", 10, "--step", 5,
                           "--eval-subjects", "b", "--max-gap", "inf"], capsys)
    assert code == 0, err
    assert len(load(tmp_path / "o2" / "train.npz")["y"]) == 7 + 3


def test_the_worked_example_in_the_docs_prints_what_the_page_shows(tmp_path, capsys, monkeypatch):
    page = (ROOT / "docs" / "datasets.md").read_text(encoding="utf-8")
    csv_text = re.search(r"```csv\n(.*?)```", page, re.S).group(1)
    console = re.search(r"```console\n\$ (.*?)\n(.*?)```", page, re.S)
    argv = shlex.split(console.group(1))
    assert argv[:3] == ["streamfl", "dataset", "walks.csv"]
    (tmp_path / "walks.csv").write_text(csv_text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv[1:]) == 0
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if not LOG_LINE.match(line)] == \
        console.group(2).splitlines()
    assert load(tmp_path / "data" / "eval.npz")["subject_names"].tolist() == ["cal"]


def test_defaults_are_the_sensors_window_and_stride():
    cfg = SensorConfig()
    assert (recordings.WINDOW_SAMPLES, recordings.STEP_SAMPLES) == (cfg.window_len, cfg.stride)


def _bad_value(tmp_path, cell):
    """A good two-subject CSV but for ``cell`` as channel ay of its second data line (line 3)."""
    rows, _ = tagged_rows("s0", 0, LABELS, 12)
    more, _ = tagged_rows("s1", 1, LABELS, 12, 100.0)
    rows += more
    rows[1][4] = cell
    return [write_csv(tmp_path / "bad.csv", HEADER, rows)]


def _wrote(tmp_path, header, rows, name="r.csv"):
    """The inputs list of one CSV file written from ``header`` and ``rows``."""
    return [write_csv(tmp_path / name, header, rows)]


ERRORS = {
    "no such file": (lambda p: [p / "nothing.csv"], [], 2, "no such file"),
    "missing label column": (lambda p: _wrote(p, ["subject", "v"], [["a", 1]] * 20), [], 2,
                             "no label column 'label'"),
    "missing named column": (lambda p: [fleet_csv(p)], ["--subject-column", "person"], 2,
                             "no subject column 'person'"),
    "missing channel": (lambda p: [fleet_csv(p)], ["--channels", "ax,gx"], 2,
                        "no channel column 'gx'"),
    "not a number": (lambda p: _bad_value(p, "1,5".replace(",", ";")), [], 1,
                     "line 3: channel 'ay' is '1;5', not a number"),
    "NaN": (lambda p: _bad_value(p, "nan"), [], 1, "line 3: channel 'ay' is 'nan'"),
    "inf": (lambda p: _bad_value(p, "-inf"), [], 1, "must be finite"),
    "empty cell": (lambda p: _bad_value(p, ""), [], 1, "channel 'ay' is ''"),
    "empty label": (lambda p: _wrote(p, ["label", "v"], [["a", 1]] * 20 + [["", 2]]), [], 1,
                    "line 22: empty label"),
    "no header": (lambda p: _wrote(p, ["1", "2"], [[3, 4]] * 5), [], 1, "needs a header line"),
    "ragged row": (lambda p: _wrote(p, ["label", "v"], [["a", 1]] * 3 + [["a", 1, 2]]), [], 1,
                   "line 5: 3 fields, the header has 2"),
    "time goes back": (lambda p: _wrote(p, ["time", "label", "v"],
                                        [[0.1 * i, "a", i] for i in range(10)] + [[0.5, "a", 0]]),
                       ["--eval-fraction", "0"], 1, "line 12: time 0.5 does not follow"),
    "too short": (lambda p: [fleet_csv(p, samples=4)], [], 2, "gives no window of 50 samples"),
    "one subject": (lambda p: _wrote(p, ["label", "v"], [["a", 1]] * 60 + [["b", 1]] * 60), [], 2,
                    "one subject only"),
    "every subject to eval": (lambda p: [fleet_csv(p, subjects=("x", "y"))],
                              ["--window", "10", "--eval-subjects", "x,y"], 2,
                              "none left for training"),
    "unknown eval subject": (lambda p: [fleet_csv(p)], ["--window", "10", "--eval-subjects", "zz"],
                             2, "no subject 'zz'"),
    "class only in eval": (lambda p: _wrote(p, ["subject", "label", "v"],
                                            [["x", "a", 1]] * 10 + [["y", "a", 1]] * 10
                                            + [["y", "b", 1]] * 10),
                           ["--window", "5", "--eval-subjects", "y"], 2,
                           "'b' have windows only in the eval subjects"),
    "label not in classes": (lambda p: [fleet_csv(p)], ["--window", "10", "--classes", "run,sit"],
                             2, "labels not in --classes: 'walk'"),
    "one class": (lambda p: _wrote(p, ["subject", "label", "v"],
                                   [["x", "a", 1]] * 10 + [["y", "a", 1]] * 10),
                  ["--window", "5"], 2, "one class only"),
    "bad window": (lambda p: [fleet_csv(p)], ["--window", "0"], 2, "--window must be >= 1"),
    "folder mismatch": (lambda p: [write_csv(p / "root" / "s1" / "walk" / "a.csv", ["label", "v"],
                                             [["run", 1]] * 10).parent.parent.parent], [], 2,
                        "label 'run', but its folder says 'walk'"),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_bad_input_is_a_clear_error_with_its_exit_code(tmp_path, capsys, case):
    make, flags, code, message = ERRORS[case]
    inputs = make(tmp_path)
    got, out, err = run(inputs + ["--out", tmp_path / "out"] + flags, capsys)
    assert got == code, (out, err)
    assert message in err
    assert err.startswith("streamfl: configuration error:" if code == 2 else "streamfl: ")
    assert not (tmp_path / "out" / "train.npz").exists()
