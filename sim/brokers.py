"""Start a real MQTT broker for the demo and the tests: mosquitto when installed, else embedded amqtt.

The broker runs as a child process on a free loopback port, with persistence in its own directory
so a restart keeps retained messages and persistent sessions, exactly like a broker on a server.
"""
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

from streamfl.errors import TransportError

log = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def wait_port(host: str, port: int, timeout_s: float) -> bool:
    """True once something accepts TCP connections on ``host:port``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


class BrokerProcess:
    """A broker child process that can be stopped and restarted on the same port and data."""

    def __init__(self, workdir: Path, port: Optional[int] = None, host: str = "127.0.0.1",
                 kind: Optional[str] = None, extra_config: str = ""):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.host = host
        self.port = port or free_port(host)
        if kind is None:
            kind = "mosquitto" if shutil.which("mosquitto") else "amqtt"
        if kind not in ("mosquitto", "amqtt"):
            raise ValueError("broker kind must be mosquitto or amqtt, got %r" % kind)
        self.kind = kind
        #: Lines appended to mosquitto's config (a bridge, an acl_file); amqtt cannot take them.
        if extra_config and kind != "mosquitto":
            raise ValueError("extra_config needs the mosquitto broker, not %s" % kind)
        self.extra_config = extra_config
        self._proc: Optional[subprocess.Popen] = None
        self._log = None

    def _command(self) -> List[str]:
        if self.kind == "mosquitto":
            conf = self.workdir / "mosquitto.conf"
            conf.write_text(
                "listener %d %s\nallow_anonymous true\npersistence true\n"
                "persistence_location %s/\nautosave_interval 1\nmax_queued_messages 10000\n"
                "log_type error\nlog_type warning\nlog_type notice\n"
                % (self.port, self.host, self.workdir))
            if hasattr(os, "geteuid") and os.geteuid() == 0:
                # Started as root, mosquitto drops to user "mosquitto", which cannot write its
                # persistence file here: retained messages and sessions would not survive restart().
                with open(conf, "a") as fh:
                    fh.write("user root\n")
            if self.extra_config:
                with open(conf, "a") as fh:
                    fh.write(self.extra_config.rstrip("\n") + "\n")
            return [shutil.which("mosquitto") or "mosquitto", "-c", str(conf)]
        return [sys.executable, "-m", "streamfl.coordinator.broker", "--host", self.host,
                "--port", str(self.port)]

    def start(self, timeout_s: float = 15.0) -> "BrokerProcess":
        """Start the broker and wait until it accepts connections."""
        if self.running:
            return self
        self._log = open(self.workdir / "broker.log", "ab")
        self._proc = subprocess.Popen(self._command(), stdout=self._log, stderr=subprocess.STDOUT,
                                      cwd=str(self.workdir))
        if not wait_port(self.host, self.port, timeout_s):
            self.stop()
            raise TransportError("%s broker did not start on %s:%d (see %s)" % (
                self.kind, self.host, self.port, self.workdir / "broker.log"))
        log.info("%s broker listening on %s:%d", self.kind, self.host, self.port)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the broker (SIGTERM, then SIGKILL); mosquitto saves its persistence file on exit."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout_s)
        if self._log is not None:
            self._log.close()
            self._log = None

    def restart(self, down_s: float = 0.0) -> None:
        """Stop, stay down ``down_s`` seconds, and start again on the same port."""
        self.stop()
        time.sleep(down_s)
        self.start()

    def pause(self) -> None:
        """Freeze the broker (SIGSTOP): connections stay open but nothing is answered, like a hung
        server; ``resume`` thaws it."""
        if self.running:
            os.kill(self._proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.running:
            os.kill(self._proc.pid, signal.SIGCONT)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> "BrokerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
