"""The daemon transport: paho-mqtt 2.x with a persistent session, last will, TLS and reconnect back-off.

Protocol choice: MQTT 3.1.1 with ``clean_session=False``, not MQTT 5 with ``clean_start=False`` and
a session expiry. Every broker a fleet meets speaks 3.1.1 (mosquitto 1.x/2.x, EMQX, HiveMQ, and amqtt,
the embedded fallback broker, which speaks only 3.1.1); MQTT 5's only gain here would be the
client-chosen session expiry, which mosquitto's ``persistent_client_expiration`` provides on the
broker side (set it longer than a board may stay away).

Offline behaviour: paho keeps QoS 1 publishes made while disconnected in memory (at most
``max_queued_messages``) and sends them after reconnecting, so ``publish`` returns True for them;
it returns False when paho refuses (queue full, or QoS 0 while offline). The queue dies with the
process, which is why the agent also keeps an outbox on disk for its updates.
"""
import collections
import logging
import ssl
import sys
import threading
import time
from pathlib import Path
from typing import Any, Deque, Dict, Optional, Set

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode

from streamfl.errors import ConfigError, TransportError
from streamfl.protocol.transport.base import AckProbe, MqttSettings, Transport, validate_filter
from streamfl.protocol.transport.credentials import PASSWORD_ENV, read_password

log = logging.getLogger(__name__)

__all__ = ["PahoTransport", "read_password", "PASSWORD_ENV"]


def _acked(info: mqtt.MQTTMessageInfo) -> bool:
    """True once the broker acknowledged the message (or paho gave up on it)."""
    try:
        return info.is_published()
    except (ValueError, RuntimeError):  # paho raises for messages it refused or could not send
        return True


