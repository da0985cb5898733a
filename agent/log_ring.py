"""The agent's last log lines in memory, so that ``streamfl operator logs`` can show why a board
misbehaves without a login on it.

A ``logging.Handler`` on the root logger keeps the newest ``max_lines`` records, each formatted as
the journal shows it (time, level, logger, message) and cut to ``max_chars`` characters (a
traceback keeps its first lines): a bounded deque, so a board that logs a lot costs the same
memory as a quiet one, and nothing is written to its SD card.
"""
import logging
import threading
from collections import deque
from typing import Deque, List

#: How each line looks: the journal's fields, without the host (the operator knows the board).
LINE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class LogRing(logging.Handler):
    """The newest ``max_lines`` formatted records, each at most ``max_chars`` characters."""

    def __init__(self, max_lines: int, max_chars: int, level: int = logging.NOTSET):
        super().__init__(level)
        self.max_chars = int(max_chars)
        self._lines: Deque[str] = deque(maxlen=max(0, int(max_lines)))
        self._ring_lock = threading.Lock()
        self.setFormatter(logging.Formatter(LINE_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:  # a record whose message cannot be formatted must not break the caller
            text = "%s %s: (unformattable record %r)" % (record.levelname, record.name, record.msg)
        line = " | ".join(part for part in text.splitlines() if part.strip())
        if len(line) > self.max_chars:
            line = line[:max(0, self.max_chars - 3)] + "..."
        with self._ring_lock:
            self._lines.append(line)

    @property
    def max_lines(self) -> int:
        return self._lines.maxlen or 0

    def lines(self, n: int) -> List[str]:
        """The newest ``n`` lines, oldest first."""
        with self._ring_lock:
            kept = list(self._lines)
        return kept[-n:] if n > 0 else []

    def install(self) -> None:
        """Start keeping the root logger's records."""
        root = logging.getLogger()
        if self not in root.handlers:
            root.addHandler(self)

    def remove(self) -> None:
        logging.getLogger().removeHandler(self)
