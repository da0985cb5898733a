"""``streamfl dataset``: a user's own CSV recordings cut into the project's dataset .npz files.

Writes ``OUT/train.npz`` and ``OUT/eval.npz`` in the one dataset layout of
``streamfl.sensors.datasets`` (``X`` float32 [N, T, C], ``y`` int64 [N], ``subject`` int64 [N],
``classes`` str [K]), so one file serves ``streamfl sim --dataset``, a board's replay sensor
(``sensor.kind: replay``, ``sensor.subject``) and the coordinator's ``eval_path``, whose loader
wants all four keys as well. Three more keys describe where the windows came from and are ignored
by every reader of the layout: ``channels`` str [C] (the CSV columns, in X's channel order),
``subject_ids`` int64 [S] and ``subject_names`` str [S] (the subjects of the file, id and name).

Inputs: CSV files with a header line, and folders of them (``*.csv``, hidden entries skipped,
other files counted and ignored). A folder's layout says what its sub-folders mean:
``flat`` (ROOT/*.csv), ``subject`` (ROOT/SUBJECT/*.csv), ``label`` (ROOT/LABEL/*.csv) or
``subject/label`` (ROOT/SUBJECT/LABEL/*.csv); ``auto`` takes the files' depth below ROOT: 1 flat,
2 subject (one folder per person is the common layout; ask for ``label`` by name), 3
subject/label. A sample's label comes from its folder, else from the label column; its subject
from its folder, else from the subject column, else is the file's name without ``.csv`` (one
recording per person). Where a file has the column and its folder gives the value too, the two
must agree. The time column, when there is one, is only used to find pauses (below); it is no
channel. The channels are ``--channels`` in that order, else every other column whose first value
in the first file is a number; every later file must have them.

Choices, and why:

- Windows never cross a file, a subject or a pause; by default (``--label-windows pure``) not a
  change of label either, so every window is one activity and its label is true. ``majority``
  lets windows run over label changes and labels each by the majority of its samples (ties to the
  lower class id), as the boards' live windower (``streamfl.sensors.windower``) labels them.
- A pause: with a time column, a step of more than ``--max-gap`` (time-column units; default 3
  times the file's median step, i.e. more than two samples missing) starts a new stretch; a step
  that is not forward is an error, since windows over unsorted samples would be noise.
- Class ids: the labels sorted (as numbers when every label is an integer, else as text), so ids
  do not depend on the order of files and a re-run on more recordings with the same labels gives
  the same ids; ``--classes`` fixes the list and its order instead.
- Subject ids: the subjects' own numbers when every subject name is a non-negative integer (so
  ``sensor.subject: 3`` replays the recordings of subject 3), else the names sorted and numbered
  from 0.
- No standardisation: the replay and live sensors hand the model raw values, so a model trained on
  rescaled windows would meet another scale on the boards.
- Windows defaults (50 samples every 25) are the sensor's and the model's defaults
  (``sensor.window_len``, ``sensor.stride``, ``model.window_len``).
- The evaluation set is whole subjects (``--eval-subjects``, or ``--eval-fraction`` of them chosen
  with ``--seed``; default 0.2, 0 writes train.npz only), so it measures unseen people.

Nothing is dropped silently: rows of ``--ignore-label`` labels, stretches shorter than a window
and the tail samples no window covers are counted in the printed summary. Errors: what does not fit
the options (a missing column, a recording without one window, a class without a training window,
an unknown eval subject, no subject left for training) is a ``ConfigError`` (exit code 2); broken
data (no header, a row of the wrong length, a value that is no number, NaN or inf in a channel, an
empty label, time not going forward) a ``SensorError`` (exit code 1), both naming the file and
line. The top-level imports stay light (every ``streamfl`` call imports this module); numpy is
imported where the work is done.
"""
import csv
import logging
import math
import re
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from streamfl.errors import ConfigError, SensorError, StorageError

log = logging.getLogger(__name__)

HELP = "cut your own CSV recordings into train.npz and eval.npz for sim, replay and evaluation"
DETAILS = ("Reads CSV files with a header line (numeric channel columns, a label column, optionally "
           "subject and time columns) or folders of them whose sub-folders name the subject and/or "
           "the label, cuts windows that never cross a file, subject, pause or (by default) label "
           "change, numbers the classes in sorted order, holds out whole subjects for evaluation "
           "and writes OUT/train.npz (for 'streamfl sim --dataset' and a board's replay sensor) "
           "and OUT/eval.npz (for the coordinator's eval_path), printing windows per class and per "
           "subject. See docs/datasets.md.")

