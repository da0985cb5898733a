"""One run, one record: a run's folder, time axis and processes across coordinator restarts.

A run is the state folder's run identity (``run_id``); it outlives the coordinator processes that
continue it (a clean restart, a kill -9, an upgrade). Its record is the run folder's
``metrics.jsonl`` and ``summary.json``, and it spans all of them:

- **Its folder** is part of the run: the state folder's ``run.json`` (saved before anything is
  published) remembers it with the run's start, so a restart without ``--run-dir`` goes on in it
  (before, each process made a new ``runs/<timestamp>``). An explicit ``--run-dir`` elsewhere moves
  the record: the folder's earlier ``metrics.jsonl`` is copied into the new one when it has none,
  and ``run.json`` names the new one from then on (the old folder is left as it was).
- **A folder holding another run's record** (its process lines name another ``run_id``, or a
  fresh state meets lines from before process lines) has it moved aside, never appended to:
  ``metrics.jsonl`` becomes ``metrics.<that run>.jsonl`` (``summary.json`` likewise), logged; when
  that run starts again in the folder and finds no record of its own there, it moves its record back.
- **Its time axis**: every line's ``time_s`` is seconds since the run started; a process starts
  its axis at the wall-clock time since the run's start, or just after the record's last line when
  the wall clock says less (it was set back): ``time_s`` never runs backwards nor restarts at 0.
- **Its processes**: each writes a ``process_start`` line (pid, host, instance, software, what it
  resumed from: the saved version, the highest version the record reached, and how the process
  before it ended) and, at a stop, a ``process_stop`` line (how it ended, its own counters). A
  process with a start line and no stop line ended without one (killed, crashed, lost power). A
  record from before process lines is split where ``time_s`` falls back (each such fall is a
  process start).
- **Its figures**: a starting process feeds the earlier processes' ``update`` and ``eval`` lines
  to its fleet table, so the live view and the ``summary.json`` at stop count the whole run; the
  server's own counters, which a process does not save, are summed over the processes' stop
  lines (``run_counters``); the core's are saved with the state and continue by themselves.
  The record is read once, one line at a time, keeping per line only its time and kind
  (``Scan``): tens of MB and a few seconds per hundred thousand lines, at start only.
"""
import json
import logging
import math
import os
import shutil
import socket
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Dict, Iterator, List, Mapping, Optional, Tuple

from streamfl.coordinator.metrics import (METRICS_FILE, PROCESS_START, PROCESS_STOP, axis_times,
                                          iter_metrics, start_indices)
from streamfl.coordinator.run_summary import SUMMARY_FILE
from streamfl.errors import StateFileError
from streamfl.fileio import atomic_write

log = logging.getLogger(__name__)

#: The run's identity, start and folder, in the state folder.
RUN_FILE = "run.json"
#: How far past the record's last line a process starts its axis when the wall clock is behind it
#: (seconds): enough to keep ``time_s`` strictly growing at the lines' 6 decimals.
AFTER_LAST_S = 0.001
#: A process that ended without a stop line, in words.
NO_STOP = "no stop line (killed, crashed or lost power)"
#: Counters that are gauges, not counts: the run's value is the last process's.
GAUGES = ("version", "queue_depth")


def default_run_dir() -> Path:
    """A new run's folder when nobody names one: ``runs/<timestamp>``."""
    return Path("runs") / time.strftime("%Y%m%d-%H%M%S")


