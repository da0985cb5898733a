"""Updates made while the broker is away wait here, on disk, bounded, in order.

One file per encoded frame in ``<state>/outbox/``, named by a sequence number and written atomically,
with a small header (magic + CRC32) so a damaged file is recognised and moved aside instead of sent.
Bounds (items and bytes) drop the OLDEST frame: under FedAsync's staleness weighting the newest
update is the most valuable. A full or read-only disk never stops the agent: the frame is kept in
memory (same bounds) and the failure is logged and counted. A sent frame's file is deleted only
once the broker has acknowledged it (``drain``, ``reap``), so no crash loses a queued update.
"""
import errno
import logging
import os
import re
import struct
import threading
import zlib
from collections import deque
from pathlib import Path
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from streamfl.fileio import atomic_write

log = logging.getLogger(__name__)

MAGIC = b"SFO1"
_HEADER = struct.Struct(">4sI")  # magic, crc32 of the frame
_NAME_RE = re.compile(r"^(\d{16})\.frame$")
CORRUPT_DIR = "corrupt"

#: ``writer(path, data)``: must leave either no file or the whole file at ``path``; raises OSError.
Writer = Callable[[Path, bytes], None]


class _Entry:
    __slots__ = ("seq", "size", "path", "data")

    def __init__(self, seq: int, size: int, path: Optional[Path], data: Optional[bytes]):
        self.seq, self.size, self.path, self.data = seq, size, path, data


