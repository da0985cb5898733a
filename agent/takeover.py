"""Another board with this device id: the broker's take-over cycle seen from one agent, sans-I/O.

Under the shipped broker config (``use_username_as_clientid true``) the client id is the device
id, and a broker drops a client's connection when another connects with the same client id. Two
boards flashed from one image (the same hostname, so the same derived device id, and the same
password) therefore take the connection from each other about once a reconnect delay, forever;
each only sees ``lost connection (Unspecified error)``. The transport speaks MQTT 3.1.1
(``protocol/transport/paho.py``), where a take-over closes the socket without a reason code
(MQTT 5's "session taken over", 0x8E, would name it), so the cycle is read from how long the
connections last: ``connections`` connections within ``window_s`` seconds, each accepted by the
broker and closed again within ``short_s`` seconds, is "probably another board with this id". A
broker restart refuses the reconnects instead, and a cut link times out after the keep-alive
(30 s), so neither looks like this; a link that drops every few seconds does, and the ERROR says
what else it may be.

Then the agent backs off rather than fighting: every such drop doubles the time it waits before
reconnecting, from ``backoff_min_s`` to ``backoff_max_s``, so the broker's take-overs slow to one
per ``backoff_max_s`` and the board that holds the connection keeps working meanwhile. It resumes
the transport's own reconnect delays once a connection has held for twice ``backoff_max_s``: a
clone at the cap would have taken it by then. The daemon (``agent/daemon.py``) feeds it the
connects and drops with its clock and carries out the delays (``Transport.delay_reconnect``).
"""
import collections
import logging
from typing import Deque, Dict, Optional

log = logging.getLogger(__name__)

#: The first back-off once the cycle is recognized (seconds); doubled at every take-over after.
BACKOFF_MIN_S = 2.0
#: While the take-overs go on, the ERROR is repeated (with the count) at most this often (seconds).
REPEAT_S = 600.0


class TakeoverWatch:
    """Counts the broker's take-overs of this device id and says how long to wait before
    reconnecting; every method takes the time (seconds, one monotonic clock) as an argument."""

    def __init__(self, device_id: str, short_s: float = 10.0, connections: int = 3,
                 window_s: float = 60.0, backoff_max_s: float = 300.0,
                 backoff_min_s: float = BACKOFF_MIN_S):
        self.device_id = device_id
        self.short_s = float(short_s)
        self.connections = max(1, int(connections))
        self.window_s = float(window_s)
        self.backoff_max_s = float(backoff_max_s)
        self.backoff_min_s = min(float(backoff_min_s), self.backoff_max_s)
        #: Broker take-overs counted as another board's (the drops that showed the cycle included).
        self.takeovers = 0
        #: Times the cycle was recognized (each followed by a back-off until it ended).
        self.detections = 0
        #: True from the recognition until a connection held for ``stable_s``.
        self.suspected = False
        #: The wait before the next reconnect while suspected (0: the transport's own).
        self.delay_s = 0.0
        self._up_since: Optional[float] = None
        self._short: Deque[float] = collections.deque()
        self._logged_s: Optional[float] = None
        self._held = 0

    @property
    def stable_s(self) -> float:
        """How long a connection must hold for the agent to resume its normal reconnects."""
        return 2.0 * self.backoff_max_s

    def connected(self, now: float) -> None:
        """The broker accepted a connection."""
        self._up_since = now

    def dropped(self, now: float) -> float:
        """A connection the agent did not close was lost: the seconds to wait, at least, before
        the next reconnect (0: the transport's own delay)."""
        if self._up_since is None:  # an attempt the broker never accepted: not a take-over
            return self.delay_s
        lasted, self._up_since = max(0.0, now - self._up_since), None
        if self.suspected:
            if lasted >= self.stable_s:  # held long enough: whatever dropped it, not the clone
                self._resume(now, lasted)
                return 0.0
            self.takeovers += 1
            self.delay_s = min(self.backoff_max_s, max(self.backoff_min_s, self.delay_s * 2.0))
            self._report(now, lasted)
            return self.delay_s
        if lasted >= self.short_s:
            return 0.0
        self._short.append(now)
        while self._short and now - self._short[0] > self.window_s:
            self._short.popleft()
        if len(self._short) < self.connections:
            return 0.0
        self.suspected = True
        self.detections += 1
        self.takeovers += len(self._short)
        self._short.clear()
        self.delay_s = self.backoff_min_s
        self._report(now, lasted)
        return self.delay_s

    def check(self, now: float) -> bool:
        """Called now and then while running: True when this call ended the back-off (the
        connection has held for ``stable_s``)."""
        if self.suspected and self._up_since is not None and now - self._up_since >= self.stable_s:
            self._resume(now, now - self._up_since)
            return True
        return False

    def status(self) -> Dict[str, object]:
        """For telemetry, counters and the service status."""
        return {"duplicate_id_takeovers": self.takeovers, "duplicate_id_suspected": self.suspected,
                "duplicate_id_backoff_s": self.delay_s}

    def _report(self, now: float, lasted: float) -> None:
        if self._logged_s is not None and now - self._logged_s < REPEAT_S:
            self._held += 1
            log.debug("connection taken over again after %.1f s (%d take-overs); next reconnect "
                      "in %.0f s", lasted, self.takeovers, self.delay_s)
            return
        first = self._logged_s is None
        self._logged_s, held, self._held = now, self._held, 0
        log.error("another board is probably using device id %s: the broker closed this agent's "
                  "connection %s, each time within %.0f s of accepting it (%d take-overs so far%s). Under "
                  "use_username_as_clientid the device id is the MQTT client id, and a second "
                  "board with it (boards flashed from one image share the hostname, the default "
                  "id) takes the connection from this one. Give each board its own device_id "
                  "(and broker account); if no other board has it, check the link and the "
                  "broker's log ('already connected'). Backing off: next reconnect in %.0f s, "
                  "growing to %.0f s", self.device_id,
                  "%d times in %.0f s" % (self.connections, self.window_s) if first else "again",
                  self.short_s if first else max(lasted, self.short_s), self.takeovers,
                  ", %d not logged" % held if held else "", self.delay_s, self.backoff_max_s)

    def _resume(self, now: float, lasted: float) -> None:
        log.info("the connection as %s held %.0f s: no other board seems to take it any more; "
                 "normal reconnects resume (%d take-overs counted)", self.device_id, lasted,
                 self.takeovers)
        self.suspected = False
        self.delay_s = 0.0
        self._short.clear()
        self._logged_s = None
        self._held = 0
