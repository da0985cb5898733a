"""A write-ahead journal of received updates, so that nothing the broker was told we have is lost to a kill -9.

paho acknowledges a QoS 1 PUBLISH (PUBACK) as soon as the ``on_message`` callback returns
(paho-mqtt 2.x ``Client._handle_publish``, without ``manual_ack``), but what the core made of an
update is durable only at the next save of the state folder (``persistence.py``, at most every
``persist_interval_s``). A kill in between lost the worker's queue and every unsaved version,
while their ``metrics.jsonl`` lines said ``aggregated``. So the server's network thread writes the
raw frame of each decoded, valid ``Update`` here before ``on_message`` returns (and of each device's
``Hello`` and ``Offline``: admission counts an update only from a device that said Hello, and a
Hello the last save did not hold would leave its replayed updates "unknown device")
(``IntakeJournal.append``: write, fsync, rename, fsync of the folder), numbered in arrival order
(``seq``). The worker remembers the number of the last journalled update the core handled,
whatever its outcome (each one moves the core's counters, which are saved with the state); the
snapshot it hands the publisher carries it as ``intake_seq`` (``INTAKE_SEQ``), and once that
state is durable the entries it covers are deleted (``drop_through``, from the ``Persister``).
At start (``open``), entries at or below the saved ``intake_seq`` are deleted unread (their effect
is in the saved state), and the others are read back (``read``) and handed to the core before
anything new, in journal order; the core's dedup window then drops an update the broker also
redelivered (it was journalled, but the kill came before its PUBACK).

The folder is ``<state dir>/intake/``, one file per update, ``<seq, 20 digits>.frame``: a header
(magic, format, lengths of topic and frame, CRC-32 of both), the topic, the frame. A file that
does not check out is moved aside (``.corrupt``, kept for inspection), counted and logged, never
fatal; a temp file is a write a kill interrupted before the PUBACK, and is deleted.

Bounded: at ``max_bytes`` of pending entries, or when the disk refuses a write, an update is
still handled but not journalled first (``not_durable``, logged at most every
``NOT_DURABLE_LOG_S``); the network thread never raises for the journal.
"""
import logging
import os
import re
import struct
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Deque, Dict, Iterator, List, Optional, Tuple

from streamfl.config import bounded
from streamfl.logs import RateLimitedLog

log = logging.getLogger(__name__)

INTAKE_DIR = "intake"
#: The state key naming the newest journal entry whose effect the state holds.
INTAKE_SEQ = "intake_seq"
MAGIC = b"SFLI"
FORMAT = 1
#: magic, format, topic length, frame length, CRC-32 of topic + frame.
HEADER = struct.Struct(">4sBHII")
SUFFIX = ".frame"
_NAME = re.compile(r"^(\d{20})\.frame$")
#: A journal that cannot take an update (full, or the disk refuses) says so at most this often.
NOT_DURABLE_LOG_S = 60.0


@dataclass(frozen=True)
class IntakeConfig:
    """The journal of received updates (``coordinator/intake.py``): an update the broker
    acknowledged survives a kill -9 of the coordinator.

    durable: write each valid update into ``<state dir>/intake/`` (write, fsync, rename) before
      MQTT acknowledges it, and hand what the last save did not cover back to the core at start.
      Off: a kill loses the updates received since the last save (up to ``persist_interval_s`` of
      them and the worker's queue). Costs two fsyncs per update on the network thread
      (``bench/bench_intake.py``: 8 ms an update on this project's ext4 test machine, about 90
      updates/s where the core alone takes 2,600: plenty for 300 boards sending one every 10 s,
      a limit for a bench of thousands a second).
    max_bytes: the journal's bound, in bytes of pending entries. It normally holds the worker's
      queue (256 updates) and the updates handled since the last save; 1 GiB holds the queue of
      updates of the 2.1 MB model of ``docs/capacity.md`` twice over, and keeps a stuck save
      from filling the disk that the state folder needs. At the bound (and on a disk error) an
      update is still handled but not journalled: counted as ``intake_not_durable`` and logged
      at most once a minute, so a kill then can lose it.
    """

    durable: bool = True
    max_bytes: int = bounded(2 ** 30, 2 ** 16, 2 ** 50)

    def __post_init__(self) -> None:
        if not 2 ** 16 <= self.max_bytes <= 2 ** 50:
            raise ValueError("intake.max_bytes must be in [65536, 2**50], got %r" % (self.max_bytes,))


class CorruptEntry(Exception):
    """A journal entry that cannot be read back as written."""


