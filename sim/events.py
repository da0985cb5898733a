"""A discrete-event queue on a virtual clock: the simulator's only notion of time.

Events pop in time order; events at the same time pop in the order they were pushed (a sequence
number breaks the tie), so a run is a pure function of its inputs and seeds. Payloads are never
compared, so any object may ride along. A handler whose pushes come later (a device round whose
training runs in a worker meanwhile) ``reserve``s their sequence numbers first, so that ties pop
as if it had pushed them at once.
"""
import heapq
import math
from typing import Any, List, NamedTuple, Optional


class Event(NamedTuple):
    """One scheduled happening: when (virtual seconds), push order, what, and its data."""

    time_s: float
    seq: int
    kind: str
    payload: Any = None


class EventQueue:
    """A min-heap of ``Event`` by (time_s, seq); ``now_s`` is the time of the last popped event."""

    def __init__(self, start_s: float = 0.0):
        if not math.isfinite(start_s):
            raise ValueError("start_s must be finite, got %r" % (start_s,))
        self._heap: List[Event] = []
        self._seq = 0
        self._now_s = float(start_s)

    @property
    def now_s(self) -> float:
        """The virtual clock: the time of the last popped event (the start time before any)."""
        return self._now_s

    def reserve(self, n: int) -> int:
        """The first of ``n`` sequence numbers kept for later ``push(..., seq=)`` calls."""
        first = self._seq
        self._seq += int(n)
        return first

    def push(self, time_s: float, kind: str, payload: Any = None, seq: Optional[int] = None) -> None:
        """Schedule ``kind`` at ``time_s``; the past (before ``now_s``) is refused so time never runs
        back. ``seq``: a number ``reserve`` gave (None: the next one)."""
        time_s = float(time_s)
        if not math.isfinite(time_s):
            raise ValueError("event %r: time must be finite, got %r" % (kind, time_s))
        if time_s < self._now_s:
            raise ValueError("event %r at %.9g s is in the past (now %.9g s)"
                             % (kind, time_s, self._now_s))
        if seq is None:
            seq = self._seq
            self._seq += 1
        heapq.heappush(self._heap, Event(time_s, seq, kind, payload))

    def pop(self) -> Event:
        """The earliest event (first pushed among equals); advances ``now_s``. IndexError if empty."""
        if not self._heap:
            raise IndexError("pop from an empty event queue")
        event = heapq.heappop(self._heap)
        self._now_s = event.time_s
        return event

    def peek(self) -> Optional[Event]:
        """The next event, without popping it; None if the queue is empty."""
        return self._heap[0] if self._heap else None

    def peek_time(self) -> Optional[float]:
        """When the next event happens, without popping it; None if the queue is empty."""
        return self._heap[0].time_s if self._heap else None

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)
