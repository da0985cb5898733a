"""A bounded history of past global models, so stale updates and strategies can look back.

Entries share the (never mutated) tensors of each version, so keeping ``size`` versions costs
``size`` model copies in memory and nothing per aggregation. When each version was made is kept
much longer (``times_size`` versions, a float each): the rate limit asks it of the old base of a
backlog a board sends after an outage.
"""
from collections import deque
from typing import Deque, List, NamedTuple, Optional

from streamfl.protocol.messages import Tensors


class HistoryEntry(NamedTuple):
    """One past global model."""

    version: int
    tensors: Tensors
    time_s: float


class ModelHistory:
    """The last ``size`` versions, oldest first."""

    def __init__(self, size: int = 10, times_size: int = 100000):
        if size < 1:
            raise ValueError("history size must be >= 1, got %r" % size)
        self.size = size
        self._entries: Deque[HistoryEntry] = deque(maxlen=size)
        #: When versions ``_first_timed ..`` were made, consecutive versions only.
        self._times: Deque[float] = deque(maxlen=max(size, times_size))
        self._first_timed = 0

    def add(self, version: int, tensors: Tensors, time_s: float) -> None:
        """Record ``version``; the oldest entry falls out when full."""
        self._entries.append(HistoryEntry(int(version), tensors, float(time_s)))
        if not self._times or version != self._first_timed + len(self._times):
            self._times.clear()
            self._first_timed = int(version)
        elif len(self._times) == self._times.maxlen:
            self._first_timed += 1
        self._times.append(float(time_s))

    def made_s(self, version: int) -> Optional[float]:
        """When ``version`` was made, if still known."""
        k = int(version) - self._first_timed
        return self._times[k] if 0 <= k < len(self._times) else None

    def get(self, version: int) -> Optional[HistoryEntry]:
        """The entry of ``version`` if still kept."""
        for entry in reversed(self._entries):
            if entry.version == version:
                return entry
        return None

    def versions(self) -> List[int]:
        return [e.version for e in self._entries]

    def latest(self) -> Optional[HistoryEntry]:
        return self._entries[-1] if self._entries else None

    def __len__(self) -> int:
        return len(self._entries)
