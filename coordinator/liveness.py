"""One coordinator per fleet: a coordinator that finds another live one of its fleet refuses to
start, unless told to take over; a running one that is taken over steps down; and no coordinator
publishes anything on a connection before it has read who holds the fleet.

Two coordinators of one fleet on one broker both aggregate, and with the same client id (the
default, ``coordinator-<fleet>``, or one account under ``use_username_as_clientid``, where the
broker makes the user name the client id) they kick each other off the broker in turn: the agents
follow each run alternately. What tells them apart is the retained ``coordinator/status`` message:
online while a coordinator is connected (its last will sets it offline when the connection dies),
and it names the coordinator (``CoordinatorStatus``: run id, client id, host, pid, start time and
a random ``instance`` per process).

**At start** (``check_fleet``, before the coordinator connects): a *probe* connection (clean
session, no will) reads the retained status. It must never take the live coordinator's client id:
a clean session on that id would kick the live coordinator off and wipe the QoS 1 messages the
broker queued for its persistent session (every update sent while it was down). So the probe
connects with a client id of its own (``<client id>-probe-<random>``) and, where the coordinator
logs in with a user name, with an account of its own (``probe_settings``: ``exclusive.
probe_username``, by default ``<mqtt.username>-probe``; the shipped ACL's ``coordinator-probe``
may only read the status and its echo topic), because a broker that replaces client ids with user
names (the shipped ``streamfl.conf``) would otherwise give it the coordinator's. To know when the
retained status would have arrived, the probe publishes one empty message on a topic of its own
(``coordinator/probe/<probe id>``, which it also reads) after subscribing: a broker sends a
subscription's retained messages before it handles the next packet, so the echo comes after them.

The probe never guesses. A broker that refuses the probe's account, or an echo that does not come
back within ``probe_wait_s`` of connecting (an ACL without the probe's topics), is a
``StartupError`` (exit code 2) naming the account and the fix. A broker that cannot be reached is
waited for (a warning every ``connect_wait_s``): the coordinator connects only once it knows. The
probe answers:

- no status, or an offline one: start;
- online with this state folder's own run id: a previous process of this very coordinator that did
  not stop cleanly (killed; the broker fires the will only after 1.5 keep-alives): start, and say
  so;
- online with another run: ``StartupError`` (exit code 2) naming it, unless ``take_over``: then
  the probe tells the live one (a status naming it in ``took_over``, not retained; where the
  probe's account may not write the status, the live one learns it from the newcomer's status
  when it reconnects, below) and the coordinator starts.

**On every connection** (``ConnectGate``, ``yields_on_connect``): the coordinator's own
connection publishes nothing (no online status, no model, no command, no reply) until it has read
the retained status on that connection (the same echo trick, on ``coordinator/probe/<instance>``)
and found nobody it must yield to. Between the probe and the connection another coordinator may
have come, or, on a reconnect, taken the fleet while this one was away; one sharing this one's
client id is offline by then (the broker fired its will when this connection took the id), so an
offline status counts too: one that names this process in ``took_over``, and, on a reconnect,
one that would beat this one were it online (it held the fleet after this one lost it). An echo
that does not come in ``probe_wait_s`` opens the gate with a warning (the probe proved the topic
at start; a reply would have come in milliseconds).

**While running** (``beats``): the server subscribes to its own status topic, and steps down
(stops, exit code 2, without publishing offline over the other's status) when another run's
online status *beats* its own: one that took over this very process, or, neither having taken
over the other, an older one (the newcomer yields, as it would have at start).
"""
import logging
import threading
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from streamfl.config import bounded
from streamfl.errors import StartupError
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import CoordinatorStatus
from streamfl.protocol.topics import Topics
from streamfl.protocol.transport.base import MqttSettings
from streamfl.protocol.transport.credentials import PASSWORD_ENV, read_password
from streamfl.protocol.transport.paho import PahoTransport

log = logging.getLogger(__name__)

#: The default probe account is the coordinator's user name with this suffix.
PROBE_SUFFIX = "-probe"
#: How often the probe looks at its connection while it waits (seconds).
_POLL_S = 0.05