def encode_entry(topic: str, frame: bytes) -> bytes:
    """One journal file's bytes: header, topic (UTF-8), frame."""
    raw_topic = topic.encode("utf-8")
    if len(raw_topic) > 0xFFFF:
        raise ValueError("topic of %d bytes cannot be journalled" % len(raw_topic))
    crc = zlib.crc32(frame, zlib.crc32(raw_topic))
    return HEADER.pack(MAGIC, FORMAT, len(raw_topic), len(frame), crc) + raw_topic + bytes(frame)


def decode_entry(data: bytes) -> Tuple[str, bytes]:
    """``(topic, frame)`` of a journal file's bytes; ``CorruptEntry`` saying why otherwise."""
    if len(data) < HEADER.size:
        raise CorruptEntry("%d bytes, shorter than the header" % len(data))
    magic, fmt, topic_len, frame_len, crc = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptEntry("not a journal entry (magic %r)" % magic)
    if fmt != FORMAT:
        raise CorruptEntry("entry format %d, this streamfl reads %d" % (fmt, FORMAT))
    if len(data) != HEADER.size + topic_len + frame_len:
        raise CorruptEntry("%d bytes, the header says %d" % (len(data), HEADER.size + topic_len + frame_len))
    raw_topic = data[HEADER.size:HEADER.size + topic_len]
    frame = data[HEADER.size + topic_len:]
    if zlib.crc32(frame, zlib.crc32(raw_topic)) != crc:
        raise CorruptEntry("CRC-32 mismatch")
    try:
        topic = raw_topic.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptEntry("topic is not UTF-8 (%s)" % exc) from None
    return topic, frame


def entry_name(seq: int) -> str:
    return "%020d%s" % (seq, SUFFIX)