class PahoTransport(Transport):
    """``Transport`` on paho-mqtt's network thread; callbacks run on that thread.

    ``connect`` returns at once: a broker that is down is retried with capped exponential back-off
    (``reconnect_min_s`` doubling to ``reconnect_max_s``), and every subscription is re-sent on each
    (re)connect. Exceptions from the owner's callbacks are logged, never allowed to kill the thread.
    """

    def __init__(self, settings: MqttSettings, max_queued_messages: int = 100, close_timeout_s: float = 5.0):
        super().__init__()
        self.settings = settings
        self.close_timeout_s = close_timeout_s
        self._filters: Dict[str, int] = {}
        #: Filters unsubscribed while offline: a persistent session may still hold them at the
        #: broker, so the next connect sends their UNSUBSCRIBE before anything else.
        self._dropped_filters: Set[str] = set()
        self._unacked: Deque[mqtt.MQTTMessageInfo] = collections.deque()
        self._lock = threading.RLock()
        self._started = False
        self._closed = False
        self._network_thread: Any = None
        #: True once on_connect took its snapshot of the filters for the current connection
        self._subscribed = False
        self._sent_subscriptions = False
        #: the last connection failure logged as a warning, so a broker that stays down logs once
        self._last_failure: Any = None
        #: True between an accepted CONNACK and the next disconnect
        self._accepted = False
        self._refused = False
        #: The broker's reason for refusing the last connection attempt (its CONNACK code, e.g.
        #: "Not authorized"); None once a connection is accepted. Lets a caller stop retrying.
        self.refusal: Optional[str] = None
        try:
            self._client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=settings.client_id,
                                       clean_session=not settings.persistent_session,
                                       protocol=mqtt.MQTTv311, reconnect_on_failure=True)
            self._client.reconnect_delay_set(settings.reconnect_min_s,  # type: ignore[arg-type]
                                             settings.reconnect_max_s)
            self._client.max_queued_messages_set(max_queued_messages)
        except (ValueError, TypeError) as exc:
            raise ConfigError("invalid MQTT settings for %s: %s" % (settings.client_id, exc)) from exc
        if settings.username:
            self._client.username_pw_set(settings.username, settings.password)
        if settings.tls_ca is not None:
            self._set_tls(settings)
        self._client.on_connect = self._handle_connect
        self._client.on_disconnect = self._handle_disconnect
        self._client.on_message = self._handle_message
        self._client.on_connect_fail = self._handle_connect_fail

    def _set_tls(self, settings: MqttSettings) -> None:
        for path in (settings.tls_ca, settings.tls_cert, settings.tls_key):
            if path is not None and not Path(path).is_file():
                raise ConfigError("TLS file %s does not exist" % path)
        try:
            self._client.tls_set(ca_certs=str(settings.tls_ca),
                                 certfile=str(settings.tls_cert) if settings.tls_cert else None,
                                 keyfile=str(settings.tls_key) if settings.tls_key else None)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise ConfigError("cannot load TLS files for %s: %s" % (settings.client_id, exc)) from exc

    # -- Transport -------------------------------------------------------------------------------

    def set_will(self, topic: str, payload: bytes, qos: int = 1, retain: bool = True) -> None:
        if self._started:
            raise TransportError("set_will must be called before connect")
        try:
            self._client.will_set(topic, payload, qos=qos, retain=retain)
        except (ValueError, TypeError) as exc:
            raise TransportError("invalid last will on %r: %s" % (topic, exc)) from exc

    def connect(self) -> None:
        """Start the network thread; it connects (and reconnects) in the background."""
        if self._closed:
            raise TransportError("transport %s was closed; make a new one" % self.settings.client_id)
        if self._started:
            return
        try:
            self._client.connect_async(self.settings.host, self.settings.port, self.settings.keepalive_s)
        except (ValueError, OSError) as exc:
            raise TransportError("cannot connect to %s:%s: %s" % (
                self.settings.host, self.settings.port, exc)) from exc
        if self._client.loop_start() != MQTTErrorCode.MQTT_ERR_SUCCESS:
            raise TransportError("cannot start the MQTT network thread")
        self._started = True
        log.info("connecting to %s:%d as %s", self.settings.host, self.settings.port, self.settings.client_id)

    def close(self) -> None:
        """Wait (up to ``close_timeout_s``) for QoS 1 acks, send DISCONNECT (the broker drops the
        will) and stop the network thread.

        The wait matters: paho closes the socket right after DISCONNECT, and a PUBACK arriving on a
        closed socket makes the kernel reset the connection, which loses whatever the broker had not
        read yet (seen with mosquitto: the last publish and the DISCONNECT itself).
        """
        if self._closed:
            return
        deadline = time.monotonic() + self.close_timeout_s
        waiting = threading.current_thread() is not self._network_thread  # it would wait for itself
        while waiting and self.connected and self._pending_acks() and time.monotonic() < deadline:
            time.sleep(0.005)
        self._closed = True
        try:
            self._client.disconnect()
        except (OSError, ValueError) as exc:  # the socket may already be gone
            log.debug("disconnect failed: %s", exc)
        if self._started:
            self._client.loop_stop()
        self._started = False

    def subscribe(self, topic_filter: str, qos: int = 1) -> None:
        # Checked here, not by paho: a filter stored while offline would otherwise make paho raise
        # inside on_connect, which kills its network thread.
        validate_filter(topic_filter)
        with self._lock:
            self._filters[topic_filter] = qos
            send_now = self._subscribed  # else the coming on_connect subscribes it (no duplicate)
        if send_now:
            try:
                result, _ = self._client.subscribe(topic_filter, qos)
            except ValueError as exc:
                with self._lock:
                    self._filters.pop(topic_filter, None)
                raise TransportError("invalid topic filter %r: %s" % (topic_filter, exc)) from exc
            if result != MQTTErrorCode.MQTT_ERR_SUCCESS:  # lost meanwhile: on_connect re-subscribes
                log.debug("subscribe %s deferred: %s", topic_filter, mqtt.error_string(result))

    def unsubscribe(self, topic_filter: str) -> None:
        validate_filter(topic_filter)
        with self._lock:
            self._filters.pop(topic_filter, None)
            send_now = self._subscribed
            if not send_now:
                self._dropped_filters.add(topic_filter)
        if send_now:
            result, _ = self._client.unsubscribe(topic_filter)
            if result != MQTTErrorCode.MQTT_ERR_SUCCESS:  # lost meanwhile: the next connect sends it
                with self._lock:
                    if topic_filter not in self._filters:
                        self._dropped_filters.add(topic_filter)

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> bool:
        """True if paho sent or queued the message; see the module docstring for offline rules."""
        info = self._publish(topic, payload, qos, retain)
        return info.rc == MQTTErrorCode.MQTT_ERR_SUCCESS or (
            info.rc == MQTTErrorCode.MQTT_ERR_NO_CONN and qos > 0 and not self._closed)  # queued

    def publish_tracked(self, topic: str, payload: bytes, qos: int = 1,
                        retain: bool = False) -> Optional[AckProbe]:
        """Probe of the PUBACK for a message paho put on the wire; None for anything else.

        A QoS 1 message paho only queued (the link dropped a moment ago) also counts as refused:
        paho cannot report its acknowledgement, so the caller keeps its copy and sends it again
        after the reconnect. The broker then gets it twice; the coordinator drops the repeat by
        its ``update_id``.
        """
        info = self._publish(topic, payload, qos, retain)
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            return None
        return lambda: qos == 0 or _acked(info)

    def _publish(self, topic: str, payload: bytes, qos: int, retain: bool) -> mqtt.MQTTMessageInfo:
        if self._closed:  # paho would queue a QoS 1 message for a reconnect that never comes
            info = mqtt.MQTTMessageInfo(0)
            info.rc = MQTTErrorCode.MQTT_ERR_NO_CONN
            return info
        try:
            info = self._client.publish(topic, payload, qos=qos, retain=retain)
        except (ValueError, TypeError) as exc:
            raise TransportError("cannot publish on %r: %s" % (topic, exc)) from exc
        if info.rc == MQTTErrorCode.MQTT_ERR_SUCCESS and qos > 0:
            with self._lock:  # paho can only tell us about acks of messages it sent
                self._unacked.append(info)
                if len(self._unacked) > 64:
                    self._pending_acks()
        elif info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            log.debug("publish on %s not sent now: %s", topic, mqtt.error_string(info.rc))
        return info

    def delay_reconnect(self, seconds: float) -> bool:
        """paho's reconnect delay from now on: at least ``seconds`` (its doubling then starts
        there), or the settings' ``reconnect_min_s`` .. ``reconnect_max_s`` again for 0. paho
        resets its delay on every accepted connection, so a caller that wants a longer wait after
        a connection the broker closed calls this from ``on_disconnect``, before paho waits."""
        low = max(float(seconds), self.settings.reconnect_min_s)
        self._client.reconnect_delay_set(low, max(low, self.settings.reconnect_max_s))  # type: ignore[arg-type]
        return True

    def _pending_acks(self) -> int:
        """QoS 1 publishes the broker has not acknowledged yet (forgets the acknowledged ones)."""
        with self._lock:
            self._unacked = collections.deque(i for i in self._unacked if not _acked(i))
            return len(self._unacked)

    @property
    def connected(self) -> bool:
        return self._client.is_connected()

    @property
    def subscribed(self) -> bool:
        """True once this connection sent its subscriptions: a broker handles them before any
        publish sent after this, so an answer to that publish reaches us."""
        with self._lock:
            return self._sent_subscriptions

    # -- paho callbacks (network thread) ---------------------------------------------------------

    def _handle_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any,
                        properties: Any) -> None:
        self._network_thread = threading.current_thread()
        if reason_code.is_failure:
            self._refused = True
            self.refusal = str(reason_code)
            self._log_failure("refused by the broker: %s" % reason_code)
            return
        self._last_failure = None
        self.refusal = None
        self._accepted = True
        with self._lock:
            filters = list(self._filters.items())
            dropped = sorted(self._dropped_filters - set(self._filters))
            self._dropped_filters.clear()
            self._subscribed = True
        if dropped:
            client.unsubscribe(dropped)
        if filters:
            client.subscribe(filters)
        with self._lock:
            self._sent_subscriptions = True
        session_present = bool(getattr(flags, "session_present", False))
        log.info("connected to %s:%d as %s (session present: %s)", self.settings.host,
                 self.settings.port, self.settings.client_id, session_present)
        self._call(self.on_connect, session_present)

    def _handle_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any,
                           properties: Any) -> None:
        with self._lock:
            self._subscribed = False
            self._sent_subscriptions = False
            accepted, self._accepted = self._accepted, False
            refused, self._refused = self._refused, False   # the CONNACK's reason was logged
        reason = "closed" if self._closed else str(reason_code)
        if self._closed:
            log.info("disconnected from %s:%d", self.settings.host, self.settings.port)
        elif accepted:
            log.warning("lost connection to %s:%d (%s); reconnecting", self.settings.host,
                        self.settings.port, reason)
        elif not refused:  # e.g. a TLS 1.3 broker rejecting our client certificate after the handshake
            self._log_failure("connection closed before the broker accepted it (%s); check the "
                              "client certificate and the broker's log" % reason)
        self._call(self.on_disconnect, reason)

    def _handle_connect_fail(self, client: mqtt.Client, userdata: Any) -> None:
        """Log why a connection attempt failed: once as a warning, repeats of it at debug level.

        paho calls this inside its ``except OSError`` block, so the error (refused, unreachable, a
        TLS certificate the broker or we reject) is in ``sys.exc_info()``.
        """
        exc = sys.exc_info()[1]
        self._log_failure("%s: %s" % (type(exc).__name__, exc) if exc is not None else "unknown error")

    def _log_failure(self, reason: str) -> None:
        """A failed attempt: a warning when the reason is new, debug while it repeats."""
        level = logging.DEBUG if reason == self._last_failure else logging.WARNING
        self._last_failure = reason
        log.log(level, "cannot connect to %s:%d as %s (%s); retrying", self.settings.host,
                self.settings.port, self.settings.client_id, reason)

    def _handle_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        try:
            topic = message.topic
        except UnicodeDecodeError:
            log.warning("dropping message with a non-UTF-8 topic")
            return
        self._call(self.on_message, topic, message.payload)

    @staticmethod
    def _call(handler: Any, *args: Any) -> None:
        if handler is None:
            return
        try:
            handler(*args)
        except Exception:
            log.exception("transport callback %s failed", getattr(handler, "__qualname__", handler))