class Outbox:
    """A FIFO of frames bounded by ``max_items`` and ``max_bytes``; thread-safe; survives restarts."""

    def __init__(self, directory: Optional[Path], max_items: int = 200,
                 max_bytes: int = 256 * 1024 * 1024, writer: Optional[Writer] = None):
        if max_items < 1 or max_bytes < 1:
            raise ValueError("outbox bounds must be positive")
        self.directory = Path(directory) if directory is not None else None
        self.max_items = int(max_items)
        self.max_bytes = int(max_bytes)
        self._write = writer or atomic_write
        self._lock = threading.RLock()
        self._entries: Deque[_Entry] = deque()
        self._in_flight: Deque[Tuple[_Entry, Callable[[], bool]]] = deque()
        self._bytes = 0
        self._next_seq = 0
        self.counters: Dict[str, int] = {"stored": 0, "sent": 0, "dropped": 0, "write_errors": 0,
                                         "corrupt": 0, "in_memory": 0, "acked": 0}
        if self.directory is not None:
            self._scan()

    # ---- state --------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Frames waiting to be sent (not counting those in flight)."""
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        """Frame bytes waiting (on disk and in memory)."""
        return self._bytes

    def _scan(self) -> None:
        """Pick up frames a previous run left behind; move foreign or damaged names aside."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            names = sorted(os.listdir(str(self.directory)))
        except OSError as exc:
            log.error("outbox folder %s is unusable (%s); queued updates stay in memory only",
                      self.directory, exc.strerror or exc)
            self.counters["write_errors"] += 1
            self.directory = None
            return
        found: List[_Entry] = []
        for name in names:
            path = self.directory / name
            match = _NAME_RE.match(name)
            if match:
                try:
                    size = path.stat().st_size - _HEADER.size
                except OSError:
                    size = -1
                if size < 0:
                    self._move_aside(path, "too short or unreadable")
                    continue
                found.append(_Entry(int(match.group(1)), size, path, None))
            elif name.startswith(".") and name.endswith(".tmp"):
                try:
                    path.unlink()  # a write interrupted by a crash: never complete, never sent
                except OSError:
                    pass
            elif name != CORRUPT_DIR:
                self._move_aside(path, "not an outbox frame name")
        for entry in sorted(found, key=lambda e: e.seq):
            self._entries.append(entry)
            self._bytes += entry.size
        if found:
            self._next_seq = max(e.seq for e in found) + 1
            log.info("outbox holds %d update(s) (%d bytes) from a previous run", len(found), self._bytes)
        self._enforce_bounds()

    # ---- put ----------------------------------------------------------------------------------

    def put(self, frame: bytes) -> bool:
        """Queue ``frame`` (on disk if possible, else in memory); False if it had to be dropped."""
        frame = bytes(frame)
        with self._lock:
            if len(frame) > self.max_bytes:
                self.counters["dropped"] += 1
                log.warning("outbox drops a %d-byte update larger than outbox_max_bytes (%d)",
                            len(frame), self.max_bytes)
                return False
            seq = self._next_seq
            self._next_seq += 1
            entry = _Entry(seq, len(frame), None, None)
            if self.directory is not None:
                path = self.directory / ("%016d.frame" % seq)
                try:
                    self._write(path, _HEADER.pack(MAGIC, zlib.crc32(frame)) + frame)
                    entry.path = path
                except OSError as exc:
                    self.counters["write_errors"] += 1
                    what = "the disk is full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else \
                        (exc.strerror or str(exc))
                    log.warning("cannot write outbox frame %s (%s); keeping it in memory", path, what)
            if entry.path is None:
                entry.data = frame
                self.counters["in_memory"] += 1
            self._entries.append(entry)
            self._bytes += entry.size
            self.counters["stored"] += 1
            self._enforce_bounds()
            return True

    def _enforce_bounds(self) -> None:
        while self._entries and (len(self._entries) > self.max_items or self._bytes > self.max_bytes):
            oldest = self._entries.popleft()
            self._bytes -= oldest.size
            self._delete(oldest)
            self.counters["dropped"] += 1
            log.warning("outbox full (%d items / %d bytes max): dropped the oldest update #%d",
                        self.max_items, self.max_bytes, oldest.seq)

    # ---- drain --------------------------------------------------------------------------------

    def drain(self, send: Callable[[bytes], Any]) -> int:
        """Send waiting frames oldest first; returns how many were handed over.

        ``send(frame)`` returns something false when it could not hand the frame over (the drain
        stops there, leaving that frame first in line; an exception counts the same), True when
        the frame is delivered (its file is deleted at once), or an ``AckProbe``: the frame is then
        in flight and its file stays until ``reap`` sees the broker's acknowledgement. An agent
        that dies before that finds the file at its next start and sends it again; the
        coordinator drops the repeat by its update id. In-flight files are outside the bounds, so
        the folder can briefly hold up to twice ``max_items`` frames.
        """
        self.reap()
        sent = 0
        with self._lock:
            while self._entries:
                entry = self._entries[0]
                frame = entry.data if entry.data is not None else self._read(entry)
                if frame is None:
                    self._entries.popleft()
                    self._bytes -= entry.size
                    continue
                try:
                    result = send(frame)
                except Exception as exc:  # a transport error must not lose or reorder frames
                    log.warning("sending a queued update failed: %s", exc)
                    result = None
                if not result:
                    break
                self._entries.popleft()
                self._bytes -= entry.size
                if callable(result):
                    self._in_flight.append((entry, result))
                else:
                    self._delete(entry)
                self.counters["sent"] += 1
                sent += 1
        if sent:
            log.info("outbox: sent %d queued update(s), %d left", sent, len(self._entries))
        return sent

    def reap(self) -> int:
        """Delete the files of in-flight frames the broker has acknowledged; returns how many."""
        done = 0
        with self._lock:
            waiting: Deque[Tuple[_Entry, Callable[[], bool]]] = deque()
            for entry, acked in self._in_flight:
                if acked():
                    self._delete(entry)
                    done += 1
                else:
                    waiting.append((entry, acked))
            self._in_flight = waiting
            self.counters["acked"] += done
        return done

    @property
    def in_flight(self) -> int:
        """Frames handed to the transport whose acknowledgement has not been seen yet."""
        return len(self._in_flight)

    def _read(self, entry: _Entry) -> Optional[bytes]:
        """The frame of an on-disk entry, or None (moved aside and counted) if damaged."""
        try:
            raw = entry.path.read_bytes()
        except OSError as exc:
            self._move_aside(entry.path, "unreadable: %s" % (exc.strerror or exc))
            return None
        if len(raw) < _HEADER.size:
            self._move_aside(entry.path, "truncated")
            return None
        magic, crc = _HEADER.unpack_from(raw)
        frame = raw[_HEADER.size:]
        if magic != MAGIC or zlib.crc32(frame) != crc:
            self._move_aside(entry.path, "bad magic or checksum")
            return None
        return frame

    def _delete(self, entry: _Entry) -> None:
        if entry.path is None:
            return
        try:
            entry.path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot delete sent outbox frame %s: %s", entry.path, exc.strerror or exc)

    def _move_aside(self, path: Path, why: str) -> None:
        """Keep a damaged entry for inspection in ``outbox/corrupt/`` (or delete it if that fails)."""
        self.counters["corrupt"] += 1
        log.warning("outbox entry %s is %s; moved aside", path, why)
        try:
            aside = path.parent / CORRUPT_DIR
            aside.mkdir(exist_ok=True)
            os.replace(str(path), str(aside / path.name))
        except OSError:
            try:
                path.unlink()
            except OSError:
                pass
