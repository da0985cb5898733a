"""metrics.jsonl, written and read: append-only JSON lines; a full disk never stops training.

One line per event (``eval``, ``update``, ...), flushed as written so a crash loses at most the line
being written; the next writer ends such a torn line before its first, so that one is not lost too. Write errors are logged (first one and then every 100th) and counted.

The coordinator writes it with ``MetricsWriter``; the simulator writes the same kind of lines, one
file for all its runs, each event tagged with ``method`` and ``seed``. Every line carries ``time_s``:
seconds since the run started, across all the coordinator processes of the run (each marks its
start with a ``process_start`` line and a clean stop with ``process_stop``; ``run_record.py``), or
virtual seconds in the simulator; a coordinator's lines also carry ``wall_s`` (Unix time).
``read_metrics`` is the one reader of both, for the demo's summary and plots and for ``streamfl
report``; ``run_times`` puts a record from before process lines (each process restarted at 0) on
one axis, ``process_starts`` says where each process began.
"""
import json
import logging
import math
from pathlib import Path
from typing import Any, Collection, Dict, Iterator, List, Mapping, Optional, Sequence

from streamfl.errors import StreamflError

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
#: The lines that mark a coordinator process's start and clean stop (``run_record.py``).
PROCESS_START, PROCESS_STOP = "process_start", "process_stop"


class MetricsWriter:
    """Appends one JSON object per line to ``path``, flushing each line."""

    def __init__(self, path: Path, tags: Optional[Dict[str, Any]] = None):
        self.path = Path(path)
        #: Fields every line gets unless it has its own (a real run's ``method`` and ``seed``, so
        #: ``streamfl report`` reads it as a simulator run of one seed).
        self.tags = dict(tags or {})
        self.lines = 0
        self.errors = 0
        self._fh = None
        self._closed = False

    @classmethod
    def in_run_dir(cls, run_dir: Path, tags: Optional[Dict[str, Any]] = None) -> "MetricsWriter":
        return cls(Path(run_dir) / METRICS_FILE, tags)

    def _open(self):
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            torn = _ends_torn(self.path)
            self._fh = open(self.path, "a", encoding="utf-8")
            if torn:  # the half line a killed process left: ours must not be glued to it
                self._fh.write("\n")
        return self._fh

    def write(self, record: Dict[str, Any]) -> bool:
        """Append ``record``; False (logged, counted) if it could not be written."""
        if self._closed:
            return False
        if self.tags:
            record = dict(self.tags, **record)
        try:
            line = json.dumps(record, sort_keys=True, allow_nan=True, default=_plain)
            fh = self._open()
            fh.write(line + "\n")
            fh.flush()
        except (OSError, ValueError, TypeError) as exc:
            self.errors += 1
            if self.errors == 1 or self.errors % 100 == 0:
                log.error("cannot write metrics to %s (%d errors so far): %s", self.path, self.errors, exc)
            self._reset()
            return False
        self.lines += 1
        return True

    def _reset(self) -> None:
        # After a failed write the buffered partial line must not be retried: reopen next time.
        fh, self._fh = self._fh, None
        if fh is not None:
            try:
                fh.close()
            except (OSError, ValueError):
                pass

    def close(self) -> None:
        self._reset()
        self._closed = True


def _ends_torn(path: Path) -> bool:
    """Whether ``path`` ends inside a line (a process killed while it wrote one)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            if fh.tell() == 0:
                return False
            fh.seek(-1, 2)
            return fh.read(1) != b"\n"
    except OSError:
        return False


def _plain(value: Any) -> Optional[Any]:
    """JSON fallback for numpy scalars."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError("not JSON serializable: %r" % type(value).__name__)


# ---- reading ------------------------------------------------------------------------------------

#: Types of the fields readers rely on; a number may also be null or NaN unless it is required.
FIELD_TYPES: Dict[str, tuple] = {"method": (str,), "seed": (int,), "time_s": (int, float),
                                 "clock_levels": (dict,)}
FIELD_TYPES.update((k, (int, float)) for k in ("accuracy", "accuracy_seen", "energy_j", "fisher_global"))