#: Folder layouts, by what the sub-folders below ROOT mean; "auto" goes by the files' depth.
LAYOUTS = ("auto", "flat", "subject", "label", "subject/label")
#: ``auto``: the files' depth below ROOT -> layout.
AUTO_LAYOUT = {1: "flat", 2: "subject", 3: "subject/label"}
#: How windows get labels: "pure" never crosses a label change; "majority" does, majority-labelled.
LABEL_WINDOWS = ("pure", "majority")
#: Samples per window and between window starts: the sensor's and the model's defaults.
WINDOW_SAMPLES = 50
STEP_SAMPLES = 25
#: Share of the subjects held out for evaluation by default.
EVAL_FRACTION = 0.2
#: Default pause: a time step above this many times the file's median step.
GAP_FACTOR = 3.0
#: Column names used when the header has them and no flag names another.
LABEL_COLUMN = "label"
SUBJECT_COLUMN = "subject"
TIME_COLUMN = "time"
SUFFIX = ".csv"
_INTEGER = re.compile(r"^[0-9]+$")
#: Largest subject id kept as the subject's own number (the replay sensor's ``subject`` bound).
_MAX_SUBJECT_ID = 2 ** 32 - 1


def add_arguments(parser) -> None:
    """The flags of ``streamfl dataset``."""
    parser.add_argument("inputs", nargs="+", metavar="PATH",
                        help="CSV files and/or folders of them")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="output folder for train.npz and eval.npz (created; files replaced)")
    parser.add_argument("--layout", choices=LAYOUTS, default="auto",
                        help="what a folder's sub-folders are: flat (ROOT/*.csv), subject "
                             "(ROOT/SUBJECT/*.csv), label (ROOT/LABEL/*.csv), subject/label "
                             "(ROOT/SUBJECT/LABEL/*.csv); auto (default) goes by depth: 1 flat, 2 "
                             "subject, 3 subject/label")
    parser.add_argument("--label-column", default=None, metavar="NAME",
                        help="column of the labels (default: label; not needed where the folders "
                             "give the label)")
    parser.add_argument("--subject-column", default=None, metavar="NAME",
                        help="column of the subjects (default: subject when the header has it, "
                             "else the folder or the file name)")
    parser.add_argument("--time-column", default=None, metavar="NAME",
                        help="column of the sample times, used to find pauses (default: time when "
                             "the header has it)")
    parser.add_argument("--channels", default=None, metavar="A,B,C",
                        help="channel columns, in this order (default: every other column whose "
                             "first value is a number)")
    parser.add_argument("--delimiter", default=",", help="field separator (default ,)")
    parser.add_argument("--window", type=int, default=WINDOW_SAMPLES, metavar="SAMPLES",
                        help="samples per window (default %d, the sensor's window_len)"
                             % WINDOW_SAMPLES)
    parser.add_argument("--step", type=int, default=STEP_SAMPLES, metavar="SAMPLES",
                        help="samples between window starts; below --window the windows overlap "
                             "(default %d, the sensor's stride)" % STEP_SAMPLES)
    parser.add_argument("--label-windows", choices=LABEL_WINDOWS, default="pure",
                        help="pure (default): no window crosses a label change; majority: windows "
                             "run over label changes and take their samples' majority label")
    parser.add_argument("--max-gap", type=float, default=None, metavar="TIME",
                        help="with a time column: a step above this (time-column units) is a pause "
                             "no window crosses (default %g times the file's median step; inf: "
                             "never)" % GAP_FACTOR)
    parser.add_argument("--classes", default=None, metavar="A,B,C",
                        help="the class names in id order (default: the labels found, sorted)")
    parser.add_argument("--ignore-label", action="append", default=[], dest="ignore_labels",
                        metavar="LABEL",
                        help="rows with this label are left out (counted; no window crosses them); "
                             "repeat for more; '' for rows without a label")
    split = parser.add_mutually_exclusive_group()
    split.add_argument("--eval-subjects", default=None, metavar="S1,S2",
                       help="subjects that go to eval.npz, by name as in the data")
    split.add_argument("--eval-fraction", type=float, default=None, metavar="F",
                       help="share of the subjects for eval.npz, at least one (default %g; 0: no "
                            "eval.npz)" % EVAL_FRACTION)
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the choice of --eval-fraction's subjects (default 0)")
    parser.add_argument("--log-level", default="WARNING")