@dataclass
class Scan:
    """A record read once, in little memory: each timed line's time on the run's axis and its kind;
    the process lines themselves (few) are kept whole."""

    #: Each line's ``time_s`` on one axis (``axis_times``), in file order.
    axis: "array" = field(default_factory=lambda: array("d"))
    #: Its kind: ``OTHER``, ``COUNTED`` (update, eval), ``START``, ``STOP``.
    kinds: "array" = field(default_factory=lambda: array("b"))
    #: The process lines by their index.
    marks: Dict[int, Dict[str, Any]] = field(default_factory=dict)
    #: Line indices where a process starts (``start_indices``).
    starts: List[int] = field(default_factory=list)
    #: The run the record belongs to: its last start line's ``run_id`` (None: no start lines).
    owner: Optional[str] = None
    #: The highest global version an update or eval line names (None: none).
    version: Optional[int] = None
    #: The global version after each ``update`` line of the last process (since the last start
    #: line): those above the version the next process resumed at were rolled back by its end.
    tail_versions: "array" = field(default_factory=lambda: array("q"))
    #: The first line's ``wall_s`` minus its ``time_s`` (the run's start, as a record from before
    #: ``run.json`` tells it), None without one.
    origin_wall_s: Optional[float] = None

    def __len__(self) -> int:
        return len(self.axis)

    def processes(self) -> List[Dict[str, Any]]:
        """The coordinator processes of the record, oldest first: when each started and was last
        heard of, how it ended, and (from its stop line) its own counters."""
        out: List[Dict[str, Any]] = []
        bounds = list(self.starts) + [len(self.axis)]
        for begin, end in zip(bounds, bounds[1:]):
            t0, t1 = round(self.axis[begin], 3), round(self.axis[end - 1], 3)
            proc: Dict[str, Any] = {"started_t_s": t0, "last_t_s": t1, "ended": NO_STOP,
                                    "lines": end - begin}
            head = self.marks.get(begin) if self.kinds[begin] == START else None
            if head is not None:
                proc.update({k: head.get(k) for k in ("instance", "pid", "host", "software",
                                                      "resumed_version", "previous_ended")})
                proc["started"] = _iso(head.get("wall_s"))
            else:
                proc["ended"] = "unknown (recorded before process lines)"
            stops = [i for i in range(begin, end) if self.kinds[i] == STOP]
            if stops:
                stop = self.marks[stops[-1]]
                proc.update(ended=str(stop.get("ended") or "stopped"),
                            stopped_t_s=round(self.axis[stops[-1]], 3),
                            counters=_counts(stop.get("counters")),
                            implausible_telemetry=_counts(stop.get("implausible_telemetry")))
            out.append(proc)
        return out


#: A scanned line's kind.
OTHER, COUNTED, START, STOP = 0, 1, 2, 3
_KINDS = {"update": COUNTED, "eval": COUNTED, PROCESS_START: START, PROCESS_STOP: STOP}


def _time(rec: Mapping[str, Any]) -> Optional[float]:
    """A line's ``time_s`` if it is a finite number (a line without one has no place on the axis)."""
    t = rec.get("time_s")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        return None
    return float(t)


def _timed_lines(path: Path) -> Iterator[Tuple[float, Dict[str, Any]]]:
    """The record's timed lines, in order; ``StateFileError`` if it cannot be read."""
    try:
        for rec in iter_metrics(path):
            t = _time(rec)
            if t is not None:
                yield t, rec
    except (OSError, UnicodeDecodeError) as exc:
        raise StateFileError("cannot read the run's record %s: %s" % (path, exc)) from None


def _first(path: Path) -> Tuple[Optional[str], Optional[float], bool]:
    """The run a record belongs to (its first start line's ``run_id``; None: none), the run's start
    as its first line tells it (``wall_s - time_s``; None: no ``wall_s``), and whether it has lines;
    read only as far as the first start line."""
    origin, any_line = None, False
    for t, rec in _timed_lines(path):
        if not any_line:
            any_line, wall = True, rec.get("wall_s")
            if isinstance(wall, (int, float)) and not isinstance(wall, bool):
                origin = float(wall) - t
        if rec.get("event") == PROCESS_START:
            return (rec["run_id"] if isinstance(rec.get("run_id"), str) else None), origin, True
    return None, origin, any_line


