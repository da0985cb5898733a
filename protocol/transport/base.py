"""The publish/subscribe interface both runtimes use, so cores never see paho."""
import abc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from streamfl.errors import TransportError

#: ``on_message(topic, payload)``; called from the transport's network thread.
MessageHandler = Callable[[str, bytes], None]
#: ``on_connect(session_present)`` / ``on_disconnect(reason)``.
ConnectHandler = Callable[[bool], None]
DisconnectHandler = Callable[[str], None]
#: ``acked()`` of a tracked publish: True once the broker has acknowledged the message.
AckProbe = Callable[[], bool]


def _handed_over() -> bool:
    return True


def validate_topic(topic: str) -> str:
    """A publish topic: non-empty, no wildcards, no NUL (MQTT 3.1.1 section 4.7)."""
    if not isinstance(topic, str) or not topic or "+" in topic or "#" in topic or "\0" in topic:
        raise TransportError("invalid publish topic %r" % (topic,))
    return topic


def validate_filter(topic_filter: str) -> str:
    """A subscription filter: ``+`` fills a whole level, ``#`` only as the whole last level."""
    if not isinstance(topic_filter, str) or not topic_filter or "\0" in topic_filter:
        raise TransportError("invalid topic filter %r" % (topic_filter,))
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if ("+" in level and level != "+") or ("#" in level and (level != "#" or i != len(levels) - 1)):
            raise TransportError("invalid topic filter %r" % (topic_filter,))
    return topic_filter

@dataclass(frozen=True)
class MqttSettings:
    """How to reach the broker; the password comes from a file or the environment, never a flag."""

    host: str = "localhost"
    port: int = 1883
    client_id: str = "streamfl"
    keepalive_s: int = 30
    #: Persistent session (clean_start false) so QoS 1 messages wait while the client is away.
    persistent_session: bool = True
    reconnect_min_s: float = 1.0
    reconnect_max_s: float = 60.0
    tls_ca: Optional[Path] = None
    tls_cert: Optional[Path] = None
    tls_key: Optional[Path] = None
    username: Optional[str] = None
    password: Optional[str] = None

    def __repr__(self) -> str:  # never print the password
        return "MqttSettings(host=%r, port=%r, client_id=%r, tls=%s, username=%r)" % (
            self.host, self.port, self.client_id, self.tls_ca is not None, self.username)


class Transport(abc.ABC):
    """An MQTT-like client: QoS 0/1 publish, wildcard subscriptions, retained messages, last will.

    Subscriptions registered with ``subscribe`` are re-established on every (re)connect, until
    ``unsubscribe``; each SUBSCRIBE makes the broker send the filter's retained messages again.
    ``on_message``, ``on_connect`` and ``on_disconnect`` are plain attributes set by the owner.
    """

    def __init__(self) -> None:
        self.on_message: Optional[MessageHandler] = None
        self.on_connect: Optional[ConnectHandler] = None
        self.on_disconnect: Optional[DisconnectHandler] = None

    @abc.abstractmethod
    def set_will(self, topic: str, payload: bytes, qos: int = 1, retain: bool = True) -> None:
        """Register the last will; must be called before ``connect``."""

    @abc.abstractmethod
    def connect(self) -> None:
        """Start connecting in the background; reconnects with capped exponential back-off."""

    @abc.abstractmethod
    def close(self) -> None:
        """Disconnect cleanly (the will is not sent) and stop the network thread."""

    @abc.abstractmethod
    def subscribe(self, topic_filter: str, qos: int = 1) -> None:
        """Subscribe now if connected, and on every later connect."""

    @abc.abstractmethod
    def unsubscribe(self, topic_filter: str) -> None:
        """Stop receiving ``topic_filter`` now if connected, and forget it for later connects.

        Called while offline, the broker is told at the next connect: a persistent session may
        still hold the filter there, and would otherwise go on delivering it."""

    @abc.abstractmethod
    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> bool:
        """Queue a message; False if it could not be handed to the network layer (e.g. offline)."""

    def publish_tracked(self, topic: str, payload: bytes, qos: int = 1,
                        retain: bool = False) -> Optional[AckProbe]:
        """``publish`` that also says when the broker has the message; None if it was refused.

        Lets a caller keep its own durable copy until the broker acknowledges it. This default
        counts a handed-over message as acknowledged; transports that see acknowledgements (paho's
        PUBACK) override it.
        """
        return _handed_over if self.publish(topic, payload, qos, retain) else None

    def delay_reconnect(self, seconds: float) -> bool:
        """Wait at least ``seconds`` before each reconnect from now on (0: back to the
        transport's own delays); called from ``on_disconnect`` it applies to the reconnect that
        follows. False where the transport has no reconnect delay to change (this default)."""
        return False

    @property
    @abc.abstractmethod
    def connected(self) -> bool:
        """True while a broker connection is up."""

    def wait_connected(self, timeout_s: float) -> bool:
        """Block until connected or ``timeout_s`` passes; True if connected."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.connected:
                return True
            time.sleep(0.02)
        return self.connected