def read_metrics(path: Path, strict: bool = False, events: Optional[Collection[str]] = None,
                 required: Collection[str] = ()) -> List[Dict[str, Any]]:
    """The records of a metrics.jsonl, in file order.

    Lenient (the default, for a file a coordinator may still be writing): a missing file is empty
    and a line that is not JSON (a half-written last line) is skipped. ``strict`` (a finished run,
    which has no partial lines to forgive): a missing file, a line that is not a JSON object, or a
    kept event whose fields of ``FIELD_TYPES`` have the wrong type (or whose ``required`` fields are
    missing, or a NaN ``time_s``) raise ``StreamflError`` naming the file and the line. ``events``
    keeps only those event kinds.
    """
    return list(iter_metrics(path, strict, events, required))


def iter_metrics(path: Path, strict: bool = False, events: Optional[Collection[str]] = None,
                 required: Collection[str] = ()) -> Iterator[Dict[str, Any]]:
    """``read_metrics`` one record at a time (a long run's record need not fit in memory)."""
    path = Path(path)
    if not path.is_file():
        if strict:
            raise StreamflError("%s: not found (is this a run directory?)" % path)
        return
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as exc:
                if strict:
                    raise StreamflError("%s line %d: not valid JSON (%s)" % (path, lineno, exc)) from None
                log.debug("skipping partial metrics line in %s", path)
                continue
            if not isinstance(rec, dict):
                if strict:
                    raise StreamflError("%s line %d: expected a JSON object" % (path, lineno))
                continue
            if events is not None and rec.get("event") not in events:
                continue
            if strict:
                problem = _check_fields(rec, required)
                if problem:
                    raise StreamflError("%s line %d: %s" % (path, lineno, problem))
            yield rec


def _check_fields(rec: Dict[str, Any], required: Collection[str]) -> Optional[str]:
    """What is wrong with a record's known fields, or None."""
    for key, types in FIELD_TYPES.items():
        value, needed = rec.get(key), key in required
        if (value is not None or needed) and (not isinstance(value, types) or isinstance(value, bool)
                                              or (key == "time_s" and math.isnan(value))):
            return "%s event with %s %r" % (rec.get("event"), "a missing or bad" if needed else "a bad", key)
    return None


def elapsed_s(records: List[Dict[str, Any]]) -> List[float]:
    """Seconds since the first record, on one axis across coordinator processes (``run_times``)."""
    times = run_times(records)
    return [t - times[0] for t in times] if times else []


def run_times(records: List[Mapping[str, Any]]) -> List[float]:
    """The records' ``time_s`` on one axis (``axis_times``)."""
    return axis_times([float(r["time_s"]) for r in records], [r.get("wall_s") for r in records])


def axis_times(times: Sequence[float], walls: Sequence[Any]) -> List[float]:
    """Times on one axis: as written where they never fall back (one process, or a record with
    process lines); in a record from before them, where each process restarted at 0, wall time
    since the first process started (``walls``: each line's ``wall_s``, every coordinator line has
    it), else each process's times after the last of the one before."""
    if all(b >= a for a, b in zip(times, times[1:])):
        return list(times)
    if all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in walls):
        origin = float(walls[0]) - times[0]
        return [float(w) - origin for w in walls]
    out: List[float] = []
    shift = 0.0
    for i, t in enumerate(times):
        if i and t + shift < out[-1]:
            shift = out[-1] - t
        out.append(t + shift)
    return out


def start_indices(times: Sequence[float], is_start: Sequence[bool]) -> List[int]:
    """Where coordinator processes start in a record: each ``process_start`` line, the first line,
    and, before the first start line, each time below the one before it (a process from before
    process lines, whose clock restarted at 0). ``times``: each line's ``time_s`` as written."""
    first = next((i for i, s in enumerate(is_start) if s), len(is_start))
    return [i for i in range(len(times))
            if i == 0 or is_start[i] or (i < first and times[i] < times[i - 1])]


def process_starts(records: List[Mapping[str, Any]]) -> List[float]:
    """When each coordinator process of a record started, on the record's axis (``run_times``)."""
    axis = run_times(records)
    return [axis[i] for i in start_indices([float(r["time_s"]) for r in records],
                                           [r.get("event") == PROCESS_START for r in records])]
