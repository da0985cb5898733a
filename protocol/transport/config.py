"""The ``mqtt:`` section shared by the agent's and the coordinator's YAML files."""
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from streamfl.config import bounded
from streamfl.protocol.transport.base import MqttSettings
from streamfl.protocol.transport.credentials import PASSWORD_ENV, read_password


@dataclass(frozen=True)
class MqttConfig:
    """The ``mqtt:`` section: where the broker is and how to authenticate (no password here)."""

    #: Broker host name or address.
    host: str = "localhost"
    #: Broker TCP port (1883 plain; 8883 is usual with TLS).
    port: int = bounded(1883, 1, 65535)
    #: MQTT keep-alive interval in seconds: the broker declares the client gone (and sends its last
    #: will) after 1.5 times this without traffic.
    keepalive_s: int = bounded(30, 5, 65535)
    #: CA certificate file (PEM); setting it enables TLS. null = plain TCP.
    tls_ca: Optional[Path] = None
    #: Client certificate file (PEM) for mutual TLS; needs tls_key.
    tls_cert: Optional[Path] = None
    #: Private key file (PEM) of tls_cert, for mutual TLS.
    tls_key: Optional[Path] = None
    #: MQTT user name (with the shipped ACL: the agent's device id); null = anonymous.
    username: Optional[str] = None
    #: File whose first line is the MQTT password; null = $STREAMFL_MQTT_PASSWORD, else none. Never
    #: in YAML.
    password_file: Optional[Path] = None
    #: Seconds before the first reconnection attempt after the broker is lost; the wait doubles up
    #: to reconnect_max_s.
    reconnect_min_s: float = bounded(1.0, 0.0, 3600.0, lo_open=True)
    #: Longest wait between reconnection attempts, in seconds.
    reconnect_max_s: float = bounded(60.0, 0.0, 3600.0, lo_open=True)

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("mqtt host must not be empty")
        if not 1 <= self.port <= 65535:
            raise ValueError("mqtt port must be in 1..65535, got %r" % self.port)
        if self.keepalive_s < 5:
            raise ValueError("mqtt keepalive_s must be at least 5, got %r" % self.keepalive_s)
        if not 0 < self.reconnect_min_s <= self.reconnect_max_s:
            raise ValueError("mqtt needs 0 < reconnect_min_s <= reconnect_max_s, got %r and %r" % (
                self.reconnect_min_s, self.reconnect_max_s))
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("mqtt tls_cert and tls_key must be given together")

    def password(self, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
        """The password from ``password_file``, else ``$STREAMFL_MQTT_PASSWORD`` in ``environ``
        (None: the environment is not consulted), else None."""
        return read_password(self.password_file, PASSWORD_ENV, environ if environ is not None else {})

    def settings(self, client_id: str, environ: Optional[Mapping[str, str]] = None) -> MqttSettings:
        """Transport settings for client ``client_id`` (the device id; the shipped ACL keys on the user name, which must equal it)."""
        return MqttSettings(host=self.host, port=self.port, client_id=client_id,
                            keepalive_s=self.keepalive_s, reconnect_min_s=self.reconnect_min_s,
                            reconnect_max_s=self.reconnect_max_s, tls_ca=self.tls_ca,
                            tls_cert=self.tls_cert, tls_key=self.tls_key, username=self.username,
                            password=self.password(environ))
