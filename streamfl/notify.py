"""systemd's sd_notify protocol without a dependency: readiness, status, watchdog pings, stopping.

Under ``Type=notify`` systemd passes a datagram socket path in ``$NOTIFY_SOCKET`` (a leading ``@``
means the Linux abstract namespace) and, with ``WatchdogSec=``, the deadline in ``$WATCHDOG_USEC``.
The CLI reads the environment and passes it in; without a socket every call is a no-op.
"""
import logging
import os
import socket
from typing import Mapping, Optional

log = logging.getLogger(__name__)


class SystemdNotifier:
    """Sends sd_notify datagrams to ``socket_path``; silent no-op when it is None."""

    def __init__(self, socket_path: Optional[str] = None, watchdog_usec: Optional[int] = None,
                 watchdog_pid: Optional[int] = None):
        self.socket_path = socket_path or None
        self.watchdog_usec = int(watchdog_usec) if watchdog_usec else None
        # systemd sets WATCHDOG_PID when the watchdog is meant for one process of several.
        if watchdog_pid is not None and int(watchdog_pid) != os.getpid():
            self.watchdog_usec = None
        self.sent = 0
        self.errors = 0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> "SystemdNotifier":
        """A notifier configured from ``NOTIFY_SOCKET``, ``WATCHDOG_USEC`` and ``WATCHDOG_PID``."""
        def as_int(name: str) -> Optional[int]:
            raw = environ.get(name)
            try:
                return int(raw) if raw else None
            except ValueError:
                log.warning("ignoring non-numeric %s=%r", name, raw)
                return None
        return cls(environ.get("NOTIFY_SOCKET"), as_int("WATCHDOG_USEC"), as_int("WATCHDOG_PID"))

    @property
    def enabled(self) -> bool:
        """True when running under a supervisor that listens for notifications."""
        return self.socket_path is not None

    @property
    def watchdog_interval_s(self) -> Optional[float]:
        """How often to ping: half the watchdog deadline (sd_watchdog_enabled(3)); None if off."""
        if not self.enabled or not self.watchdog_usec:
            return None
        return self.watchdog_usec / 2e6

    def notify(self, state: str) -> bool:
        """Send one notification such as ``READY=1``; False if disabled or the send failed."""
        if self.socket_path is None:
            return False
        address = self.socket_path
        if address.startswith("@"):
            address = "\0" + address[1:]
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.connect(address)
                sock.sendall(state.encode("utf-8"))
        except OSError as exc:
            self.errors += 1
            if self.errors == 1:
                log.warning("sd_notify to %s failed: %s", self.socket_path, exc)
            return False
        self.sent += 1
        return True

    def ready(self, status: str = "") -> bool:
        """Tell systemd the service is up (``Type=notify`` waits for this)."""
        return self.notify("READY=1\nSTATUS=%s" % status if status else "READY=1")

    def status(self, text: str) -> bool:
        """Free-form status line shown by ``systemctl status``."""
        return self.notify("STATUS=%s" % text.replace("\n", " "))

    def watchdog(self) -> bool:
        """Ping the watchdog; systemd restarts the service if pings stop for WATCHDOG_USEC."""
        if self.watchdog_usec is None:
            return False
        return self.notify("WATCHDOG=1")

    def stopping(self) -> bool:
        """Tell systemd a clean shutdown has begun."""
        return self.notify("STOPPING=1")