class IntakeJournal:
    """The ``intake/`` folder of one state folder: ``open`` at start, then ``append`` (network
    thread), ``drop_through`` (publisher thread, after a durable save); thread-safe."""

    def __init__(self, state_dir: Path, config: IntakeConfig = IntakeConfig(), clock=time.monotonic):
        self.dir = Path(state_dir) / INTAKE_DIR
        self.config = config
        self._lock = threading.Lock()
        #: (seq, bytes) of every entry on disk not yet covered by a saved state, oldest first.
        self._pending: Deque[Tuple[int, int]] = deque()
        self._bytes = 0
        self._next = 1
        self._dir_fd: Optional[int] = None
        self._opened = False
        #: Entries ``open`` deleted unread: the saved state already held their effect.
        self.covered_at_open = 0
        self._log = RateLimitedLog(log, NOT_DURABLE_LOG_S, clock=clock)
        self._counts: Dict[str, int] = {"intake_journalled": 0, "intake_not_durable": 0,
                                        "intake_corrupt": 0, "intake_drop_errors": 0}

    # ---- start ---------------------------------------------------------------------------------
    def open(self, covered: int, fresh: bool = False) -> List[int]:
        """Take the folder over: delete temp files and the entries at or below ``covered`` (the
        saved state's ``intake_seq``), and return the seqs of the others, oldest first, to be
        ``read`` and handed to the core. ``fresh``: the state folder holds no run (it was moved
        away), so what is here belongs to another run and is moved aside, not replayed.
        Never raises for the folder's content; an unusable folder leaves the journal off
        (every ``append`` then counts as not durable)."""
        self.covered_at_open = 0
        covered = max(0, int(covered or 0))
        try:
            if fresh and self.dir.is_dir() and any(self.dir.iterdir()):
                aside = self.dir.with_name("%s.orphaned-%d" % (INTAKE_DIR, int(time.time())))
                os.replace(str(self.dir), str(aside))
                log.warning("%s held updates of a run whose state is gone (a fresh state folder): "
                            "moved aside to %s, not replayed into this new run", self.dir, aside)
            self.dir.mkdir(parents=True, exist_ok=True)
            names = sorted(os.listdir(str(self.dir)))
            self._dir_fd = os.open(str(self.dir), os.O_RDONLY)
        except OSError as exc:
            log.error("the intake journal %s cannot be used (%s): updates are handled without it, "
                      "and a kill -9 can lose those received since the last save", self.dir,
                      exc.strerror or exc)
            self._opened = False
            return []
        found: List[Tuple[int, int]] = []
        for name in names:
            path = self.dir / name
            match = _NAME.match(name)
            if name.startswith(".") and name.endswith(".tmp"):  # a write a kill cut: never acknowledged
                self._unlink(path)
                continue
            if match is None:
                continue  # a .corrupt file kept for inspection, or someone else's
            seq = int(match.group(1))
            if seq <= covered:
                self._unlink(path)
                self.covered_at_open += 1
                continue
            try:
                size = path.stat().st_size
            except OSError:
                size = 0
            found.append((seq, size))
        with self._lock:
            self._pending = deque(found)
            self._bytes = sum(size for _, size in found)
            self._next = max([covered] + [seq for seq, _ in found]) + 1
            self._opened = True
        if self.covered_at_open:
            log.info("intake journal: %d entr%s already in the saved state deleted", self.covered_at_open,
                     "y" if self.covered_at_open == 1 else "ies")
        return [seq for seq, _ in found]

    def read(self, seq: int) -> Optional[Tuple[str, bytes]]:
        """``(topic, frame)`` of pending entry ``seq``; None (counted, logged, the file moved aside
        as ``.corrupt``) if it cannot be read back."""
        path = self.dir / entry_name(seq)
        try:
            return decode_entry(path.read_bytes())
        except (OSError, CorruptEntry) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        with self._lock:
            self._counts["intake_corrupt"] += 1
        try:
            os.replace(str(path), str(path) + ".corrupt")
            where = "moved aside to %s.corrupt" % path.name
        except OSError:
            where = "left in place"
        log.error("intake journal entry %s cannot be read (%s): skipped, %s", path, why, where)
        return None

    # ---- network thread ------------------------------------------------------------------------
    def append(self, topic: str, frame: bytes) -> Optional[int]:
        """Write one update's frame durably; its seq, or None where it is not journalled (off,
        full, a disk error: counted and logged). Never raises."""
        if not self.config.durable:
            return None
        try:
            data = encode_entry(topic, frame)
        except ValueError as exc:
            return self._not_durable("bad", "an update could not be journalled (%s)", exc)
        with self._lock:
            if not self._opened:
                return self._not_durable("closed", "an update was not journalled: the intake journal "
                                                   "%s is not open", self.dir)
            if self._bytes + len(data) > self.config.max_bytes:
                return self._not_durable("full", "the intake journal %s is full (%d pending bytes, "
                                         "intake.max_bytes %d): updates are handled without it until "
                                         "the next save", self.dir, self._bytes, self.config.max_bytes)
            seq = self._next
            self._next += 1
            path = self.dir / entry_name(seq)
            tmp = self.dir / (".%s.tmp" % path.name)
            try:
                fd = os.open(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(str(tmp), str(path))
                os.fsync(self._dir_fd)
            except OSError as exc:
                self._unlink(tmp)
                return self._not_durable("disk", "an update could not be journalled in %s (%s): it is "
                                         "handled without it", self.dir, exc.strerror or exc)
            self._pending.append((seq, len(data)))
            self._bytes += len(data)
            self._counts["intake_journalled"] += 1
            return seq

    def _not_durable(self, key: str, msg: str, *args) -> None:
        """Count an update that is handled without the journal (called with or without the lock:
        the counter's update is one dict store under the GIL either way), and say so rate-limited."""
        self._counts["intake_not_durable"] += 1
        self._log.event(key, logging.ERROR, msg + " (a kill -9 now can lose it)", *args)
        return None

    # ---- publisher thread ----------------------------------------------------------------------
    def drop_through(self, seq: Optional[int]) -> int:
        """Delete the entries up to ``seq``: a durable state covers them. How many were deleted."""
        if seq is None:
            return 0
        done: List[int] = []
        with self._lock:
            while self._pending and self._pending[0][0] <= seq:
                entry, size = self._pending.popleft()
                self._bytes -= size
                done.append(entry)
        for entry in done:
            self._unlink(self.dir / entry_name(entry), count=True)
        return len(done)

    def _unlink(self, path: Path, count: bool = False) -> None:
        try:
            os.unlink(str(path))
        except FileNotFoundError:
            pass
        except OSError as exc:  # left behind: the next start deletes it (a saved state covers it)
            if count:
                with self._lock:
                    self._counts["intake_drop_errors"] += 1
            self._log.event("unlink", logging.WARNING, "cannot delete intake journal entry %s (%s)",
                            path, exc.strerror or exc)

    # ---- views ---------------------------------------------------------------------------------
    def pending(self) -> List[int]:
        """The seqs on disk that no saved state covers yet, oldest first."""
        with self._lock:
            return [seq for seq, _ in self._pending]

    def counters(self) -> Dict[str, int]:
        with self._lock:
            out = dict(self._counts)
            out["intake_pending"] = len(self._pending)
            out["intake_pending_bytes"] = self._bytes
        return out

    def close(self) -> None:
        with self._lock:
            fd, self._dir_fd = self._dir_fd, None
            self._opened = False
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


def entries_on_disk(state_dir: Path) -> Iterator[Path]:
    """The journal files of ``state_dir`` (for tests and tools: what a clean stop leaves, nothing)."""
    folder = Path(state_dir) / INTAKE_DIR
    if folder.is_dir():
        for path in sorted(folder.iterdir()):
            if _NAME.match(path.name):
                yield path
