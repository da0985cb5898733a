"""The sensor-source interface the agent's sensor thread and the simulator both pull windows from.

A source yields ``Window`` objects, paced at ``windows_per_s`` (0 = as fast as the consumer pulls),
and stops when its data is exhausted or ``close()`` is called. Time comes from an injected clock so
tests and the simulator run in virtual time; the default real clock waits on a ``threading.Event``
so that ``close()`` from another thread interrupts a pacing wait at once.
"""
import abc
import threading
import time
from typing import Callable, Iterator, Optional

from streamfl.sensors.window import Window


class Clock:
    """Real monotonic time; ``wait`` blocks on ``stop`` so that a closing source wakes up at once."""

    def now(self) -> float:
        """Seconds on a monotonic scale (only differences matter)."""
        return time.monotonic()

    def wait(self, seconds: float, stop: threading.Event) -> None:
        """Sleep ``seconds`` or until ``stop`` is set, whichever comes first."""
        if seconds > 0:
            stop.wait(seconds)


class FunctionClock(Clock):
    """A clock from plain functions, e.g. ``FunctionClock(sim.now, sim.sleep)`` or a test's fakes.

    Without ``sleep`` it falls back to an interruptible event wait in real time.
    """

    def __init__(self, clock: Callable[[], float], sleep: Optional[Callable[[float], None]] = None):
        self._clock = clock
        self._sleep = sleep

    def now(self) -> float:
        return float(self._clock())

    def wait(self, seconds: float, stop: threading.Event) -> None:
        if seconds <= 0 or stop.is_set():
            return
        if self._sleep is None:
            stop.wait(seconds)
        else:
            self._sleep(seconds)


class ManualClock(Clock):
    """Virtual time that advances only when something waits on it: pacing tests run instantly."""

    def __init__(self, start_s: float = 0.0):
        self.t_s = float(start_s)
        #: Every wait, in order; tests assert on the pacing from it.
        self.waits = []

    def now(self) -> float:
        return self.t_s

    def wait(self, seconds: float, stop: threading.Event) -> None:
        if seconds > 0 and not stop.is_set():
            self.waits.append(seconds)
            self.t_s += seconds

    def advance(self, seconds: float) -> None:
        """Move time forward without a wait (e.g. a slow consumer)."""
        self.t_s += seconds


def as_clock(clock=None, sleep: Optional[Callable[[float], None]] = None) -> Clock:
    """Accept a ``Clock`` (anything with ``now`` and ``wait``), a time function (+ sleep), or None."""
    if clock is None and sleep is None:
        return Clock()
    if clock is not None and hasattr(clock, "now") and hasattr(clock, "wait"):
        return clock
    if clock is None:
        clock = time.monotonic
    if not callable(clock):
        raise TypeError("clock must be a Clock or a function returning seconds, got %r" % (clock,))
    return FunctionClock(clock, sleep)


class SensorSource(abc.ABC):
    """A stream of windows. Subclasses implement ``_generate``; pacing and closing live here."""

    def __init__(self, windows_per_s: float = 0.0, clock=None,
                 sleep: Optional[Callable[[float], None]] = None):
        if windows_per_s < 0:
            raise ValueError("windows_per_s must be >= 0 (0 = unpaced), got %r" % windows_per_s)
        self.windows_per_s = float(windows_per_s)
        self.clock = as_clock(clock, sleep)
        self._closed = threading.Event()
        #: Windows handed to the consumer so far.
        self.emitted = 0

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._closed.is_set()

    def windows(self) -> Iterator[Window]:
        """Yield windows, at most ``windows_per_s`` per second of the clock; blocks between them.

        The pacing wait comes before each window is made (so its time is its emission time); a
        finite source therefore ends one period after its last window.
        """
        source = self._generate()
        period_s = 1.0 / self.windows_per_s if self.windows_per_s > 0 else 0.0
        due_s = None
        try:
            while not self.closed:
                if period_s:
                    now_s = self.clock.now()
                    if due_s is None or now_s - due_s > period_s:
                        due_s = now_s  # first window, or a slow consumer: no catch-up burst
                    elif due_s > now_s:
                        self.clock.wait(due_s - now_s, self._closed)
                        if self.closed:
                            return
                    due_s += period_s
                try:
                    window = next(source)
                except StopIteration:
                    return
                if self.closed:
                    return
                self.emitted += 1
                yield window
        finally:
            close_gen = getattr(source, "close", None)
            if close_gen is not None:
                close_gen()

    def close(self) -> None:
        """Stop the stream: a blocked ``windows()`` returns promptly; safe from any thread."""
        self._closed.set()
        self._on_close()

    def _on_close(self) -> None:
        """Hook for subclasses that block on something other than the clock (e.g. a queue)."""

    @abc.abstractmethod
    def _generate(self) -> Iterator[Window]:
        """The unpaced windows of this source; may block (it should return once ``closed``)."""

    def __enter__(self) -> "SensorSource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