@dataclass(frozen=True)
class ExclusiveConfig:
    """One coordinator per fleet (``coordinator/liveness.py``).

    take_over: start even though another coordinator of the fleet is online, which then steps down
      (the ``--take-over`` flag). Off: such a start fails with exit code 2, naming the live one.
    probe_wait_s: how long the start-up probe waits, once connected, for its echo (which comes
      after the retained status, in milliseconds on a LAN); past it the start fails with exit code
      2 (the broker's ACL keeps the probe from its topics). The coordinator's own connection waits
      as long for its echo before it publishes anyway, with a warning. 2 s: a hundred times a
      LAN's round trip.
    connect_wait_s: while the broker cannot be reached, the probe warns this often and goes on
      waiting: a coordinator publishes nothing before it knows it is alone. 10 s, as long as the
      coordinator waits before telling systemd it is ready.
    probe_username: the account the start-up probe logs in with. null: ``<mqtt.username>-probe``
      when mqtt.username is set (the shipped ACL's ``coordinator-probe``), else none (the probe's
      own client id keeps it apart). Never the coordinator's own account on a broker that makes
      the user name the client id: the probe's clean session would wipe the coordinator's.
    probe_password_file: file whose first line is the probe account's password. null: the
      coordinator's (mqtt.password_file, or $STREAMFL_MQTT_PASSWORD).
    probe_tls_cert: client certificate of the probe (with probe_tls_key), for brokers that take
      the user name from the certificate (use_identity_as_username: its CN must be the probe
      account). null: the coordinator's (mqtt.tls_cert).
    probe_tls_key: private key of probe_tls_cert. null: the coordinator's (mqtt.tls_key).
    """

    take_over: bool = False
    probe_wait_s: float = bounded(2.0, 0.0, 60.0, lo_open=True)
    connect_wait_s: float = bounded(10.0, 0.0, 600.0, lo_open=True)
    probe_username: Optional[str] = None
    probe_password_file: Optional[Path] = None
    probe_tls_cert: Optional[Path] = None
    probe_tls_key: Optional[Path] = None

    def __post_init__(self) -> None:
        if not 0.0 < self.probe_wait_s <= 60.0:
            raise ValueError("exclusive.probe_wait_s must be in (0, 60], got %r" % (self.probe_wait_s,))
        if not 0.0 < self.connect_wait_s <= 600.0:
            raise ValueError("exclusive.connect_wait_s must be in (0, 600], got %r" % (self.connect_wait_s,))
        if self.probe_username is not None and (not self.probe_username or any(
                c.isspace() or c in "+#/" for c in self.probe_username)):
            raise ValueError("exclusive.probe_username must be a user name (no spaces, +, # or /), "
                             "got %r" % (self.probe_username,))
        if (self.probe_tls_cert is None) != (self.probe_tls_key is None):
            raise ValueError("exclusive.probe_tls_cert and exclusive.probe_tls_key must be given together")


def new_instance() -> str:
    """A random id for one coordinator process (a restart on the same state folder gets another)."""
    return uuid.uuid4().hex[:16]


def describe(status: CoordinatorStatus) -> str:
    """The live coordinator in words, from what its status carries."""
    parts = ["run %s" % (status.run_id or "(unnamed)")]
    if status.client_id:
        parts.append("client id %s" % status.client_id)
    if status.host:
        parts.append("host %s" % status.host + (" pid %d" % status.pid if status.pid else ""))
    if status.started_s > 0:
        parts.append("started %s" % time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(status.started_s)))
    parts.append("at version %d" % status.version)
    return ", ".join(parts)


def beats(other: CoordinatorStatus, mine: CoordinatorStatus) -> bool:
    """True if the coordinator of ``other`` keeps the fleet over the one of ``mine``: it is online,
    of another run, and it took over ``mine``'s process, or (neither took over the other) it is the
    older (start time, then instance, so that exactly one of two wins)."""
    if not other.online or other.instance == mine.instance or other.run_id == mine.run_id:
        return False
    if other.took_over and other.took_over == mine.instance:
        return True
    if mine.took_over and mine.took_over == other.instance:
        return False
    return (other.started_s, other.instance) < (mine.started_s, mine.instance)


def yields_on_connect(other: CoordinatorStatus, mine: CoordinatorStatus, reconnect: bool) -> bool:
    """True if a coordinator reading ``other`` on a connection, before it said anything there, must
    step down: ``other`` beats it online, or it is offline but names this process as the one it
    took over, or (on a ``reconnect``) it would beat this one were it online. An offline status of
    another run on a reconnect means that coordinator connected after this one lost the broker;
    one sharing this one's client id (one account, ``use_username_as_clientid``) is offline only
    because this connection took the id from it, and answering it by staying would kick it off in
    turn, forever."""
    if other.instance == mine.instance or other.run_id == mine.run_id:
        return False
    if beats(other, mine):
        return True
    if other.online:
        return False
    if other.took_over and other.took_over == mine.instance:
        return True
    return reconnect and beats(replace(other, online=True), mine)


