"""The small exception tree every streamfl boundary translates foreign errors into."""


class StreamflError(Exception):
    """Base of every error streamfl raises on purpose."""


class ConfigError(StreamflError):
    """A configuration file, key, value or flag is wrong; CLIs exit with code 2 so systemd stops."""

    exit_code = 2


class StartupError(StreamflError):
    """This process must not start as it is: another coordinator of its fleet is live, or the port
    it should listen on is taken; CLIs exit with code 2 so systemd does not restart into it."""

    exit_code = 2


class ProtocolError(StreamflError):
    """A frame could not be decoded or failed validation; ``reason`` is a short counter key."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__("%s: %s" % (reason, detail) if detail else reason)
        self.reason = reason
        self.detail = detail


class ModelError(StreamflError):
    """A model architecture is unknown or tensors do not fit it."""


class SensorError(StreamflError):
    """A sensor source is missing, unreadable or produced unusable samples."""


class TransportError(StreamflError):
    """The MQTT transport could not connect, publish or subscribe."""


class StorageError(StreamflError):
    """A state directory, checkpoint or outbox could not be read or written (full disk, permissions)."""


class StateFileError(StorageError):
    """A file of a state folder is corrupt or cannot be read: starting on it would lose or fork what
    it holds, and a restart finds it the same, so CLIs exit with code 2 naming the file."""

    exit_code = 2
