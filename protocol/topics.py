"""MQTT topic names of one fleet, with the fleet and device names validated.

Names are restricted to ``[A-Za-z0-9_.-]{1,64}`` so that no wildcard (``+``, ``#``) or level
separator (``/``) can sneak into a topic, and the shipped broker ACL (``configs/mosquitto/acl``, ``%u`` = device id) works.
"""
import re
from typing import Optional, Tuple

from streamfl.errors import ConfigError

NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
ROOT = "streamfl/v1"

#: The per-device topic kinds, last level of ``streamfl/v1/{fleet}/device/{device}/{kind}``.
#: ``prediction`` carries JSON for apps and dashboards (docs/predictions.md), not frames: the
#: coordinator never subscribes to it. ``reply`` carries a board's answers to the fleet-control
#: commands the coordinator sent it (``DeviceReply``, docs/deployment.md "Fleet control").
DEVICE_KINDS = ("status", "update", "command", "telemetry", "sensor", "prediction", "reply")


def validate_name(name: str, what: str = "name") -> str:
    """Return ``name`` if it is a valid fleet or device name, else raise ``ConfigError``."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ConfigError("invalid %s %r: use 1-64 characters from A-Z a-z 0-9 _ . -" % (what, name))
    return name


def sanitize_name(raw: str) -> str:
    """Turn e.g. a hostname into a valid device name (invalid characters become ``-``)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "-", raw or "")[:64].strip("-")
    return cleaned or "device"


class Topics:
    """Topic names for one fleet."""

    def __init__(self, fleet: str):
        self.fleet = validate_name(fleet, "fleet")
        self.prefix = "%s/%s" % (ROOT, self.fleet)

    @property
    def model(self) -> str:
        return self.prefix + "/model"

    @property
    def coordinator_status(self) -> str:
        return self.prefix + "/coordinator/status"

    @property
    def coordinator_command(self) -> str:
        """An operator's commands to the coordinator (e.g. ``new-session``)."""
        return self.prefix + "/coordinator/command"

    @property
    def coordinator_reply(self) -> str:
        """The coordinator's answers to operator commands (``CommandReply``), matched by stamp."""
        return self.prefix + "/coordinator/reply"

    def device(self, device_id: str, kind: str) -> str:
        """``streamfl/v1/{fleet}/device/{device}/{kind}``."""
        if kind not in DEVICE_KINDS:
            raise ValueError("unknown device topic kind %r" % kind)
        return "%s/device/%s/%s" % (self.prefix, validate_name(device_id, "device id"), kind)

    def all_devices(self, kind: str) -> str:
        """Subscription filter for one kind of topic of every device of the fleet."""
        if kind not in DEVICE_KINDS:
            raise ValueError("unknown device topic kind %r" % kind)
        return "%s/device/+/%s" % (self.prefix, kind)

    def parse_device_topic(self, topic: str) -> Optional[Tuple[str, str]]:
        """``(device_id, kind)`` for a per-device topic of this fleet, else ``None``."""
        head = self.prefix + "/device/"
        if not topic.startswith(head):
            return None
        parts = topic[len(head):].split("/")
        if len(parts) != 2 or parts[1] not in DEVICE_KINDS or not NAME_RE.match(parts[0]):
            return None
        return parts[0], parts[1]