def scan(path: Path, feed: Optional[Callable[[Dict[str, Any], float], None]] = None,
         started_wall_s: Optional[float] = None) -> Scan:
    """Read a record once (``Scan``), handing each ``update`` and ``eval`` line to ``feed`` with
    its time since ``started_wall_s`` by its ``wall_s`` (or its ``time_s``)."""
    out = Scan()
    times, walls = array("d"), []
    for t, rec in _timed_lines(path):
        kind = _KINDS.get(rec.get("event"), OTHER)
        if kind == COUNTED and feed is not None:
            wall = rec.get("wall_s")
            feed(rec, float(wall) - started_wall_s if started_wall_s is not None and isinstance(
                wall, (int, float)) and not isinstance(wall, bool) else t)
        if kind in (START, STOP):
            out.marks[len(times)] = rec
            if kind == START:
                out.tail_versions = array("q")
                if isinstance(rec.get("run_id"), str):
                    out.owner = rec["run_id"]
        elif kind == COUNTED:
            v = rec.get("version")
            if isinstance(v, int) and not isinstance(v, bool):
                out.version = v if out.version is None else max(out.version, v)
                if rec.get("event") == "update":
                    out.tail_versions.append(v)
        wall = rec.get("wall_s")
        if not times and isinstance(wall, (int, float)) and not isinstance(wall, bool):
            out.origin_wall_s = float(wall) - t
        times.append(t)
        walls.append(wall if isinstance(wall, (int, float)) and not isinstance(wall, bool) else None)
        out.kinds.append(kind)
    if times:
        out.starts = start_indices(times, [k == START for k in out.kinds])
        out.axis = array("d", axis_times(times, walls))
    return out


def run_counters(current: Mapping[str, int], earlier: List[Mapping[str, Any]],
                 carried: Collection[str]) -> Dict[str, int]:
    """The run's counters: ``carried`` ones (saved with the state: the core's) and ``GAUGES`` as
    ``current`` has them, every other the sum of ``current`` and each earlier process's stop line
    (a process without one adds nothing: its counts are unknown, ``processes`` says which)."""
    out = dict(current)
    for proc in earlier:
        for key, value in (proc.get("counters") or {}).items():
            if key in carried or key in GAUGES or not isinstance(value, int) or isinstance(value, bool):
                continue
            out[key] = out.get(key, 0) + value
    return dict(sorted(out.items()))


def _counts(value: Any) -> Dict[str, int]:
    """A stop line's counts: its integer values by name (anything else is dropped)."""
    if not isinstance(value, dict):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool)}


def _iso(wall_s: Any) -> Optional[str]:
    if not isinstance(wall_s, (int, float)) or isinstance(wall_s, bool):
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(wall_s))


@dataclass
class RunRecord:
    """What a starting process knows of its run's record (``open_run``)."""

    run_id: str
    run_dir: Path
    started_wall_s: float
    #: Seconds since the run started at this process's start: its lines' ``time_s`` begin here.
    offset_s: float
    #: The earlier processes (``processes``).
    earlier: List[Dict[str, Any]] = field(default_factory=list)
    #: How many earlier ``update`` and ``eval`` lines were fed back, and how many could not be.
    fed: int = 0
    not_fed: int = 0
    #: The highest global version the record reached (None: no update or eval line).
    record_version: Optional[int] = None
    #: How the time axis was continued: "wall clock" or "after the record's last line".
    time_from: str = "wall clock"
    #: The version after each update the last process handled (``Scan.tail_versions``).
    tail_versions: "array" = field(default_factory=lambda: array("q"))

    def rolled_back(self, resumed_version: int) -> int:
        """Updates the last process handled into a version above the saved one this process
        resumes at: their effect ended with that process (a kill -9 before its next save), so a
        record that says they were aggregated is corrected here. A lower bound: an update that made
        no version after the last save is not told apart. With the durable intake
        (``coordinator/intake.py``) such updates are applied again from its journal."""
        return sum(1 for v in self.tail_versions if v > resumed_version)

    def start_line(self, *, instance: str, software: str, resumed_version: int,
                   fresh: bool) -> Dict[str, Any]:
        """This process's ``process_start`` line (its ``time_s`` is set by the writer)."""
        prev = self.earlier[-1] if self.earlier else None
        return {"event": PROCESS_START, "run_id": self.run_id, "instance": instance,
                "pid": os.getpid(), "host": socket.gethostname(), "software": software,
                "resumed_from": "new run" if fresh else "state folder",
                "resumed_version": resumed_version, "record_version": self.record_version,
                "previous_instance": prev.get("instance") if prev else None,
                "previous_ended": prev["ended"] if prev else None,
                "previous_last_t_s": prev["last_t_s"] if prev else None,
                "processes_before": len(self.earlier), "time_from": self.time_from,
                "rolled_back_updates": self.rolled_back(resumed_version),
                "rolled_back_versions": max(0, (self.record_version or 0) - resumed_version)}


