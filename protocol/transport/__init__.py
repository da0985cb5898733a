"""Transports: the publish/subscribe interface, the in-memory broker, and paho-mqtt (imported lazily).

``PahoTransport`` is loaded on first use so that the simulator and the tests of the cores run
without importing paho.
"""
from typing import Any

from streamfl.protocol.transport.base import MqttSettings, Transport
from streamfl.protocol.transport.config import MqttConfig
from streamfl.protocol.transport.credentials import read_password
from streamfl.protocol.transport.memory import MemoryBroker, MemoryTransport, topic_matches

__all__ = ["MqttConfig", "MqttSettings", "Transport", "MemoryBroker", "MemoryTransport", "PahoTransport",
           "read_password", "topic_matches"]


def __getattr__(name: str) -> Any:
    if name == "PahoTransport":
        from streamfl.protocol.transport.paho import PahoTransport
        return PahoTransport
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
