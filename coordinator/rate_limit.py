"""A device's updates count at most as fast as its own rounds could make them: a token bucket per device.

A registered device that sends bounded updates 19 times a second pulled a whole fleet's model to
chance in 3 s, although admission bounded every single one. A real board trains one round at a
time, so its updates are at least a round apart: each update says how long its round took
(``seconds_per_sample * num_samples``). A device's bucket holds ``burst`` tokens (an outbox that
flushes after an outage sends a few at once); an update takes one, and tokens come back one per
``spacing`` seconds, where ``spacing = max(1 / max_updates_per_s, round_time_fraction * the
update's claimed round time)``. A device that claims long rounds is held to them; one that claims
none is held to ``max_updates_per_s``. The excess is dropped and counted (``rejected_rate``).
Buckets live in memory only: a restart forgets them, which can only let a few more updates in.
"""
from collections import OrderedDict
from typing import Optional, Tuple

#: Devices whose buckets are kept (least recently heard first out): bounded whatever the sender.
MAX_DEVICES = 100000


class DeviceRateLimit:
    """Token buckets per device; ``allow(device, round_s, now)`` spends a token or says no."""

    def __init__(self, max_updates_per_s: Optional[float], burst: int, round_time_fraction: float):
        self.min_spacing_s = 0.0 if not max_updates_per_s else 1.0 / float(max_updates_per_s)
        self.burst = int(burst)
        self.round_time_fraction = float(round_time_fraction)
        #: device -> (tokens, time of the last refill)
        self._buckets: "OrderedDict[str, Tuple[float, float]]" = OrderedDict()

    def allow(self, device_id: str, round_s: float, now: float) -> bool:
        """True (a token spent) if ``device_id`` may have an update counted at ``now``; ``round_s``
        is the round time the update claims (it refills the time since the device's last one)."""
        spacing = max(self.min_spacing_s, self.round_time_fraction * max(0.0, round_s))
        tokens, last = self._buckets.pop(device_id, (float(self.burst), now))
        if spacing <= 0:
            tokens = float(self.burst)
        elif now > last:
            tokens = min(float(self.burst), tokens + (now - last) / spacing)
        allowed = tokens >= 1.0
        if allowed:
            tokens -= 1.0
        self._buckets[device_id] = (tokens, max(now, last))
        while len(self._buckets) > MAX_DEVICES:
            self._buckets.popitem(last=False)
        return allowed
