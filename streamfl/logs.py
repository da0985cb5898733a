"""Logging set-up for the command-line programs: one stdout handler (journald takes stdout)."""
import logging
import sys
import threading
import time

from streamfl.errors import ConfigError

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMAT = "%(levelname)s %(name)s: %(message)s"


class _StdoutHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stdout`` is when a record arrives, not when logging was set up: a
    replaced stdout (a test's capture, a redirect) must not leave threads writing to a closed file."""

    def __init__(self) -> None:
        super().__init__(sys.stdout)

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:
        """StreamHandler sets it on construction; the property always follows sys.stdout."""


def setup_logging(level: str = "INFO", stream=None, environ=None) -> None:
    """Install the only handler streamfl uses; libraries never add handlers.

    Under journald (``$JOURNAL_STREAM`` set) lines carry no timestamp: the journal adds its own.
    """
    name = str(level).upper()
    if name not in LEVELS:
        raise ConfigError("--log-level must be one of %s, got %r" % (", ".join(LEVELS), level))
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(stream) if stream is not None else _StdoutHandler()
    under_journald = bool((environ or {}).get("JOURNAL_STREAM"))
    handler.setFormatter(logging.Formatter(FORMAT if under_journald else "%(asctime)s " + FORMAT))
    root.addHandler(handler)
    root.setLevel(name)
    # paho and amqtt are chatty at INFO; their warnings still show.
    for noisy in ("amqtt", "transitions", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


class RateLimitedLog:
    """Logs a recurring event at its level at most once per ``interval_s`` per key (the rest at
    DEBUG), and says how many were held back since, so a flood of rejections keeps showing without
    a line per message. ``held_note`` is appended with ``(count, key)``. Thread-safe."""

    def __init__(self, logger: logging.Logger, interval_s: float, clock=time.monotonic,
                 held_note: str = "(%d more %s since the last warning)"):
        self.logger, self.interval_s, self.clock = logger, float(interval_s), clock
        self.held_note = held_note
        self._lock = threading.Lock()
        self._last = {}
        self._held = {}

    def event(self, key: str, level: int, msg: str, *args) -> None:
        with self._lock:
            now = self.clock()
            last = self._last.get(key)
            if last is not None and now - last < self.interval_s:
                self._held[key] = self._held.get(key, 0) + 1
                held = None
            else:
                self._last[key] = now
                held = self._held.pop(key, 0)
        if held is None:
            self.logger.debug(msg, *args)
        elif held:
            self.logger.log(level, msg + " " + self.held_note, *(args + (held, key)))
        else:
            self.logger.log(level, msg, *args)
