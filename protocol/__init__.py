"""The streamfl protocol: topics, message types, the wire codec and transports (docs/architecture.md)."""
from typing import Any

from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import (
    COMMAND_KINDS, MESSAGE_TYPES, PROTOCOL_VERSION, TYPE_NAMES, Command, CoordinatorStatus, GlobalModel,
    Hello, Message, Offline, Telemetry, Tensors, Update,
)
from streamfl.protocol.topics import Topics, sanitize_name, validate_name
from streamfl.protocol.transport import MemoryBroker, MemoryTransport, MqttSettings, Transport, read_password

__all__ = [
    "Decoder", "encode", "COMMAND_KINDS", "MESSAGE_TYPES", "PROTOCOL_VERSION", "TYPE_NAMES", "Command",
    "CoordinatorStatus", "GlobalModel", "Hello", "Message", "Offline", "Telemetry", "Tensors", "Update",
    "Topics", "sanitize_name", "validate_name", "MemoryBroker", "MemoryTransport", "MqttSettings",
    "Transport", "read_password", "PahoTransport",
]


def __getattr__(name: str) -> Any:
    if name == "PahoTransport":  # lazily: paho is only needed by the daemons
        from streamfl.protocol.transport.paho import PahoTransport
        return PahoTransport
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
