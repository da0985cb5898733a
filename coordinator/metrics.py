"""Append-only JSON lines (metrics.jsonl) for ``streamfl report``; a full disk never stops training.

One line per event (``eval``, ``update``, ...), flushed as written so a crash loses at most the line
being written. Write errors are logged (first one and then every 100th) and counted.
"""
import json
import logging
from pathlib import Path
from typing import Any, Dict, Optional

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


class MetricsWriter:
    """Appends one JSON object per line to ``path``, flushing each line."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.lines = 0
        self.errors = 0
        self._fh = None
        self._closed = False

    @classmethod
    def in_run_dir(cls, run_dir: Path) -> "MetricsWriter":
        return cls(Path(run_dir) / METRICS_FILE)

    def _open(self):
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")
        return self._fh

    def write(self, record: Dict[str, Any]) -> bool:
        """Append ``record``; False (logged, counted) if it could not be written."""
        if self._closed:
            return False
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


def _plain(value: Any) -> Optional[Any]:
    """JSON fallback for numpy scalars."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError("not JSON serializable: %r" % type(value).__name__)