class Options(NamedTuple):
    """What ``build`` needs from the flags, checked (``options_from_args``)."""

    layout: str = "auto"
    label_column: Optional[str] = None
    subject_column: Optional[str] = None
    time_column: Optional[str] = None
    channels: Optional[Tuple[str, ...]] = None
    delimiter: str = ","
    window: int = WINDOW_SAMPLES
    step: int = STEP_SAMPLES
    label_windows: str = "pure"
    max_gap: Optional[float] = None
    classes: Optional[Tuple[str, ...]] = None
    ignore_labels: Tuple[str, ...] = ()


def _names(text: Optional[str], flag: str) -> Optional[Tuple[str, ...]]:
    """A comma-separated flag as a tuple of stripped, distinct, non-empty names (None if absent)."""
    if text is None:
        return None
    names = tuple(x.strip() for x in text.split(","))
    if not names or any(not x for x in names):
        raise ConfigError("%s %r: comma-separated names, none empty" % (flag, text))
    if len(set(names)) != len(names):
        raise ConfigError("%s %r names one twice" % (flag, text))
    return names


def options_from_args(args) -> Options:
    """The ``Options`` of parsed flags; a bad value is a ``ConfigError`` naming the flag."""
    if args.window < 1:
        raise ConfigError("--window must be >= 1 sample, got %d" % args.window)
    if args.step < 1:
        raise ConfigError("--step must be >= 1 sample, got %d" % args.step)
    if args.max_gap is not None and not args.max_gap > 0:
        raise ConfigError("--max-gap must be > 0, got %r" % args.max_gap)
    if len(args.delimiter) != 1:
        raise ConfigError("--delimiter must be one character, got %r" % args.delimiter)
    for flag, value in (("--label-column", args.label_column),
                        ("--subject-column", args.subject_column),
                        ("--time-column", args.time_column)):
        if value is not None and not value.strip():
            raise ConfigError("%s must name a column" % flag)
    classes = _names(args.classes, "--classes")
    if classes is not None and len(classes) < 2:
        raise ConfigError("--classes needs at least 2 classes, got %r" % args.classes)
    return Options(layout=args.layout, label_column=args.label_column,
                   subject_column=args.subject_column, time_column=args.time_column,
                   channels=_names(args.channels, "--channels"), delimiter=args.delimiter,
                   window=args.window, step=args.step, label_windows=args.label_windows,
                   max_gap=args.max_gap, classes=classes,
                   ignore_labels=tuple(x.strip() for x in args.ignore_labels))


class Source(NamedTuple):
    """One CSV file and what its folders say: subject and label, or None where they say nothing."""

    path: Path
    subject: Optional[str]
    label: Optional[str]


def find_sources(inputs: Sequence[str], layout: str) -> Tuple[List[Source], int]:
    """The CSV files of ``inputs`` with what their folders give, and the count of other files left
    out. A file given by name is ``flat``; a missing path or a folder without CSV files, or CSV
    files at a depth the layout does not have, is a ``ConfigError``."""
    sources: List[Source] = []
    ignored = 0
    for text in inputs:
        path = Path(text)
        if path.is_file():
            sources.append(Source(path, None, None))
            continue
        if not path.is_dir():
            raise ConfigError("input %s: no such file or folder" % path)
        files = []
        for found in sorted(path.rglob("*")):
            rel = found.relative_to(path)
            if any(part.startswith(".") for part in rel.parts) or not found.is_file():
                continue
            if found.suffix.lower() == SUFFIX:
                files.append(rel)
            else:
                ignored += 1
        if not files:
            raise ConfigError("input %s: no %s file in the folder" % (path, SUFFIX))
        depths = sorted({len(rel.parts) for rel in files})
        chosen = layout
        if layout == "auto":
            if len(depths) > 1 or depths[0] not in AUTO_LAYOUT:
                raise ConfigError("input %s: %s files at depths %s below it; auto layout takes one "
                                  "of 1 (flat), 2 (subject), 3 (subject/label); name --layout or "
                                  "tidy the folder" % (path, SUFFIX, ", ".join(map(str, depths))))
            chosen = AUTO_LAYOUT[depths[0]]
            log.info("%s: layout %s", path, chosen)
        want = 1 if chosen == "flat" else 3 if chosen == "subject/label" else 2
        for rel in files:
            if len(rel.parts) != want:
                raise ConfigError("input %s: %s is not where layout %s puts files (ROOT/%s)" % (
                    path, rel, chosen, "/".join(chosen.upper().split("/") + ["*" + SUFFIX])
                    if chosen != "flat" else "*" + SUFFIX))
            folders = rel.parts[:-1]
            subject = folders[0] if chosen in ("subject", "subject/label") else None
            label = folders[-1] if chosen in ("label", "subject/label") else None
            sources.append(Source(path / rel, subject, label))
    return sources, ignored