def _read_run_file(state_dir: Path) -> Optional[Dict[str, Any]]:
    path = Path(state_dir) / RUN_FILE
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StateFileError("%s cannot be read (%s): fix or remove it (the run then continues in "
                             "the folder --run-dir names)" % (path, exc)) from None
    if (not isinstance(saved, dict) or not isinstance(saved.get("run_id"), str)
            or not isinstance(saved.get("run_dir"), str)
            or not isinstance(saved.get("started_wall_s"), (int, float))):
        raise StateFileError("%s: expected run_id, run_dir and started_wall_s: fix or remove it" % path)
    return saved


def _save_run_file(state_dir: Path, run_id: str, run_dir: Path, started_wall_s: float) -> None:
    path = Path(state_dir) / RUN_FILE
    body = {"run_id": run_id, "run_dir": str(Path(run_dir).resolve()),
            "started_wall_s": round(started_wall_s, 3)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, (json.dumps(body, indent=1) + "\n").encode("utf-8"))
    except OSError as exc:
        raise StateFileError("cannot write %s: %s" % (path, exc)) from None


def _aside_name(name: str, tag: str) -> str:
    stem, dot, ext = name.partition(".")
    return "%s.%s%s%s" % (stem, tag, dot, ext)


def _move_back(run_dir: Path, run_id: str) -> None:
    """This run's record, which another run's start moved aside (two state folders on one run
    folder), back in place."""
    for name in (METRICS_FILE, SUMMARY_FILE):
        aside, path = run_dir / _aside_name(name, run_id), run_dir / name
        if aside.is_file() and not path.exists():
            try:
                aside.rename(path)
            except OSError as exc:
                raise StateFileError("cannot move run %s's record %s back to %s: %s" % (
                    run_id, aside, path, exc)) from None
            log.warning("%s is this run's record, moved aside by another run's start: moved back to %s",
                        aside, path)


def _move_aside(run_dir: Path, tag: str) -> None:
    """Another run's record in ``run_dir``: renamed ``metrics.<tag>.jsonl`` (and the summary), so
    this run's starts empty and nothing of the other is lost."""
    for name in (METRICS_FILE, SUMMARY_FILE):
        path = run_dir / name
        if path.exists():
            aside, n = run_dir / _aside_name(name, tag), 1
            while aside.exists():
                aside, n = run_dir / _aside_name(name, "%s-%d" % (tag, n)), n + 1
            try:
                path.rename(aside)
            except OSError as exc:
                raise StateFileError("%s holds another run's record and cannot be moved aside (%s): "
                                     "give another --run-dir" % (path, exc)) from None
            log.warning("%s holds the record of another run: moved aside to %s", path, aside)


