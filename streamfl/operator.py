"""An operator's command to the coordinator: one ``Command`` on ``streamfl/v1/{fleet}/coordinator/command``.

The coordinator answers its own kinds (``status``: the live fleet table) and hands the others to
its plug-ins' ``on_operator_command`` (e.g. the ``sessions`` plug-in's ``new-session``). It is sent
with QoS 1 once this client subscribed to the reply topic (``coordinator/reply``); the coordinator
answers every command it obeyed with a ``CommandReply`` carrying the command's stamp, an error for
a kind nothing handles. No answer within the timeout is an error too: the coordinator is not
running, or refused the command (a stale stamp, a missing or wrong signature: its log says which). The shipped ACL lets only the ``operator`` (and
``coordinator``) account write that topic. ``streamfl operator KIND`` is the command line.

Every command is stamped: its ``seq`` is this machine's wall clock in microseconds, and the
coordinator obeys only a stamp newer than the last one it obeyed and within its freshness window
(``operator.max_age_s``), so a captured command cannot be replayed. With ``signing_key_file`` (an
Ed25519 key of ``streamfl-coordinator keygen --name operator``, whose ``.pub`` line the
coordinator pins in ``operator.public_keys``) the frame, stamp included, is signed for the topic;
a coordinator that pins operator keys drops anything else.
"""
import logging
import queue
import time
from typing import Any, Dict, Optional

from streamfl.errors import ProtocolError, TransportError
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import Command, CommandReply
from streamfl.protocol.signing import make_signer, make_verifier
from streamfl.protocol.topics import Topics
from streamfl.protocol.transport.base import MqttSettings
from streamfl.protocol.transport.paho import PahoTransport

log = logging.getLogger(__name__)

#: How often the connection and the acknowledgement are checked.
POLL_S = 0.02


def stamp_now() -> int:
    """A command's stamp: the wall clock in microseconds (``Command.seq``)."""
    return int(time.time() * 1e6)


def operator_payload(fleet: str, kind: str, params: Dict[str, Any],
                     signing_key_file: Optional[str] = None, seq: Optional[int] = None) -> bytes:
    """The payload of one operator command for ``fleet``: stamped (``seq``, default now) and, with
    ``signing_key_file``, signed for the fleet's coordinator command topic. ``ConfigError`` for a
    bad fleet name or an unreadable key."""
    topic = Topics(fleet).coordinator_command
    frame = encode(Command(kind=kind, params=dict(params), seq=stamp_now() if seq is None else seq))
    return make_signer(signing_key_file).sign(topic, frame)


def send_operator_command(settings: MqttSettings, fleet: str, kind: str, params: Dict[str, Any],
                          timeout_s: float, signing_key_file: Optional[str] = None,
                          coordinator_public_key: Optional[str] = None) -> CommandReply:
    """Publish ``Command(kind, params)``, stamped and (with ``signing_key_file``) signed, to the
    coordinator of ``fleet``, and return its ``CommandReply`` (``ok`` False: nothing handles the
    kind). ``TransportError`` if the broker or the answer did not come within ``timeout_s`` (no
    broker, a refused login, no coordinator, or a command it refused). With
    ``coordinator_public_key`` only an answer signed by that coordinator counts. ``ConfigError``
    for a bad fleet name, key or settings. Under MQTT 3.1.1 a broker acknowledges a publish its
    ACL refused too: the account must be allowed to write the command topic and read the reply
    topic."""
    topics = Topics(fleet)
    topic = topics.coordinator_command
    seq = stamp_now()
    frame = operator_payload(fleet, kind, params, signing_key_file, seq=seq)
    verifier = make_verifier(coordinator_public_key)
    decoder = Decoder({})
    replies: "queue.Queue[CommandReply]" = queue.Queue()

    def on_message(reply_topic: str, payload: bytes) -> None:
        """Keep the answer to this command (network thread); anything else is not ours."""
        try:
            msg = decoder.decode(verifier.open(reply_topic, payload))
        except ProtocolError as exc:
            log.warning("ignoring a reply on %s: %s", reply_topic, exc)
            return
        if isinstance(msg, CommandReply) and msg.seq == seq:
            replies.put(msg)

    transport = PahoTransport(settings, close_timeout_s=min(5.0, max(0.0, timeout_s)))
    transport.on_message = on_message
    transport.subscribe(topics.coordinator_reply, qos=1)
    deadline = time.monotonic() + timeout_s
    try:
        transport.connect()
        while not (transport.connected and transport.subscribed):
            if time.monotonic() >= deadline:
                raise TransportError("could not connect to the broker at %s:%d within %g s"
                                     % (settings.host, settings.port, timeout_s))
            time.sleep(POLL_S)
        acked = transport.publish_tracked(topic, frame, qos=1)
        if acked is None:  # paho may still send it after a reconnect: sending again could repeat it
            raise TransportError("the connection to %s:%d dropped as the %s command was sent: it "
                                 "may or may not arrive" % (settings.host, settings.port, kind))
        while not acked():
            if time.monotonic() >= deadline:
                raise TransportError("the broker at %s:%d did not acknowledge the %s command within "
                                     "%g s" % (settings.host, settings.port, kind, timeout_s))
            time.sleep(POLL_S)
        log.info("sent the %s command to the coordinator of fleet %s", kind, fleet)
        try:
            return replies.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TransportError(
                "no answer to the %s command from the coordinator of fleet %s within %g s: it is not "
                "running, or it refused the command (its log says why: a stale stamp, or a missing "
                "or wrong signature)" % (kind, fleet, timeout_s)) from None
    finally:
        transport.close()