class Table(NamedTuple):
    """One CSV file read: per sample its channels, label, subject, time and line in the file."""

    path: Path
    x: Any  # float32 [n, C]
    labels: List[str]
    subjects: List[str]
    times: Any  # float64 [n] or None
    lines: Any  # int64 [n]
    unused: Tuple[str, ...]  # header columns that are none of channels, label, subject, time


def _column(header: List[str], given: Optional[str], default: str, where: str, what: str,
            required: bool) -> Optional[int]:
    """The index of a named column: the flag's name must be there; the default name may be absent
    unless ``required``."""
    name = given if given is not None else default
    if name in header:
        return header.index(name)
    if given is not None or required:
        raise ConfigError("%s has no %s column %r (columns: %s)%s" % (
            where, what, name, ", ".join(header),
            "" if given is not None else "; name it with --%s-column" % what))
    return None


def _floats(rows: List[List[str]], index: List[int], names: List[str], lines: List[int],
            where: str, what: str):
    """float64 [n, len(index)] of the rows' cells; a cell that is no finite number is a
    ``SensorError`` naming its line and column."""
    import numpy as np

    cells = [[row[i] for i in index] for row in rows]
    try:
        out = np.array(cells, dtype=str).reshape(len(rows), len(index)).astype(np.float64)
    except ValueError:  # some cell is no number: find it below
        suspects = range(len(cells))
    else:
        suspects = np.flatnonzero(~np.isfinite(out).all(axis=1)).tolist()
    for r in suspects:
        for c, cell in enumerate(cells[r]):
            try:
                value = float(cell)
            except ValueError:
                raise SensorError("%s line %d: %s %r is %r, not a number" % (
                    where, lines[r], what, names[c], cell)) from None
            if not math.isfinite(value):
                raise SensorError("%s line %d: %s %r is %r; values must be finite (fill or cut "
                                  "the gap first)" % (where, lines[r], what, names[c], cell))
    return out


