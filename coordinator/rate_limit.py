"""A device's updates count at most as fast as its own rounds could make them.

A registered device that sent bounded updates 19 times a second pulled a whole fleet's model to
chance in 3 s, although admission bounded every single one. A real board trains one round at a
time, and a round can start only once the model it trains from exists. So the coordinator keeps,
per device, the time by which the rounds it has counted could at the earliest be done
(``busy_until``): an update trained from version v starts no sooner than that time and than v's
publication (the history knows when each version was made), and takes ``spacing = max(1 /
max_updates_per_s, round_time_fraction * the round time the update claims)``. It counts if it
could be done by now, give or take ``burst`` spacings of slack (timing jitter, a few updates in
flight); otherwise it is dropped and counted (``rejected_rate``).

Why the base version's time and not a plain token bucket: a board cut off from the broker keeps
training and queues its updates (up to 200), then sends them back to back when it is back; they
all start from the old model it had, published long ago, so the time since then pays for them,
while a flood of updates from the current model has no time to pay with. A device that claims an
old base gets at most the time since that version was made, once, for updates that count as that
stale. Versions the history no longer holds count as made now.
"""
from collections import OrderedDict
from typing import Optional

#: Devices whose times are kept (least recently heard first out): bounded whatever the sender.
MAX_DEVICES = 100000


class DeviceRateLimit:
    """Per device, when its counted rounds could be done; ``allow`` counts one more or says no."""

    def __init__(self, max_updates_per_s: Optional[float], burst: int, round_time_fraction: float):
        self.min_spacing_s = 0.0 if not max_updates_per_s else 1.0 / float(max_updates_per_s)
        self.burst = int(burst)
        self.round_time_fraction = float(round_time_fraction)
        self._busy_until: "OrderedDict[str, float]" = OrderedDict()

    def allow(self, device_id: str, round_s: float, now: float,
              base_made_s: Optional[float] = None) -> bool:
        """True (and counted) if ``device_id``'s update, claiming a round of ``round_s`` trained
        from a version made at ``base_made_s`` (None: unknown, taken as ``now``), may count at
        ``now``."""
        spacing = max(self.min_spacing_s, self.round_time_fraction * max(0.0, round_s))
        if spacing <= 0.0:
            return True
        made = now if base_made_s is None else min(float(base_made_s), now)
        start = max(self._busy_until.pop(device_id, made), made)
        done = start + spacing
        allowed = done <= now + self.burst * spacing
        self._busy_until[device_id] = done if allowed else start
        while len(self._busy_until) > MAX_DEVICES:
            self._busy_until.popitem(last=False)
        return allowed
