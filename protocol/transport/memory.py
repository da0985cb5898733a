"""An in-process MQTT broker and client: the transport of the simulator and of fast unit tests.

It keeps the MQTT semantics the cores rely on (QoS 1 queueing for persistent sessions, retained
messages, ``+``/``#`` wildcards, last will on an unclean drop) but delivers synchronously in the
publishing thread, so a simulation stays deterministic. Callbacks that publish do not recurse: their
messages join one FIFO queue that the outermost publish drains.
"""
import collections
import logging
import threading
from typing import Callable, Deque, Dict, List, Optional, Set, Tuple

from streamfl.protocol.transport.base import Transport, validate_filter, validate_topic

log = logging.getLogger(__name__)

Will = Tuple[str, bytes, int, bool]


def topic_matches(topic_filter: str, topic: str) -> bool:
    """MQTT matching: ``+`` one level, ``#`` the rest (and the parent); wildcards skip ``$`` topics."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    f_levels, t_levels = topic_filter.split("/"), topic.split("/")
    for i, level in enumerate(f_levels):
        if level == "#":
            return True
        if i >= len(t_levels) or (level != "+" and level != t_levels[i]):
            return False
    return len(f_levels) == len(t_levels)


class _Session:
    """What the broker remembers of a client id: subscriptions and QoS 1 messages while offline."""

    def __init__(self, persistent: bool):
        self.persistent = persistent
        self.subscriptions: Dict[str, int] = {}
        self.pending: Deque[Tuple[str, bytes]] = collections.deque()
        self.client: Optional["MemoryTransport"] = None


class MemoryBroker:
    """The shared broker of a set of ``MemoryTransport`` clients in one process (thread-safe).

    ``propagate_errors`` re-raises an exception from a subscriber callback out of the publishing
    call (tests want that); otherwise it is logged and delivery continues, as with paho.
    """

    def __init__(self, propagate_errors: bool = False, max_pending: int = 10000):
        self.propagate_errors = propagate_errors
        self.max_pending = max_pending
        self.retained: Dict[str, bytes] = {}
        self.published = 0
        self.dropped = 0
        self._sessions: Dict[str, _Session] = {}
        self._lock = threading.RLock()
        self._queue: Deque[Callable[[], None]] = collections.deque()
        self._draining = False
        #: topic -> [(session, granted qos)]; cleared whenever sessions or subscriptions change
        self._routes: Dict[str, List[Tuple[_Session, int]]] = {}

    # -- client side (called by MemoryTransport) -------------------------------------------------

    def _connect(self, client: "MemoryTransport") -> None:
        with self._lock:
            session = self._sessions.get(client.client_id)
            old = session.client if session is not None else None
            if old is not None and old is not client:  # session takeover: the old connection ends
                self._detach(old, "taken over by a new connection", send_will=False)
            present = session is not None and session.persistent and client.persistent_session
            if not present:
                session = self._sessions[client.client_id] = _Session(client.persistent_session)
                self._routes.clear()
            session.persistent = client.persistent_session
            session.client = client
            client._connected = True
            self._queue.append(lambda: client._fire_connect(present))
            while session.pending:
                topic, payload = session.pending.popleft()
                self._queue.append(self._delivery(client, topic, payload))
            for topic_filter in client._dropped_filters:
                session.subscriptions.pop(topic_filter, None)
            client._dropped_filters.clear()
            self._routes.clear()
            for topic_filter, qos in client._filters.items():
                self._subscribe(client, topic_filter, qos)
        self._drain()

    def _disconnect(self, client: "MemoryTransport", reason: str, send_will: bool) -> None:
        with self._lock:
            if not client._connected:
                return
            self._detach(client, reason, send_will)
        self._drain()

    def _detach(self, client: "MemoryTransport", reason: str, send_will: bool) -> None:
        session = self._sessions.get(client.client_id)
        client._connected = False
        if session is not None and session.client is client:
            session.client = None
            if not session.persistent:
                del self._sessions[client.client_id]
                self._routes.clear()
        if send_will and client._will is not None:
            self._route(*client._will)
        self._queue.append(lambda: client._fire_disconnect(reason))

    def _subscribe(self, client: "MemoryTransport", topic_filter: str, qos: int) -> None:
        with self._lock:
            session = self._sessions[client.client_id]
            session.subscriptions[topic_filter] = qos
            self._routes.clear()
            for topic, payload in self.retained.items():
                if topic_matches(topic_filter, topic):
                    self._queue.append(self._delivery(client, topic, payload))

    def _unsubscribe(self, client: "MemoryTransport", topic_filter: str) -> None:
        with self._lock:
            session = self._sessions.get(client.client_id)
            if session is not None:
                session.subscriptions.pop(topic_filter, None)
                self._routes.clear()

    def _publish(self, topic: str, payload: bytes, qos: int, retain: bool) -> None:
        with self._lock:
            self._route(topic, payload, qos, retain)
        self._drain()

    # -- broker internals ------------------------------------------------------------------------

    def _route(self, topic: str, payload: bytes, qos: int, retain: bool) -> None:
        """Queue deliveries to every matching session (lock held); remember retained messages."""
        self.published += 1
        if retain:
            if payload:
                self.retained[topic] = payload
            else:
                self.retained.pop(topic, None)
        routes = self._routes.get(topic)
        if routes is None:
            routes = []
            for session in self._sessions.values():
                granted = max((q for f, q in session.subscriptions.items() if topic_matches(f, topic)),
                              default=-1)
                if granted >= 0:
                    routes.append((session, granted))
            if len(self._routes) > 100000:
                self._routes.clear()
            self._routes[topic] = routes
        for session, granted in routes:
            if session.client is not None:
                self._queue.append(self._delivery(session.client, topic, payload))
            elif session.persistent and min(qos, granted) >= 1:
                if len(session.pending) >= self.max_pending:
                    self.dropped += 1
                    log.warning("memory broker: offline queue full, dropping message on %s", topic)
                else:
                    session.pending.append((topic, payload))

    def _delivery(self, client: "MemoryTransport", topic: str, payload: bytes) -> Callable[[], None]:
        def deliver() -> None:
            with self._lock:
                session = self._sessions.get(client.client_id)
                if not client._connected:  # went away after the message was queued for it
                    if session is not None and session.persistent and session.client is None:
                        session.pending.append((topic, payload))
                    return
            client._fire_message(topic, payload)
        return deliver

    def _drain(self) -> None:
        """Run queued deliveries and callbacks in FIFO order; only the outermost caller drains."""
        with self._lock:
            if self._draining:
                return
            self._draining = True
        try:
            while True:
                with self._lock:
                    if not self._queue:
                        self._draining = False
                        return
                    job = self._queue.popleft()
                try:
                    job()
                except Exception:
                    if self.propagate_errors:
                        raise
                    log.exception("memory broker: subscriber callback failed")
        except BaseException:
            with self._lock:
                self._draining = False
            raise

    # -- test and simulator controls -------------------------------------------------------------

    def drop(self, client_id: str) -> bool:
        """Simulate a network loss of ``client_id``: its will is published; False if not connected."""
        with self._lock:
            session = self._sessions.get(client_id)
            client = session.client if session is not None else None
            if client is None:
                return False
            self._detach(client, "connection lost", send_will=True)
        self._drain()
        return True

    def clients(self) -> List[str]:
        """Client ids connected right now."""
        with self._lock:
            return sorted(cid for cid, s in self._sessions.items() if s.client is not None)

    def pending(self, client_id: str) -> int:
        """QoS 1 messages waiting for an offline persistent session."""
        with self._lock:
            session = self._sessions.get(client_id)
            return len(session.pending) if session is not None else 0


class MemoryTransport(Transport):
    """A client of a ``MemoryBroker``; no automatic reconnect (call ``connect`` again after ``drop``)."""

    def __init__(self, broker: MemoryBroker, client_id: str, persistent_session: bool = True):
        super().__init__()
        self.broker = broker
        self.client_id = client_id
        self.persistent_session = persistent_session
        self._filters: Dict[str, int] = {}
        #: Unsubscribed while offline: the broker's session forgets them at the next connect.
        self._dropped_filters: Set[str] = set()
        self._will: Optional[Will] = None
        self._connected = False

    def set_will(self, topic: str, payload: bytes, qos: int = 1, retain: bool = True) -> None:
        self._will = (validate_topic(topic), bytes(payload), qos, retain)

    def connect(self) -> None:
        """Connect now (synchronously); messages queued for a persistent session follow."""
        if not self._connected:
            self.broker._connect(self)

    def close(self) -> None:
        """Clean disconnect: no will; a persistent session keeps its subscriptions and queue."""
        self.broker._disconnect(self, "closed", send_will=False)

    def subscribe(self, topic_filter: str, qos: int = 1) -> None:
        self._filters[validate_filter(topic_filter)] = qos
        if self._connected:
            self.broker._subscribe(self, topic_filter, qos)
            self.broker._drain()

    def unsubscribe(self, topic_filter: str) -> None:
        self._filters.pop(validate_filter(topic_filter), None)
        if self._connected:
            self.broker._unsubscribe(self, topic_filter)
        else:
            self._dropped_filters.add(topic_filter)

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> bool:
        """Deliver before returning, False offline; from a callback, or while another thread is
        delivering, the message is queued and that outer delivery loop hands it over (FIFO)."""
        validate_topic(topic)
        if not self._connected:
            return False
        self.broker._publish(topic, bytes(payload), qos, retain)
        return True

    @property
    def connected(self) -> bool:
        return self._connected

    def _fire_message(self, topic: str, payload: bytes) -> None:
        if self.on_message is not None:
            self.on_message(topic, payload)

    def _fire_connect(self, session_present: bool) -> None:
        if self.on_connect is not None:
            self.on_connect(session_present)

    def _fire_disconnect(self, reason: str) -> None:
        if self.on_disconnect is not None:
            self.on_disconnect(reason)
