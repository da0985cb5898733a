"""A bounded history of past global models, so stale updates and strategies can look back.

Entries share the (never mutated) tensors of each version, so keeping ``size`` versions costs
``size`` model copies in memory and nothing per aggregation.
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

    def __init__(self, size: int = 10):
        if size < 1:
            raise ValueError("history size must be >= 1, got %r" % size)
        self.size = size
        self._entries: Deque[HistoryEntry] = deque(maxlen=size)

    def add(self, version: int, tensors: Tensors, time_s: float) -> None:
        """Record ``version``; the oldest entry falls out when full."""
        self._entries.append(HistoryEntry(int(version), tensors, float(time_s)))

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
