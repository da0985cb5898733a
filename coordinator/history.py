"""A bounded history of past global models, so stale updates and strategies can look back.

Entries share the (never mutated) tensors of each version, so keeping ``size`` versions costs
``size`` model copies in memory and nothing per aggregation. When each version was made is kept
much longer (``times_size`` versions, a float each): the rate limit asks it of the old base of a
backlog a board sends after an outage.
"""
from collections import deque
from typing import Any, Deque, Dict, List, NamedTuple, Optional

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

    def times_since(self, newest_s: float, limit: int) -> Dict[str, Any]:
        """When the last ``limit`` timed versions were made, as seconds before ``newest_s`` (JSON
        for the state folder: a restart's clock is another process's)."""
        times = list(self._times)[-int(limit):] if limit > 0 else []
        first = self._first_timed + len(self._times) - len(times)
        return {"first": first, "before_s": [round(newest_s - t, 3) for t in times]}

    def seed_times(self, saved: Any, newest_s: float, below: int) -> int:
        """Take back what ``times_since`` saved, on this clock (``newest_s``: when the newest saved
        version counts as made here), for the versions below ``below`` (the restored one, which
        ``add`` then records); anything malformed is ignored. Returns how many were taken."""
        if not isinstance(saved, dict) or not isinstance(saved.get("first"), int):
            return 0
        ages = saved.get("before_s")
        if not isinstance(ages, list) or not all(
                isinstance(a, (int, float)) and not isinstance(a, bool) and 0.0 <= a < 1e9 for a in ages):
            return 0
        first = int(saved["first"])
        ages = ages[:max(0, below - first)]
        if not ages or first < 0:
            return 0
        self._times.clear()
        self._first_timed = first
        for age in ages[-(self._times.maxlen or len(ages)):]:
            self._times.append(float(newest_s) - float(age))
        self._first_timed = below - len(self._times)
        return len(self._times)

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
