"""What a running agent has set on its clocks: ``<state>/dvfs-state.json``, so that
``streamfl-agent dvfs status`` beside it shows the agent's levels rather than its own guess.

A simulated backend's clocks live only in the agent's memory: another process that builds one
gets a fresh board at its top levels, which is not what the agent runs at. On a real board the
kernel's files show the clock but not which process set it or under which policy. So ``AgentDvfs``
writes this record (atomically) at start, whenever a plan changes a level, and at stop, and the
status command believes it only while the process that wrote it is alive (its pid, and on Linux
its start time, so a reused pid is not taken for the agent)::

    {"format": 1, "pid": 4711, "proc_start": 123456, "owner": "agent", "running": true,
     "time_s": 1735732800.0, "backend": "simulated", "policy": "clp-aware", "mode": "cap",
     "board": "jetson-orin-nano", "meter": "modeled", "measured_power": false,
     "domains": {"gpu": {"level": 2, "khz": 624750, "levels": 5}}}
"""
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

from streamfl.errors import StorageError
from streamfl.fileio import atomic_write, read_if_present

log = logging.getLogger(__name__)

STATE_FILE = "dvfs-state.json"
FORMAT = 1
#: Field 22 of /proc/<pid>/stat (the process's start time in clock ticks since boot), counted
#: from the first field after the command name's closing parenthesis (field 3).
_STARTTIME_INDEX = 22 - 3


@dataclass(frozen=True)
class DomainRecord:
    """One domain as the agent left it: the level index, its clock and the ladder's length."""

    level: int
    khz: int
    levels: int

    @property
    def mhz(self) -> float:
        """The clock in MHz, as people quote them."""
        return self.khz / 1000.0


@dataclass(frozen=True)
class ClockRecord:
    """The agent's clocks and how it drives them, as written to ``STATE_FILE``."""

    pid: int
    #: The writer's start time (/proc/<pid>/stat), to tell it from a later process with its pid.
    proc_start: Optional[int]
    #: Which command set the clocks: ``agent``, or ``dvfs probe``.
    owner: str
    #: False once it stopped cleanly (its clocks then restored).
    running: bool
    #: Wall-clock seconds (Unix time) of the record.
    time_s: float
    backend: str
    policy: str
    mode: str
    board: Optional[str]
    meter: str
    #: Whether the meter measures (a sensor) rather than models or does nothing.
    measured_power: bool
    domains: Dict[str, DomainRecord] = field(default_factory=dict)

    def to_json(self) -> Dict[str, Any]:
        """The file's content."""
        return {"format": FORMAT, "pid": self.pid, "proc_start": self.proc_start,
                "owner": self.owner, "running": self.running, "time_s": self.time_s,
                "backend": self.backend, "policy": self.policy, "mode": self.mode,
                "board": self.board, "meter": self.meter, "measured_power": self.measured_power,
                "domains": {name: {"level": d.level, "khz": d.khz, "levels": d.levels}
                            for name, d in self.domains.items()}}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "ClockRecord":
        """Parse the file's content; ``ValueError`` naming what is wrong."""
        if not isinstance(doc, Mapping) or doc.get("format") != FORMAT:
            raise ValueError("format %r, expected %d" % (
                doc.get("format") if isinstance(doc, Mapping) else doc, FORMAT))
        try:
            domains = {str(name): DomainRecord(_int(d["level"]), _int(d["khz"]), _int(d["levels"]))
                       for name, d in doc["domains"].items()}
            pid = _int(doc["pid"])
            if pid <= 0:
                raise ValueError("pid %r" % pid)
            start = doc.get("proc_start")
            return cls(pid=pid, proc_start=None if start is None else _int(start),
                       owner=str(doc["owner"]), running=bool(doc["running"]),
                       time_s=float(doc["time_s"]), backend=str(doc["backend"]),
                       policy=str(doc["policy"]), mode=str(doc["mode"]),
                       board=None if doc.get("board") is None else str(doc["board"]),
                       meter=str(doc["meter"]), measured_power=bool(doc["measured_power"]),
                       domains=domains)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError("missing or malformed %s" % exc) from None

    def alive(self) -> bool:
        """Whether the process that wrote this still runs and has not said it stopped."""
        return self.running and process_alive(self.pid, self.proc_start)


def _int(value: Any) -> int:
    """An integer field (not a bool, not a float)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("%r is not an integer" % (value,))
    return value


def process_start(pid: int) -> Optional[int]:
    """The start time of process ``pid`` in clock ticks since boot; None where /proc cannot say."""
    try:
        text = Path("/proc/%d/stat" % pid).read_text(encoding="utf-8", errors="replace")
        return int(text[text.rindex(")") + 2:].split()[_STARTTIME_INDEX])
    except (OSError, ValueError, IndexError):
        return None


def process_alive(pid: int, start: Optional[int] = None) -> bool:
    """Whether process ``pid`` exists (owned by any user) and, where ``start`` is known and /proc
    tells, started when the record's writer did (a reused pid is another process)."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False  # kill(0) and kill(-n) would ask about whole process groups
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    except OSError:
        return False
    if start is not None:
        now = process_start(pid)
        if now is not None and now != start:
            return False
    return True


def state_path(state_dir: Path) -> Path:
    """Where the record lives in a state folder."""
    return Path(state_dir) / STATE_FILE


def write_record(state_dir: Path, record: ClockRecord) -> None:
    """Replace the record atomically; ``StorageError`` naming the file if it cannot be written."""
    path = state_path(state_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(record.to_json(), indent=1, sort_keys=True).encode("utf-8"))
    except OSError as exc:
        raise StorageError("cannot write the clock record %s: %s" % (path, exc.strerror or exc)) from exc


def read_record(state_dir: Path) -> Optional[ClockRecord]:
    """The record in ``state_dir``; None where there is none; ``StorageError`` naming the file
    where it cannot be read or is not a record."""
    path = state_path(state_dir)
    raw = read_if_present(path)
    if raw is None:
        return None
    try:
        return ClockRecord.from_json(json.loads(raw.decode("utf-8")))
    except (ValueError, UnicodeDecodeError) as exc:
        raise StorageError("%s is not a clock record: %s" % (path, exc)) from None


def this_process(**fields: Any) -> ClockRecord:
    """A record written by this process now (its pid and start time filled in)."""
    pid = os.getpid()
    return ClockRecord(pid=pid, proc_start=process_start(pid), time_s=time.time(), **fields)