def probe_settings(settings: MqttSettings, config: ExclusiveConfig,
                   environ: Optional[Mapping[str, str]] = None) -> MqttSettings:
    """The start-up probe's connection settings: ``settings`` (the coordinator's) with a client id
    of its own, a clean session and, where the coordinator has a user name, the probe's account
    (``ExclusiveConfig.probe_username`` and its password file, certificate and key)."""
    username = config.probe_username or (settings.username + PROBE_SUFFIX if settings.username else None)
    password = settings.password
    if config.probe_password_file is not None:
        password = read_password(config.probe_password_file, PASSWORD_ENV, environ or {})
    probe = replace(settings, client_id="%s-probe-%s" % (settings.client_id, uuid.uuid4().hex[:8]),
                    persistent_session=False, username=username,
                    password=password if username else None)
    if config.probe_tls_cert is not None:
        probe = replace(probe, tls_cert=config.probe_tls_cert, tls_key=config.probe_tls_key)
    return probe


class _Probe:
    """A short-lived read-only client on the fleet's coordinator status topic."""

    def __init__(self, settings: MqttSettings, topics: Topics):
        self.topics = topics
        self.transport = PahoTransport(settings, close_timeout_s=2.0)
        self.decoder = Decoder({})
        self.status: Optional[CoordinatorStatus] = None
        #: Set once the echo came back: a retained status would have come before it.
        self.answered = threading.Event()
        self.echo_topic = "%s/coordinator/probe/%s" % (topics.prefix, settings.client_id)
        self.transport.on_message = self._on_message
        self.transport.on_connect = self._on_connect
        self.transport.subscribe(topics.coordinator_status, qos=1)
        self.transport.subscribe(self.echo_topic, qos=1)

    def _on_connect(self, session_present: bool) -> None:
        # Called on the network thread after the transport sent the SUBSCRIBE: the echo follows it.
        self.transport.publish(self.echo_topic, b"", qos=1)

    def _on_message(self, topic: str, payload: bytes) -> None:
        if topic == self.echo_topic:
            self.answered.set()
            return
        msg = self.decoder.try_decode(payload, source=topic)
        if isinstance(msg, CoordinatorStatus) and not self.answered.is_set():
            self.status = msg  # the retained one (a later one of a reconnect replaces it)


def _account(settings: MqttSettings) -> str:
    return ("account %s" % settings.username) if settings.username else "no user name"


def _read_status(probe: _Probe, settings: MqttSettings, fleet: str, config: ExclusiveConfig,
                 on_wait: Callable[[str], None]) -> Optional[CoordinatorStatus]:
    """Wait until the probe read the retained status (None: there is none). ``StartupError`` if
    the broker refuses the probe or its echo does not come back; an unreachable broker is waited
    for, with a warning (and ``on_wait``) every ``connect_wait_s``."""
    started = time.monotonic()
    warn_at = started + config.connect_wait_s
    connected_since: Optional[float] = None
    where = "%s:%d" % (settings.host, settings.port)
    while not probe.answered.wait(_POLL_S):
        now = time.monotonic()
        refusal = getattr(probe.transport, "refusal", None)
        if refusal:
            raise StartupError(
                "the broker at %s refused the start-up probe's %s (%s): it looks for another "
                "coordinator of fleet %s with an account of its own, so that it never takes the "
                "coordinator's client id and session. Add that account to the broker's password "
                "file and ACL (configs/mosquitto/acl: user %s), or set exclusive.probe_username / "
                "exclusive.probe_password_file to one it accepts" % (
                    where, _account(settings), refusal, fleet, settings.username or "<name>"))
        if probe.transport.connected:
            connected_since = connected_since or now
            if now - connected_since > config.probe_wait_s:
                raise StartupError(
                    "the start-up probe (%s) got no echo on %s within %g s (exclusive.probe_wait_s) "
                    "at %s: the broker's ACL must let it read %s and read and write %s/coordinator/"
                    "probe/# (configs/mosquitto/acl, user %s); without them it cannot tell whether "
                    "another coordinator of fleet %s is online" % (
                        _account(settings), probe.echo_topic, config.probe_wait_s, where,
                        probe.topics.coordinator_status, probe.topics.prefix,
                        settings.username or "<name>", fleet))
            continue
        connected_since = None
        if now >= warn_at:
            warn_at = now + config.connect_wait_s
            message = ("cannot reach the broker at %s for %.0f s to look for another coordinator of "
                       "fleet %s: waiting (this coordinator publishes nothing before it knows it "
                       "is alone)" % (where, now - started, fleet))
            log.warning("%s", message)
            on_wait(message)
    return probe.status


