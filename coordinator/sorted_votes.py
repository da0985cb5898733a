"""The median of per-device values kept sorted as they change, so that reading it costs O(log n).

Admission reads a fleet-wide median for every update: the median of the devices' recent norm
votes (the reference of its bound) and the median of the other devices' sample counts (the cap
of a claimed count). Taking it from a fresh list each time sorted every device's value per
update, O(n log n): at 100,000 devices, tens of milliseconds per update, which would make the
coordinator's rate fall as the fleet grows. ``SortedVotes`` keeps each device's value in a
``sortedcontainers.SortedList`` as votes come, so a vote and a median read cost O(log n).

The medians are the same floats ``statistics.median`` and ``shares.median_of`` give over the same
values (the middle value, or the mean of the two middle ones written as ``(a + b) / 2``), so the
simulator's figures do not move.

A vote may carry the time it was cast: ``expire(now, ttl_s)`` drops the votes older than
``ttl_s`` (a device that stopped sending stops counting). Times must not go backwards between
votes (admission's clock only moves forward); a vote without a time never expires.
"""
from collections import OrderedDict
from typing import Any, Dict, Optional, Tuple

from sortedcontainers import SortedList


def middle(values: Any) -> Optional[float]:
    """The median of a sorted sequence as ``statistics.median`` computes it; None if empty."""
    n = len(values)
    if n == 0:
        return None
    half = n // 2
    if n % 2:
        return float(values[half])
    return (float(values[half - 1]) + float(values[half])) / 2


class SortedVotes:
    """Each device's latest value, sorted; the median of all, or of all but one device."""

    def __init__(self) -> None:
        self._sorted = SortedList()
        #: device -> (value, time cast or None), oldest vote first.
        self._by_device: "OrderedDict[str, Tuple[Any, Optional[float]]]" = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_device)

    def __contains__(self, device_id: str) -> bool:
        return device_id in self._by_device

    def set(self, device_id: str, value: Any, at: Optional[float] = None) -> None:
        """``device_id`` votes ``value`` (at time ``at``), replacing its earlier vote."""
        self.discard(device_id)
        self._by_device[device_id] = (value, at)
        self._sorted.add(value)

    def discard(self, device_id: str) -> None:
        """Forget ``device_id``'s vote, if any."""
        old = self._by_device.pop(device_id, None)
        if old is not None:
            self._sorted.remove(old[0])

    def clear(self) -> None:
        self._sorted.clear()
        self._by_device.clear()

    def expire(self, now: float, ttl_s: float) -> int:
        """Drop the votes cast more than ``ttl_s`` before ``now``; how many were dropped."""
        dropped = 0
        while self._by_device:
            device_id, (value, at) = next(iter(self._by_device.items()))
            if at is None or now - at <= ttl_s:
                break
            self._by_device.popitem(last=False)
            self._sorted.remove(value)
            dropped += 1
        return dropped

    def median(self) -> Optional[float]:
        """The median of every vote; None without any."""
        return middle(self._sorted)

    def median_without(self, device_id: str) -> Optional[float]:
        """The median of every other device's vote (leave-one-out); None if there is none."""
        own = self._by_device.get(device_id)
        if own is None:
            return self.median()
        n = len(self._sorted) - 1
        if n == 0:
            return None
        skip = self._sorted.index(own[0])  # the first equal value stands for the device's own
        half = n // 2

        def at(i: int) -> Any:
            return self._sorted[i if i < skip else i + 1]
        if n % 2:
            return float(at(half))
        return (float(at(half - 1)) + float(at(half))) / 2

    def oldest(self) -> Optional[str]:
        """The device whose vote is the oldest; None without votes."""
        return next(iter(self._by_device), None)

    def values(self) -> Dict[str, Any]:
        """device -> value, oldest vote first (a copy)."""
        return {d: v for d, (v, _) in self._by_device.items()}
