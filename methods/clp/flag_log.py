"""The log's account of the CLP flag: the first change as it comes, then one summary line a while.

A flapping flag (eq. 3 on a noisy trace) changed 36 times in 3 minutes, a line each, and the lines
crowded out the rest of the coordinator's log. ``FlagChangeLog`` says a change at INFO when no line
was logged in the last ``interval_s``; changes inside that interval go to DEBUG, and once it has
passed one INFO line sums them up ("CLP flag changed 12 times in the last 60 s; now critical since
version 340"). The summary comes at the first ``flush`` (the coordinator's tick, about once a
second) or change after the interval, so where the flag came to rest is always said, also when the
flapping stops. ``streamfl.logs.RateLimitedLog`` is not used: it speaks only when the next event
comes, so a burst's last state would stay unsaid until the flag moves again. Sans-I/O apart from
the logger: the time is the caller's (the coordinator's clock, or the simulator's).
"""
import logging
from typing import Optional

#: What the log and the fleet view call the two values of the CLP flag.
FLAG_NAMES = {True: "critical", False: "not critical"}


class FlagChangeLog:
    """Logs the CLP flag's changes: one at INFO, the rest summed up at most once per ``interval_s``."""

    def __init__(self, logger: logging.Logger, interval_s: float):
        if not interval_s >= 0:
            raise ValueError("interval_s must be >= 0, got %r" % (interval_s,))
        self.logger, self.interval_s = logger, float(interval_s)
        #: When the last INFO line was logged (None: none yet).
        self._last_line_s: Optional[float] = None
        #: Changes since that line, not yet told at INFO, and where the flag stood after the last.
        self.held = 0
        self._in_clp = True
        self._since_version = 0

    def changed(self, in_clp: bool, version: int, now_s: float, detail: str) -> None:
        """The flag became ``in_clp`` at ``version``; ``detail`` is the change's own line."""
        if self.held == 0 and self._due(now_s):
            self.logger.info("%s", detail)
            self._last_line_s = now_s
            return
        self.logger.debug("%s", detail)
        self.held += 1
        self._in_clp, self._since_version = bool(in_clp), int(version)
        self.flush(now_s)

    def flush(self, now_s: float) -> None:
        """Sum up the held changes at INFO once ``interval_s`` has passed since the last line."""
        if self.held == 0 or not self._due(now_s):
            return
        self.logger.info("CLP flag changed %d time%s in the last %.0f s; now %s since version %d",
                         self.held, "" if self.held == 1 else "s", now_s - self._last_line_s,
                         FLAG_NAMES[self._in_clp], self._since_version)
        self.held, self._last_line_s = 0, now_s

    def _due(self, now_s: float) -> bool:
        return (self.interval_s <= 0 or self._last_line_s is None
                or now_s - self._last_line_s >= self.interval_s)
