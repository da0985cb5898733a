"""One coordinator per fleet: a coordinator that finds another live one of its fleet refuses to
start, unless told to take over; a running one that is taken over steps down.

Two coordinators of one fleet on one broker both aggregate, and with the same client id (the
default, ``coordinator-<fleet>``) they kick each other off the broker in turn: the agents follow
each run alternately. What tells them apart is the retained ``coordinator/status`` message: online
while a coordinator is connected (its last will sets it offline when the connection dies), and it
names the coordinator (``CoordinatorStatus``: run id, client id, host, pid, start time and a
random ``instance`` per process).

**At start** (``check_fleet``, before the coordinator connects): a *probe* connection with a
client id of its own (``<client id>-probe-<random>``, clean session, no will) reads the retained
status. A probe, not the real client id: connecting with the real one would take over the live
coordinator's session at once, kicking it off and taking the QoS 1 messages queued for it. To know
when the retained status would have arrived, the probe publishes one empty message on a topic of
its own (``coordinator/probe/<probe id>``, which it also reads) after subscribing: a broker sends
a subscription's retained messages before it handles the next packet, so the echo comes after
them (a broker whose ACL refuses that topic costs ``probe_wait_s`` instead). The probe answers:

- no status, or an offline one: start;
- online with this state folder's own run id: a previous process of this very coordinator that did
  not stop cleanly (killed; the broker fires the will only after 1.5 keep-alives): start, and say
  so;
- online with another run: ``StartupError`` (exit code 2) naming it, unless ``take_over``: then
  the probe tells the live one (a status naming it in ``took_over``, not retained) and the
  coordinator starts.

If the broker cannot be reached within ``connect_wait_s`` the check is skipped with a warning (a
daemon may start before its network); the running rule below still settles a conflict.

**While running** (``yields_to``): the server subscribes to its own status topic, and steps down
(stops, exit code 2, without publishing offline over the other's status) when another run's
online status *beats* its own: one that took over this very process, or, neither having taken
over the other, an older one (the newcomer yields, as it would have at start).

A caveat: a broker that replaces client ids with user names (the shipped ``streamfl.conf``,
``use_username_as_clientid``) gives the probe the coordinator account's client id too, so there
the probe does disconnect a live coordinator for a moment (it reconnects at once; the running rule
then makes the newcomer yield). Give a second coordinator of the fleet an account of its own.
"""
import logging
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import Optional

from streamfl.config import bounded
from streamfl.errors import StartupError
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import CoordinatorStatus
from streamfl.protocol.topics import Topics
from streamfl.protocol.transport.base import MqttSettings
from streamfl.protocol.transport.paho import PahoTransport

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExclusiveConfig:
    """One coordinator per fleet (``coordinator/liveness.py``).

    take_over: start even though another coordinator of the fleet is online, which then steps down
      (the ``--take-over`` flag). Off: such a start fails with exit code 2, naming the live one.
    probe_wait_s: how long the start-up probe waits, after connecting, for its echo (which comes
      after the retained status, in milliseconds on a LAN). 2 s: paid in full only where the
      broker's ACL refuses the probe's echo topic.
    connect_wait_s: how long the probe waits for the broker; past it the check is skipped with a
      warning. 10 s, as long as the coordinator waits before telling systemd it is ready.
    """

    take_over: bool = False
    probe_wait_s: float = bounded(2.0, 0.0, 60.0, lo_open=True)
    connect_wait_s: float = bounded(10.0, 0.0, 600.0, lo_open=True)

    def __post_init__(self) -> None:
        if not 0.0 < self.probe_wait_s <= 60.0:
            raise ValueError("exclusive.probe_wait_s must be in (0, 60], got %r" % (self.probe_wait_s,))
        if not 0.0 < self.connect_wait_s <= 600.0:
            raise ValueError("exclusive.connect_wait_s must be in (0, 600], got %r" % (self.connect_wait_s,))


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


class _Probe:
    """A short-lived read-only client on the fleet's coordinator status topic."""

    def __init__(self, settings: MqttSettings, topics: Topics):
        probe_id = "%s-probe-%s" % (settings.client_id, uuid.uuid4().hex[:8])
        self.topics = topics
        self.transport = PahoTransport(replace(settings, client_id=probe_id, persistent_session=False),
                                       close_timeout_s=2.0)
        self.decoder = Decoder({})
        self.status: Optional[CoordinatorStatus] = None
        #: Set once the echo came back: a retained status would have come before it.
        self.answered = threading.Event()
        self.echo_topic = "%s/coordinator/probe/%s" % (topics.prefix, probe_id)
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
        if isinstance(msg, CoordinatorStatus) and self.status is None:
            self.status = msg


def check_fleet(settings: MqttSettings, fleet: str, mine: CoordinatorStatus,
                config: ExclusiveConfig) -> Optional[CoordinatorStatus]:
    """Look for another live coordinator of ``fleet`` before this one (``mine``: its status as it
    will publish it) connects. Returns the status of the one it takes over (None if none);
    ``StartupError`` if one is live and ``config.take_over`` is off."""
    topics = Topics(fleet)
    probe = _Probe(settings, topics)
    try:
        probe.transport.connect()
        if not probe.transport.wait_connected(config.connect_wait_s):
            log.warning("could not reach the broker at %s:%d within %g s to look for another "
                        "coordinator of fleet %s: starting without that check", settings.host,
                        settings.port, config.connect_wait_s, fleet)
            return None
        if not probe.answered.wait(config.probe_wait_s):
            log.debug("the probe's echo did not come back within %g s", config.probe_wait_s)
        other = probe.status
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
