"""When a virtual device is there at all: its join and leave times and its offline windows (the
session paper's dynamic device set), as the queries the simulator's event loop asks.

The windows come validated from ``DeviceSpec`` (sorted, non-overlapping ``[start_s, end_s)``,
an end may be inf); each query is a binary search over them.
"""
import bisect
import math
from typing import Optional, Sequence, Tuple


class Presence:
    """Present from ``join_s`` until ``leave_s`` (None: never leaves), outside ``offline``."""

    def __init__(self, join_s: float, leave_s: Optional[float],
                 offline: Sequence[Tuple[float, float]] = ()):
        self.join_s = float(join_s)
        self.leave_s = None if leave_s is None else float(leave_s)
        self._starts = [float(w[0]) for w in offline]
        self._ends = [float(w[1]) for w in offline]

    def available(self, t_s: float) -> bool:
        """Whether the device is present at ``t_s``: joined, not left, outside offline windows."""
        if t_s < self.join_s or (self.leave_s is not None and t_s >= self.leave_s):
            return False
        i = bisect.bisect_right(self._starts, t_s) - 1
        return not (i >= 0 and t_s < self._ends[i])

    def next_available_s(self, t_s: float) -> Optional[float]:
        """The first time >= ``t_s`` the device is present; None if it never is again."""
        t_s = max(float(t_s), self.join_s)
        i = bisect.bisect_right(self._starts, t_s) - 1
        if i >= 0 and t_s < self._ends[i]:
            t_s = self._ends[i]
            # Sorted, non-overlapping: only a window starting exactly here can hold it longer.
            while i + 1 < len(self._starts) and self._starts[i + 1] <= t_s:
                i += 1
                t_s = self._ends[i]
        if not math.isfinite(t_s) or (self.leave_s is not None and t_s >= self.leave_s):
            return None
        return t_s

    def next_unavailable_s(self, t_s: float) -> Optional[float]:
        """The first time >= ``t_s`` the device is absent (``t_s`` itself if it is); None if never.

        The runtime uses it to drop a round the device leaves before finishing."""
        if not self.available(t_s):
            return float(t_s)
        ends = [self.leave_s] if self.leave_s is not None else []
        i = bisect.bisect_right(self._starts, t_s)
        if i < len(self._starts):
            ends.append(self._starts[i])
        return min(ends) if ends else None

    def online_s(self, t_s: float) -> float:
        """Seconds the device was present in [0, ``t_s``): what its idle power is counted over."""
        end = float(t_s) if self.leave_s is None else min(float(t_s), self.leave_s)
        total = max(0.0, end - self.join_s)
        for start, stop in zip(self._starts, self._ends):
            lo, hi = max(start, self.join_s), min(stop, end)
            if hi > lo:
                total -= hi - lo
        return max(0.0, total)
