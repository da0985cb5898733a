"""An operator's command to the coordinator: one ``Command`` on ``streamfl/v1/{fleet}/coordinator/command``.

The coordinator hands it to its plug-ins' ``on_operator`` (e.g. the ``sessions`` plug-in's
``new-session``). It is sent with QoS 1 and this returns once the broker acknowledged it (PUBACK),
so the command is with the broker, which delivers it to the coordinator's persistent session even
if the coordinator is away for a moment. The shipped ACL lets only the ``operator`` (and
``coordinator``) account write that topic. ``streamfl operator KIND`` is the command line.

Every command is stamped: its ``seq`` is this machine's wall clock in microseconds, and the
coordinator obeys only a stamp newer than the last one it obeyed and within its freshness window
(``operator.max_age_s``), so a captured command cannot be replayed. With ``signing_key_file`` (an
Ed25519 key of ``streamfl-coordinator keygen --name operator``, whose ``.pub`` line the
coordinator pins in ``operator.public_keys``) the frame, stamp included, is signed for the topic;
a coordinator that pins operator keys drops anything else.
"""
import logging
import time
from typing import Any, Dict, Optional

from streamfl.errors import TransportError
from streamfl.protocol.codec import encode
from streamfl.protocol.messages import Command
from streamfl.protocol.signing import make_signer
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
                          timeout_s: float, signing_key_file: Optional[str] = None) -> None:
    """Publish ``Command(kind, params)``, stamped and (with ``signing_key_file``) signed, to the
    coordinator of ``fleet`` and wait for the broker's acknowledgement; ``TransportError`` if it
    did not come within ``timeout_s`` (no broker, or a refused login). ``ConfigError`` for a bad
    fleet name, key or settings. Under MQTT 3.1.1 a broker acknowledges a publish its ACL refused
    too: the account must be allowed to write the topic."""
    topic = Topics(fleet).coordinator_command
    frame = operator_payload(fleet, kind, params, signing_key_file)
    transport = PahoTransport(settings, close_timeout_s=min(5.0, max(0.0, timeout_s)))
    deadline = time.monotonic() + timeout_s
    try:
        transport.connect()
        while not transport.connected:
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
    finally:
        transport.close()
    log.info("sent the %s command to the coordinator of fleet %s", kind, fleet)
