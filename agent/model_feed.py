"""Which global models reach a board: the model topic is subscribed only while the agent wants one,
so the broker sends about one model per round the board starts, never every version or a backlog.

The coordinator publishes each version once, retained (QoS 1). The agent subscribes to the model
topic at QoS 0:

- **before each round it starts** (a *fetch*): the broker answers the SUBSCRIBE with the retained,
  newest model, and the agent unsubscribes once it has it. A fetch is skipped when a model already
  arrived since the last round began (a model the agent waited for, below): it is the newest the
  agent knows of, and fetching would send it twice;
- **while only a newer model lets a round start** (``AgentCore.wants_model``: none held yet, a
  "train" command names a version not held, the last rounds diverged on the model held): the
  subscription stays until such a model has come.

Why QoS 0 on a retained topic, and not a request to the coordinator: the broker does the fan-out
from one retained copy (the coordinator publishes each version once, whatever the fleet's size),
and a broker queues no QoS 0 message for a session that is away (mosquitto's
``queue_qos0_messages false``, set explicitly in the shipped broker configuration). A board that
was away for any number of versions finds nothing queued and gets one model, the retained one,
when it next subscribes (the transport subscribes again on reconnect while a fetch is open). A
QoS 0 message lost with a connection is sent again by that re-subscription. Signed models and run
identity are untouched: the retained frame is the coordinator's signed frame, judged by the same
``ModelGate``.

``fetch_timeout_s`` bounds a fetch that brings no model (no coordinator yet, a model that fails
its signature): the round then starts from the model held. It is generous because the fetch is a
download: a 2 MB model over a 1 Mbit/s cellular link takes 17 s.
"""
import logging
import threading
import time
from typing import Callable, Dict

from streamfl.protocol.transport.base import Transport

log = logging.getLogger(__name__)

#: Models are fetched at QoS 0: a broker queues none for a session that is away (see above).
MODEL_QOS = 0


class ModelFeed:
    """Holds the model topic subscribed while the agent wants a model; counts what it brings."""

    def __init__(self, transport: Transport, topic: str, fetch_timeout_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self.transport = transport
        self.topic = topic
        self.fetch_timeout_s = float(fetch_timeout_s)
        self._clock = clock
        self._cond = threading.Condition()
        self._subscribed = False
        self._fetching = False
        self._standing = False
        #: Models that arrived (decoded frames on the model topic), and whether one came since the
        #: last round began.
        self._arrivals = 0
        self._fresh = False
        self._timeouts_in_a_row = 0
        self.counters: Dict[str, int] = {"fetches": 0, "fetches_skipped": 0, "fetch_timeouts": 0,
                                         "fetches_cut": 0, "subscribes": 0}

    @property
    def subscribed(self) -> bool:
        with self._cond:
            return self._subscribed

    def want(self, standing: bool) -> None:
        """Say whether only a newer model lets a round start (``AgentCore.wants_model``): the
        subscription is held while that, or a fetch, is so."""
        with self._cond:
            self._standing = bool(standing)
            self._sync()

    def arrived(self, still_wanted: bool) -> None:
        """A model frame came on the topic (network thread); ``still_wanted``: the agent's
        ``wants_model`` after judging it. Ends an open fetch."""
        with self._cond:
            self._arrivals += 1
            self._fresh = True
            self._fetching = False
            self._standing = bool(still_wanted)
            self._sync()
            self._cond.notify_all()

    def fetch(self, should_stop: Callable[[], bool]) -> bool:
        """Before a round: get the newest model unless one came since the last round began.

        Blocks until a model arrives, ``fetch_timeout_s`` passes, ``should_stop()`` or the broker
        is unreachable; True if the round starts from a model that is the newest known."""
        with self._cond:
            if self._fresh:
                self.counters["fetches_skipped"] += 1
                return True
            if not self.transport.connected:
                return False
            self.counters["fetches"] += 1
            seen = self._arrivals
            self._fetching = True
            self._sync()
            deadline = self._clock() + self.fetch_timeout_s
            # A connection lost during the fetch ends it too: the round starts from the model held
            # (its update goes to the outbox) rather than waiting out the timeout for a model that
            # cannot come.
            while self._arrivals == seen and not should_stop() and self.transport.connected:
                left = deadline - self._clock()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.2))
            got = self._arrivals != seen
            if got:
                self._timeouts_in_a_row = 0
            elif not self.transport.connected:
                self.counters["fetches_cut"] += 1
                log.info("the broker went away during a model fetch; the round starts from the "
                         "model held")
            elif not should_stop():
                self.counters["fetch_timeouts"] += 1
                self._timeouts_in_a_row += 1
                level = logging.WARNING if self._timeouts_in_a_row == 1 else logging.DEBUG
                log.log(level, "no global model came within %.0f s of asking on %s; rounds start "
                        "from the model held until one comes (is the coordinator running?)",
                        self.fetch_timeout_s, self.topic)
            self._fetching = False
            self._sync()
            return got

    def round_began(self) -> None:
        """The next model that arrives is newer than what this round started from."""
        with self._cond:
            self._fresh = False

    def _sync(self) -> None:
        """Subscribe or unsubscribe to match what is wanted (lock held)."""
        wanted = self._standing or self._fetching
        if wanted == self._subscribed:
            return
        self._subscribed = wanted
        if wanted:
            self.counters["subscribes"] += 1
            self.transport.subscribe(self.topic, qos=MODEL_QOS)
        else:
            self.transport.unsubscribe(self.topic)