def read_table(source: Source, opts: Options, channels: Optional[Tuple[str, ...]]) -> \
        Tuple[Table, Tuple[str, ...]]:
    """Read one CSV file; ``channels`` None picks them from this file (the first one). Returns the
    table and the channel names used."""
    import numpy as np

    where = str(source.path)
    try:
        with open(str(source.path), newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh, delimiter=opts.delimiter)
            header = None
            rows: List[List[str]] = []
            lines: List[int] = []
            for row in reader:
                if not row or all(not cell.strip() for cell in row):
                    continue  # a blank line holds no sample
                if header is None:
                    header = [cell.strip() for cell in row]
                    continue
                if len(row) != len(header):
                    raise SensorError("%s line %d: %d fields, the header has %d" % (
                        where, reader.line_num, len(row), len(header)))
                rows.append(row)
                lines.append(reader.line_num)
    except UnicodeDecodeError as exc:
        raise SensorError("%s is not UTF-8 text: %s" % (where, exc)) from None
    except csv.Error as exc:
        raise SensorError("%s is not readable CSV: %s" % (where, exc)) from None
    except OSError as exc:
        raise ConfigError("cannot read %s: %s" % (where, exc.strerror or exc)) from None
    if header is None:
        raise SensorError("%s is empty" % where)
    if any(not name for name in header) or len(set(header)) != len(header):
        raise SensorError("%s: the header line needs distinct, non-empty column names, got %s" % (
            where, ", ".join(repr(x) for x in header)))
    if all(_is_number(name) for name in header):
        raise SensorError("%s: the first line %s looks like data; the file needs a header line "
                          "naming its columns" % (where, ",".join(header)))
    if not rows:
        raise ConfigError("%s holds a header and no samples" % where)
    label_i = _column(header, opts.label_column, LABEL_COLUMN, where, "label",
                      required=source.label is None)
    subject_i = _column(header, opts.subject_column, SUBJECT_COLUMN, where, "subject", False)
    time_i = _column(header, opts.time_column, TIME_COLUMN, where, "time", False)
    special = {i for i in (label_i, subject_i, time_i) if i is not None}
    if channels is None:
        channels = opts.channels or tuple(
            name for i, name in enumerate(header) if i not in special and _is_number(rows[0][i]))
        if not channels:
            raise ConfigError("%s: no channel column (no other column's first value is a number); "
                              "name them with --channels" % where)
    missing = [name for name in channels if name not in header]
    if missing:
        raise ConfigError("%s has no channel column %s (columns: %s)" % (
            where, ", ".join(repr(x) for x in missing), ", ".join(header)))
    chan_i = [header.index(name) for name in channels]
    clash = [header[i] for i in chan_i if i in special]
    if clash:
        raise ConfigError("%s: %s is a channel and the label, subject or time column" % (
            where, ", ".join(clash)))
    x = _floats(rows, chan_i, list(channels), lines, where, "channel").astype(np.float32)
    if not np.isfinite(x).all():  # finite as float64, too large for float32
        r = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
        raise SensorError("%s line %d: a channel value is beyond float32's range" % (where, lines[r]))
    times = None
    if time_i is not None:
        times = _floats(rows, [time_i], [header[time_i]], lines, where, "time")[:, 0]
    labels = _given(rows, label_i, source.label, where, "label", lines, "folder")
    subjects = _given(rows, subject_i, source.subject, where, "subject", lines, "folder")
    if subjects is None:
        subjects = [source.path.stem] * len(rows)
    blank = [r for r, value in enumerate(subjects) if not value]
    if blank:
        raise SensorError("%s line %d: empty subject (%d rows have none)" % (
            where, lines[blank[0]], len(blank)))
    unused = tuple(name for i, name in enumerate(header) if i not in special and i not in chan_i)
    return Table(source.path, x, labels, subjects, times, np.asarray(lines, dtype=np.int64),
                 unused), channels


def _given(rows, index: Optional[int], folder: Optional[str], where: str, what: str, lines,
           by: str) -> Optional[List[str]]:
    """Per row the column's value (stripped), or the folder's; both given must agree."""
    if index is None:
        return None if folder is None else [folder] * len(rows)
    values = [row[index].strip() for row in rows]
    if folder is not None:
        for value, line in zip(values, lines):
            if value != folder:
                raise ConfigError("%s line %d: %s %r, but its %s says %r" % (
                    where, line, what, value, by, folder))
    return values


def _is_number(text: str) -> bool:
    """Whether ``text`` reads as a float (NaN and inf count: they are numbers, found bad later)."""
    try:
        float(text)
    except ValueError:
        return False
    return True


class Counts(NamedTuple):
    """What happened to the samples of the recordings, for the summary."""

    files: int
    samples: int
    ignored_rows: int
    pauses: int
    short_stretches: int
    short_samples: int
    uncovered_samples: int
    windows: int


class Windows(NamedTuple):
    """All windows cut, before the split: X float32 [N, T, C], class ids, subject ids."""

    X: Any
    y: Any
    subject: Any
    classes: Tuple[str, ...]
    channels: Tuple[str, ...]
    #: ``{id: name}`` of the subjects with windows (the first spelling, where 7 and 07 are one).
    subject_names: Dict[int, str]
    #: ``{name: id}`` of every spelling of a subject with windows.
    subject_ids: Dict[str, int]
    #: Subjects whose recordings give no window (all too short, or only ignored labels).
    windowless: Tuple[str, ...]
    counts: Counts
    unused: Tuple[str, ...]


def _sort_names(names) -> List[str]:
    """Names sorted as integers when every one is a non-negative integer, else as text."""
    names = sorted(set(names))
    if names and all(_INTEGER.match(n) for n in names):
        return sorted(names, key=lambda n: (int(n), n))
    return names