def open_run(state_dir: Path, run_id: str, asked_dir: Optional[Path], fresh: bool, wall_now: float,
             on_update: Optional[Callable[[Dict[str, Any], float], None]] = None,
             on_eval: Optional[Callable[[Dict[str, Any], float], None]] = None) -> RunRecord:
    """The run's record for a starting process: its folder (``asked_dir``, else the one the state
    folder remembers, else ``default_run_dir()``), time origin and earlier processes, read in one
    pass that hands each earlier ``update`` and ``eval`` line to ``on_update`` / ``on_eval`` (with
    its time on this process's clock, so before 0: the fleet table's); ``run.json`` is saved
    before this returns. ``fresh``: the state folder was just made (a new run).
    ``StateFileError`` if ``run.json`` or the record is unreadable, or ``run.json`` cannot be
    written."""
    saved = _read_run_file(state_dir)
    if saved is not None and saved["run_id"] != run_id:
        log.warning("%s names run %s, not this state's run %s: ignored", Path(state_dir) / RUN_FILE,
                    saved["run_id"], run_id)
        saved = None
    run_dir = Path(asked_dir) if asked_dir is not None else (
        Path(saved["run_dir"]) if saved is not None else default_run_dir())
    path = run_dir / METRICS_FILE
    owner, origin, any_line = _first(path)
    if any_line and (owner not in (None, run_id) or (owner is None and fresh)):
        _move_aside(run_dir, owner or "before-%s" % time.strftime("%Y%m%d-%H%M%S"))
        origin, any_line = None, False
    if not any_line and not path.exists() and (run_dir / _aside_name(METRICS_FILE, run_id)).is_file():
        _move_back(run_dir, run_id)  # this run's record, moved aside by another run's start
        owner, origin, any_line = _first(path)
    before = Path(saved["run_dir"]) if saved is not None else None
    if (not any_line and before is not None and before.resolve() != run_dir.resolve()
            and not path.exists() and (before / METRICS_FILE).is_file()):
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(str(before / METRICS_FILE), str(path))
        except OSError as exc:
            raise StateFileError("cannot copy run %s's record from %s into %s: %s" % (
                run_id, before, run_dir, exc)) from None
        log.warning("run %s's record moves from %s to %s (--run-dir): its metrics.jsonl so far is "
                    "copied there; %s is left as it was", run_id, before, run_dir, before)
        owner, origin, any_line = _first(path)
    if saved is not None:
        started = float(saved["started_wall_s"])
    elif origin is not None:
        started = origin  # a record from before run.json
    else:
        started = wall_now
    offset = max(0.0, wall_now - started)
    counts = {"fed": 0, "not_fed": 0}

    def feed(rec: Dict[str, Any], t_s: float) -> None:
        event = rec.get("event")
        handler = on_update if event == "update" else on_eval
        if handler is None:
            return
        try:
            handler(rec, t_s - offset)
        except (TypeError, ValueError, KeyError) as exc:  # a line edited or damaged by hand
            counts["not_fed"] += 1
            if counts["not_fed"] == 1:
                log.warning("run %s: an earlier %s line is not counted (%s)", run_id, event, exc)
            return
        counts["fed"] += 1

    found = scan(path, feed, started) if any_line else Scan()
    if counts["not_fed"]:
        log.warning("run %s: %d earlier line(s) of the record could not be counted", run_id,
                    counts["not_fed"])
    time_from = "wall clock"
    last = max(found.axis) if len(found) else None
    if last is not None and offset <= last:
        offset, time_from = last + AFTER_LAST_S, "after the record's last line"
        log.warning("the wall clock says %.1f s since run %s started, its record already reaches "
                    "%.1f s: this process's times continue after the record's last line",
                    wall_now - started, run_id, last)
    _save_run_file(state_dir, run_id, run_dir, started)
    return RunRecord(run_id=run_id, run_dir=run_dir, started_wall_s=started, offset_s=offset,
                     earlier=found.processes(), fed=counts["fed"], not_fed=counts["not_fed"],
                     record_version=found.version, time_from=time_from,
                     tail_versions=found.tail_versions)