def check_fleet(settings: MqttSettings, fleet: str, mine: CoordinatorStatus,
                config: ExclusiveConfig, environ: Optional[Mapping[str, str]] = None,
                on_wait: Callable[[str], Any] = lambda message: None) -> Optional[CoordinatorStatus]:
    """Look for another live coordinator of ``fleet`` before this one (``mine``: its status as it
    will publish it; ``settings``: its own connection's) connects. Returns the status of the one
    it takes over (None if none); ``StartupError`` if one is live and ``config.take_over`` is off,
    or if the probe cannot look (module docstring). Blocks while the broker is unreachable,
    calling ``on_wait(message)`` with each warning."""
    topics = Topics(fleet)
    probe_mqtt = probe_settings(settings, config, environ)
    probe = _Probe(probe_mqtt, topics)
    try:
        probe.transport.connect()
        other = _read_status(probe, probe_mqtt, fleet, config, on_wait)
        if other is None or not other.online:
            log.info("no other coordinator of fleet %s is online%s", fleet,
                     "" if other is None else " (the last one, %s, went offline)" % describe(other))
            return None
        if other.run_id and other.run_id == mine.run_id:
            log.info("the retained status says this coordinator's own run %s is online: a previous "
                     "process on this state folder that did not stop cleanly (%s); starting",
                     mine.run_id, describe(other))
            return None
        if not config.take_over:
            raise StartupError(
                "another coordinator of fleet %s is online on %s:%d (%s); stop it first, or start "
                "this one with --take-over (exclusive.take_over) to replace it" % (
                    fleet, settings.host, settings.port, describe(other)))
        log.warning("taking over fleet %s from the coordinator online on the broker (%s): it steps "
                    "down", fleet, describe(other))
        notice = replace(mine, online=True, took_over=other.instance)
        probe.transport.publish(topics.coordinator_status, encode(notice), qos=1, retain=False)
        time.sleep(min(1.0, config.probe_wait_s))  # let it hear the notice before our client id kicks it
        return other
    finally:
        probe.transport.close()


class ConnectGate:
    """Whether a coordinator may publish on its current connection: closed from each connect until
    the echo of that connection (``echo_payload``) comes back on ``echo_topic`` (the retained
    status, read before it, found nobody to yield to), or ``overdue``. Thread-safe."""

    def __init__(self, topics: Topics, instance: str):
        self.echo_topic = "%s/coordinator/probe/%s" % (topics.prefix, instance)
        self._lock = threading.Lock()
        self._connections = 0
        self._open = False
        self._waiting_since: Optional[float] = None

    def connected(self) -> bytes:
        """A new connection: closed; the echo payload to publish on it."""
        with self._lock:
            self._connections += 1
            self._open = False
            self._waiting_since = time.monotonic()
            return str(self._connections).encode("ascii")

    def disconnected(self) -> None:
        with self._lock:
            self._open = False
            self._waiting_since = None

    @property
    def reconnect(self) -> bool:
        """True from the second connection of this process on."""
        with self._lock:
            return self._connections > 1

    @property
    def is_open(self) -> bool:
        with self._lock:
            return self._open

    def echo(self, payload: bytes) -> bool:
        """True (and open) if ``payload`` is the current connection's echo and it was waiting."""
        with self._lock:
            if self._waiting_since is None or payload != str(self._connections).encode("ascii"):
                return False
            self._open, self._waiting_since = True, None
            return True

    def overdue(self, wait_s: float) -> bool:
        """True (and open) if the current connection has waited longer than ``wait_s``."""
        with self._lock:
            if self._waiting_since is None or time.monotonic() - self._waiting_since <= wait_s:
                return False
            self._open, self._waiting_since = True, None
            return True

    def hold(self) -> None:
        """Stay closed on this connection (stepping down): neither echo nor time opens it."""
        with self._lock:
            self._open = False
            self._waiting_since = None


class GatedTransport:
    """The coordinator's transport as its publisher sees it: ``connected`` only while the
    ``ConnectGate`` is open, so nothing is published before the coordinator knows it is alone;
    everything else is the transport's."""

    def __init__(self, transport: Any, gate: ConnectGate):
        self._transport = transport
        self._gate = gate

    @property
    def connected(self) -> bool:
        return self._gate.is_open and self._transport.connected

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