def number_subjects(names) -> Dict[str, int]:
    """``{subject name: id}``: the names' own numbers when all are non-negative integers (two
    spellings of one number, 7 and 07, are one subject), else the sorted names numbered from 0."""
    names = sorted(set(names))
    if names and all(_INTEGER.match(n) and int(n) <= _MAX_SUBJECT_ID for n in names):
        return {n: int(n) for n in names}
    return {n: i for i, n in enumerate(names)}


def _stretches(table: Table, opts: Options, ignored: set) -> Tuple[List[Tuple[int, int]], int, int]:
    """``[(start, end))`` runs of samples no window may cross: one file, one subject, no pause,
    no ignored row and, unless labels are majority, one label. Also the ignored rows and pauses."""
    import numpy as np

    n = len(table.labels)
    subj, lab = table.subjects, table.labels
    same_subject = np.fromiter((subj[i] == subj[i - 1] for i in range(1, n)), dtype=bool,
                               count=n - 1)
    cut = np.ones(n, dtype=bool)  # cut[i]: sample i starts a new stretch
    cut[1:] = ~same_subject
    if opts.label_windows == "pure":
        cut[1:] |= np.fromiter((lab[i] != lab[i - 1] for i in range(1, n)), dtype=bool,
                               count=n - 1)
    pauses = 0
    if table.times is not None and same_subject.any():
        steps = np.diff(table.times)
        back = np.flatnonzero(same_subject & (steps <= 0))
        if back.size:
            i = int(back[0]) + 1
            raise SensorError("%s line %d: time %r does not follow %r (line %d); sort the rows or "
                              "split the file where a recording starts again" % (
                                  table.path, table.lines[i], float(table.times[i]),
                                  float(table.times[i - 1]), table.lines[i - 1]))
        gap = opts.max_gap
        if gap is None:
            gap = GAP_FACTOR * float(np.median(steps[same_subject]))
        pause = same_subject & (steps > gap)
        pauses = int(pause.sum())
        cut[1:] |= pause
    keep = np.fromiter((x not in ignored for x in lab), dtype=bool, count=n)
    cut[1:] |= keep[1:] != keep[:-1]  # ignored rows are stretches of their own, left out below
    starts = np.flatnonzero(cut)
    ends = np.append(starts[1:], n)
    runs = [(int(s), int(e)) for s, e in zip(starts, ends) if keep[s]]
    return runs, int(n - keep.sum()), pauses


