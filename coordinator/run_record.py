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
  ``metrics.jsonl`` becomes ``metrics.<that run>.jsonl`` (``summary.json`` likewise), logged.
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
"""
import json
import logging
import math
import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Dict, List, Mapping, Optional

from streamfl.coordinator.metrics import (METRICS_FILE, PROCESS_START, PROCESS_STOP, first_start,
                                          read_metrics, run_times, starts_here)
from streamfl.coordinator.run_summary import SUMMARY_FILE
from streamfl.errors import StateFileError
from streamfl.fileio import atomic_write

log = logging.getLogger(__name__)

#: The run's identity, start and folder, in the state folder.
RUN_FILE = "run.json"
#: The events a starting process reads back from the record.
READ_BACK = ("update", "eval", PROCESS_START, PROCESS_STOP)
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


def processes(records: List[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """The coordinator processes of a record, oldest first: when each started and was last heard
    of, how it ended, and (from its stop line) its own counters."""
    times, first = run_times(records), first_start(records)
    out: List[Dict[str, Any]] = []
    current: Optional[Dict[str, Any]] = None
    for i, (rec, t) in enumerate(zip(records, times)):
        event = rec.get("event")
        if starts_here(records, i, first):
            current = {"started_t_s": round(t, 3), "last_t_s": round(t, 3), "ended": NO_STOP,
                       "lines": 0}
            if event == PROCESS_START:
                current.update({k: rec.get(k) for k in ("instance", "pid", "host", "software",
                                                        "resumed_version", "previous_ended")})
                current["started"] = _iso(rec.get("wall_s"))
            else:
                current["ended"] = "unknown (recorded before process lines)"
            out.append(current)
        current["lines"] += 1
        current["last_t_s"] = round(t, 3)
        if event == PROCESS_STOP:
            current.update(ended=str(rec.get("ended") or "stopped"), stopped_t_s=round(t, 3),
                           counters=_counts(rec.get("counters")),
                           implausible_telemetry=_counts(rec.get("implausible_telemetry")))
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
    #: The earlier processes' ``update`` and ``eval`` lines, in order (dropped once fed).
    lines: List[Dict[str, Any]] = field(default_factory=list)
    #: The highest global version the record reached (None: no update or eval line).
    record_version: Optional[int] = None
    #: How the time axis was continued: "wall clock" or "after the record's last line".
    time_from: str = "wall clock"

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
                "processes_before": len(self.earlier), "time_from": self.time_from}

    def feed(self, on_update: Callable[[Dict[str, Any], float], None],
             on_eval: Callable[[Dict[str, Any], float], None]) -> int:
        """Hand the earlier ``update`` and ``eval`` lines to the fleet table (their time on this
        process's clock, so before 0); returns how many."""
        n = skipped = 0
        for rec in self.lines:
            t = float(rec["time_s"]) - self.offset_s
            try:
                if rec.get("event") == "update":
                    on_update(rec, t)
                elif rec.get("event") == "eval":
                    on_eval(rec, t)
                else:
                    continue
            except (TypeError, ValueError, KeyError) as exc:  # a line edited or damaged by hand
                skipped += 1
                if skipped == 1:
                    log.warning("run %s: an earlier %s line is not counted (%s)", self.run_id,
                                rec.get("event"), exc)
                continue
            n += 1
        if skipped:
            log.warning("run %s: %d earlier line(s) of the record could not be counted", self.run_id, skipped)
        self.lines = []
        return n


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


def _timed(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The records with a finite number for ``time_s`` (a line without one has no place on the axis)."""
    return [r for r in records if isinstance(r.get("time_s"), (int, float))
            and not isinstance(r.get("time_s"), bool) and math.isfinite(r["time_s"])]


def _read(path: Path) -> List[Dict[str, Any]]:
    """The record's lines a starting process reads back; ``StateFileError`` if it cannot read them."""
    try:
        return _timed(read_metrics(path, events=READ_BACK))
    except (OSError, UnicodeDecodeError) as exc:
        raise StateFileError("cannot read the run's record %s: %s" % (path, exc)) from None


def _record_run_id(records: List[Mapping[str, Any]]) -> Optional[str]:
    """The run a record belongs to: its last process line's ``run_id`` (None: no process lines)."""
    for rec in reversed(records):
        if rec.get("event") == PROCESS_START and isinstance(rec.get("run_id"), str):
            return rec["run_id"]
    return None


def _move_aside(run_dir: Path, tag: str) -> None:
    """Another run's record in ``run_dir``: renamed ``metrics.<tag>.jsonl`` (and the summary), so
    this run's starts empty and nothing of the other is lost."""
    for name in (METRICS_FILE, SUMMARY_FILE):
        path = run_dir / name
        if path.exists():
            stem, dot, ext = name.partition(".")
            aside = run_dir / ("%s.%s%s%s" % (stem, tag, dot, ext))
            n = 1
            while aside.exists():
                aside, n = run_dir / ("%s.%s-%d%s%s" % (stem, tag, n, dot, ext)), n + 1
            try:
                path.rename(aside)
            except OSError as exc:
                raise StateFileError("%s holds another run's record and cannot be moved aside (%s): "
                                     "give another --run-dir" % (path, exc)) from None
            log.warning("%s holds the record of another run: moved aside to %s", path, aside)


def open_run(state_dir: Path, run_id: str, asked_dir: Optional[Path], fresh: bool,
             wall_now: float) -> RunRecord:
    """The run's record for a starting process: its folder (``asked_dir``, else the one the state
    folder remembers, else ``default_run_dir()``), time origin and earlier processes; ``run.json``
    is saved before this returns. ``fresh``: the state folder was just made (a new run).
    ``StateFileError`` if ``run.json`` is unreadable or cannot be written."""
    saved = _read_run_file(state_dir)
    if saved is not None and saved["run_id"] != run_id:
        log.warning("%s names run %s, not this state's run %s: ignored", Path(state_dir) / RUN_FILE,
                    saved["run_id"], run_id)
        saved = None
    run_dir = Path(asked_dir) if asked_dir is not None else (
        Path(saved["run_dir"]) if saved is not None else default_run_dir())
    records = _read(run_dir / METRICS_FILE)
    owner = _record_run_id(records)
    if records and (owner not in (None, run_id) or (owner is None and fresh)):
        _move_aside(run_dir, owner or "before-%s" % time.strftime("%Y%m%d-%H%M%S"))
        records = []
    before = Path(saved["run_dir"]) if saved is not None else None
    if (not records and before is not None and before.resolve() != run_dir.resolve()
            and not (run_dir / METRICS_FILE).exists() and (before / METRICS_FILE).is_file()):
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(str(before / METRICS_FILE), str(run_dir / METRICS_FILE))
        except OSError as exc:
            raise StateFileError("cannot copy run %s's record from %s into %s: %s" % (
                run_id, before, run_dir, exc)) from None
        log.warning("run %s's record moves from %s to %s (--run-dir): its metrics.jsonl so far is "
                    "copied there; %s is left as it was", run_id, before, run_dir, before)
        records = _read(run_dir / METRICS_FILE)
    times = run_times(records) if records else []
    if saved is not None:
        started = float(saved["started_wall_s"])
    elif records and isinstance(records[0].get("wall_s"), (int, float)):
        started = float(records[0]["wall_s"]) - times[0]  # a record from before run.json
    else:
        started = wall_now
    offset, time_from = max(0.0, wall_now - started), "wall clock"
    if times and offset <= max(times):
        offset, time_from = max(times) + AFTER_LAST_S, "after the record's last line"
        log.warning("the wall clock says %.1f s since run %s started, its record already reaches "
                    "%.1f s: this process's times continue after the record's last line",
                    wall_now - started, run_id, max(times))
    versions = [r["version"] for r in records if r.get("event") in ("update", "eval")
                and isinstance(r.get("version"), int) and not isinstance(r.get("version"), bool)]
    _save_run_file(state_dir, run_id, run_dir, started)
    earlier = processes(records) if records else []
    lines = [r for r in records if r.get("event") in ("update", "eval")]
    return RunRecord(run_id=run_id, run_dir=run_dir, started_wall_s=started, offset_s=offset,
                     earlier=earlier, lines=lines, record_version=max(versions) if versions else None,
                     time_from=time_from)