def build(sources: Sequence[Source], opts: Options) -> Windows:
    """Read every source and cut its windows; class and subject ids as the module says."""
    import numpy as np

    from streamfl.sensors.windower import majority_label

    ignored = set(opts.ignore_labels)
    tables: List[Table] = []
    channels = None
    unused: List[str] = []
    for source in sources:
        table, channels = read_table(source, opts, channels)
        tables.append(table)
        unused += [name for name in table.unused if name not in unused]
    labels_seen = {lab for t in tables for lab in t.labels if lab not in ignored}
    empty = [(t, i) for t in tables for i, lab in enumerate(t.labels) if lab == "" and "" not in ignored]
    if empty:
        t, i = empty[0]
        raise SensorError("%s line %d: empty label (%d rows have none; leave them out with "
                          "--ignore-label '')" % (t.path, t.lines[i], len(empty)))
    if opts.classes is not None:
        strange = sorted(labels_seen - set(opts.classes))
        if strange:
            raise ConfigError("labels not in --classes: %s" % ", ".join(repr(x) for x in strange))
        classes = opts.classes
    else:
        classes = tuple(_sort_names(labels_seen))
    class_id = {name: i for i, name in enumerate(classes)}
    subject_id = number_subjects(s for t in tables for s in t.subjects)
    xs, ys, subs = [], [], []
    totals = dict(samples=0, ignored_rows=0, pauses=0, short_stretches=0, short_samples=0,
                  uncovered_samples=0)
    W, step = opts.window, opts.step
    for table in tables:
        runs, ignored_rows, pauses = _stretches(table, opts, ignored)
        totals["samples"] += len(table.labels)
        totals["ignored_rows"] += ignored_rows
        totals["pauses"] += pauses
        ids = np.asarray([class_id.get(lab, -1) for lab in table.labels], dtype=np.int64)
        made = 0
        longest = 0
        for s, e in runs:
            n = e - s
            longest = max(longest, n)
            if n < W:
                totals["short_stretches"] += 1
                totals["short_samples"] += n
                continue
            starts = np.arange(s, e - W + 1, step)
            covered = len(starts) * W if step >= W else (len(starts) - 1) * step + W
            totals["uncovered_samples"] += n - covered
            xs.append(np.stack([table.x[a:a + W] for a in starts]))
            if opts.label_windows == "pure":
                ys.append(np.full(len(starts), ids[s], dtype=np.int64))
            else:
                ys.append(np.asarray([majority_label(ids[a:a + W]) for a in starts], dtype=np.int64))
            subs.append(np.full(len(starts), subject_id[table.subjects[s]], dtype=np.int64))
            made += len(starts)
        if made == 0:
            raise ConfigError("%s gives no window of %d samples: its longest stretch of one subject"
                              "%s without a pause has %d samples (lower --window%s)" % (
                                  table.path, W, " and label" if opts.label_windows == "pure" else "",
                                  longest, ", or try --label-windows majority"
                                  if opts.label_windows == "pure" else ""))
    X = np.concatenate(xs).astype(np.float32, copy=False)
    y = np.concatenate(ys)
    subject = np.concatenate(subs)
    per_class = np.bincount(y, minlength=len(classes))
    empty_classes = [classes[k] for k in range(len(classes)) if per_class[k] == 0]
    if empty_classes:
        raise ConfigError("class(es) %s have no window of %d samples (recordings too short, only "
                          "in ignored rows, or absent; lower --window or drop them from --classes)"
                          % (", ".join(repr(x) for x in empty_classes), W))
    if len(classes) < 2:
        raise ConfigError("one class only (%r): a classifier needs at least 2" % classes[0])
    counts = Counts(files=len(tables), windows=int(len(y)), **totals)
    present = set(subject.tolist())
    with_windows = {n: i for n, i in subject_id.items() if i in present}
    names: Dict[int, str] = {}
    for name in _sort_names(with_windows):
        names.setdefault(with_windows[name], name)
    windowless = tuple(n for n in _sort_names(subject_id) if n not in with_windows)
    return Windows(X, y, subject, tuple(classes), tuple(channels), names, with_windows, windowless,
                   counts, tuple(unused))


def choose_eval(data: Windows, eval_subjects: Optional[Tuple[str, ...]],
                eval_fraction: Optional[float], seed: int) -> List[int]:
    """The subject ids that go to eval.npz: the named ones, or a seeded share of all (at least one,
    never every one); a ``ConfigError`` where no subject would be left for training."""
    import numpy as np

    ids = sorted(data.subject_names)
    if eval_subjects is not None:
        out = []
        for name in eval_subjects:
            if name not in data.subject_ids:
                raise ConfigError("--eval-subjects: no subject %r with windows (subjects: %s)" % (
                    name, ", ".join(data.subject_names[i] for i in ids)))
            out.append(data.subject_ids[name])
        chosen = sorted(set(out))
    else:
        fraction = EVAL_FRACTION if eval_fraction is None else eval_fraction
        if not 0.0 <= fraction < 1.0:
            raise ConfigError("--eval-fraction must be in [0, 1), got %r" % fraction)
        if fraction == 0.0:
            return []
        if len(ids) < 2:
            raise ConfigError("one subject only (%s): holding one out leaves no subject for "
                              "training; give a subject column or one file per subject, or "
                              "--eval-fraction 0 for train.npz only" % data.subject_names[ids[0]])
        n = min(max(1, int(round(fraction * len(ids)))), len(ids) - 1)
        rng = np.random.default_rng(int(seed) & 0xFFFFFFFF)
        chosen = sorted(int(i) for i in rng.choice(ids, n, replace=False))
    if len(chosen) >= len(ids):
        raise ConfigError("every subject (%s) would go to eval.npz: none left for training" %
                          ", ".join(data.subject_names[i] for i in ids))
    return chosen


def write_npz(path: Path, data: Windows, mask) -> int:
    """Write the windows under ``mask`` in the dataset layout (plus ``channels``, ``subject_ids``,
    ``subject_names``), atomically; returns the window count."""
    import io

    import numpy as np

    from streamfl.fileio import atomic_write
    from streamfl.sensors.datasets import validate

    X, y, subject = data.X[mask], data.y[mask], data.subject[mask]
    ids = sorted(set(subject.tolist()))
    checked = validate(X, y, subject, np.asarray(data.classes, dtype=str), str(path))
    buf = io.BytesIO()
    np.savez_compressed(buf, channels=np.asarray(data.channels, dtype=str),
                        subject_ids=np.asarray(ids, dtype=np.int64),
                        subject_names=np.asarray([data.subject_names[i] for i in ids], dtype=str),
                        **checked._asdict())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, buf.getvalue())
    except OSError as exc:
        raise StorageError("cannot write %s: %s" % (path, exc.strerror or exc)) from exc
    return int(len(y))


def summary(data: Windows, opts: Options, eval_ids: List[int]) -> str:
    """The printed report: what was read, what was left out, and windows per class and subject in
    each file."""
    import numpy as np

    c = data.counts
    train = ~np.isin(data.subject, eval_ids)
    lines = ["read %d file(s): %d samples of %d channels (%s)%s" % (
        c.files, c.samples, len(data.channels), ", ".join(data.channels),
        "; columns not used: %s" % ", ".join(data.unused) if data.unused else "")]
    lines.append("windows: %d of %d samples every %d (%s labels)" % (
        c.windows, opts.window, opts.step, opts.label_windows))
    lines.append("samples in no window: %d (stretches shorter than a window: %d, %d samples; tails "
                 "and steps past the window: %d; rows of ignored labels: %d); pauses cut: %d" % (
                     c.short_samples + c.uncovered_samples + c.ignored_rows, c.short_stretches,
                     c.short_samples, c.uncovered_samples, c.ignored_rows, c.pauses))
    rows = []
    for k, name in enumerate(data.classes):
        sel = data.y == k
        rows.append(("class %d %s" % (k, name), int((sel & train).sum()), int((sel & ~train).sum())))
    for i in sorted(data.subject_names):
        name = data.subject_names[i]
        n = int((data.subject == i).sum())
        rows.append(("subject %s" % (name if name == str(i) else "%s (id %d)" % (name, i)),
                     "-" if i in eval_ids else n, n if i in eval_ids else "-"))
    width = max(len(row[0]) for row in rows)
    lines.append("%-*s %8s %8s" % (width, "windows per", "train", "eval"))
    lines += ["%-*s %8s %8s" % (width, *row) for row in rows]
    if data.windowless:
        lines.append("subjects without a window: %s" % ", ".join(data.windowless))
    if eval_ids:
        lines.append("eval subjects: %s" % ", ".join(data.subject_names[i] for i in eval_ids))
    else:
        lines.append("no eval subjects (--eval-fraction 0): train.npz only")
    return "\n".join(lines)


def run(args) -> int:
    """``streamfl dataset``: find, read, cut, split, write, print."""
    import numpy as np

    opts = options_from_args(args)
    sources, ignored_files = find_sources(args.inputs, opts.layout)
    data = build(sources, opts)
    eval_ids = choose_eval(data, _names(args.eval_subjects, "--eval-subjects"),
                           args.eval_fraction, args.seed)
    out = Path(args.out)
    held = np.isin(data.subject, eval_ids)
    missing = [data.classes[k] for k in range(len(data.classes)) if not (data.y[~held] == k).any()]
    if missing:
        raise ConfigError("class(es) %s have windows only in the eval subjects (%s); choose other "
                          "--eval-subjects or --seed" % (", ".join(repr(x) for x in missing),
                                                          ", ".join(data.subject_names[i]
                                                                    for i in eval_ids)))
    print(summary(data, opts, eval_ids))
    if ignored_files:
        print("files not ending in %s left out: %d" % (SUFFIX, ignored_files))
    n_train = write_npz(out / "train.npz", data, ~held)
    print("wrote %s: %d windows of %d x %d, %d classes" % (
        out / "train.npz", n_train, opts.window, len(data.channels), len(data.classes)))
    if eval_ids:
        n_eval = write_npz(out / "eval.npz", data, held)
        print("wrote %s: %d windows" % (out / "eval.npz", n_eval))
    elif (out / "eval.npz").exists():
        print("note: %s is left from an earlier run" % (out / "eval.npz"))
    return 0
