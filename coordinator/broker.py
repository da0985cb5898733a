"""An embedded MQTT broker (amqtt) for ``streamfl-coordinator --embedded-broker`` and hosts without mosquitto.

amqtt runs on its own asyncio loop in a background thread, with one TCP listener and anonymous
clients allowed. Limits to know: amqtt keeps everything in memory, so retained messages and sessions
do not survive a restart; and it treats anonymous clients' sessions as clean, so QoS 1 messages are
not queued for a persistent session while its client is away. Use mosquitto for a real fleet.

A port it cannot listen on (another broker holds it, or no permission) is a ``StartupError``
(exit code 2 in the CLIs), found by binding the address before amqtt starts: amqtt would log a
traceback, and the coordinator must not go on talking to whatever holds the port.
"""
import argparse
import asyncio
import logging
import signal
import socket
import sys
import threading
from typing import Any, List, Optional

from streamfl.errors import StartupError, StreamflError, TransportError

log = logging.getLogger(__name__)


def check_port_free(host: str, port: int) -> None:
    """``StartupError`` if ``host:port`` cannot be bound for listening (as asyncio binds it: every
    address the name resolves to, with SO_REUSEADDR)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartupError("the embedded broker cannot listen on %s:%d: %s" % (host, port, exc)) from None
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == getattr(socket, "AF_INET6", None) and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(1)
        except OSError as exc:
            raise StartupError(
                "the embedded broker cannot listen on %s:%d (%s): %s; another broker or program "
                "holds the port: stop it, choose another --port, or leave out --embedded-broker to "
                "use the broker there" % (host, port, address[0], exc.strerror or exc)) from None
        finally:
            sock.close()


class _StartupFailed(logging.Filter):
    """Drops amqtt's own traceback of a failed start: ``start`` raises the error in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "Broker startup failed"


class EmbeddedBroker:
    """An amqtt broker on ``host:port`` in a daemon thread; ``start``/``stop`` or a ``with`` block."""

    def __init__(self, host: str = "127.0.0.1", port: int = 1883, start_timeout_s: float = 15.0):
        self.host = host
        self.port = port
        self.start_timeout_s = start_timeout_s
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._broker: Any = None
        self._thread: Optional[threading.Thread] = None
        self._ready = threading.Event()
        self._error: Optional[BaseException] = None

    def config(self) -> dict:
        """amqtt 0.12 broker configuration: one TCP listener, anonymous allowed, no $SYS or packet logs."""
        return {
            "listeners": {"default": {"type": "tcp", "bind": "%s:%d" % (self.host, self.port)}},
            "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
        }

    def start(self) -> "EmbeddedBroker":
        """Start the broker and wait until it listens; ``StartupError`` if the port is taken,
        ``TransportError`` if it cannot start otherwise."""
        if self.running:
            return self
        try:
            import amqtt.broker  # noqa: F401  (optional dependency: streamfl[server])
        except ImportError as exc:
            raise TransportError("the embedded broker needs amqtt (pip install 'streamfl[server]')") from exc
        check_port_free(self.host, self.port)
        self._ready.clear()
        self._error = None
        self._thread = threading.Thread(target=self._run, name="amqtt-broker", daemon=True)
        self._thread.start()
        if not self._ready.wait(self.start_timeout_s):
            self.stop()
            raise TransportError("embedded broker did not start on %s:%d within %.0f s" % (
                self.host, self.port, self.start_timeout_s))
        if self._error is not None:  # taken between the check and amqtt's bind, or another failure
            error, self._error = self._error, None
            self._thread.join(5.0)
            self._thread = None
            raise StartupError("the embedded broker cannot listen on %s:%d: %s" % (
                self.host, self.port, error)) from None
        log.info("embedded amqtt broker listening on %s:%d", self.host, self.port)
        return self

    def _run(self) -> None:
        from amqtt.broker import Broker

        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        quiet = _StartupFailed()
        amqtt_log = logging.getLogger("amqtt.broker")
        amqtt_log.addFilter(quiet)
        try:
            self._broker = Broker(self.config(), loop=loop)
            loop.run_until_complete(self._broker.start())
        except BaseException as exc:  # amqtt wraps OSError (port in use) in BrokerError
            amqtt_log.removeFilter(quiet)
            self._error = exc
            self._broker = None
            self._loop = None
            loop.close()
            self._ready.set()
            return
        amqtt_log.removeFilter(quiet)
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Shut the broker down (clients see the connection close) and join its thread."""
        loop, broker, thread = self._loop, self._broker, self._thread
        self._loop = self._broker = self._thread = None
        if loop is not None and broker is not None and loop.is_running():
            future = asyncio.run_coroutine_threadsafe(broker.shutdown(), loop)
            try:
                future.result(timeout_s)
            except Exception as exc:  # a failing shutdown must not block the caller's exit
                log.warning("embedded broker shutdown: %s", exc)
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout_s)
        if broker is not None:
            log.info("embedded amqtt broker on %s:%d stopped", self.host, self.port)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._broker is not None

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def main(argv: Optional[List[str]] = None) -> int:
    """Run an embedded broker in the foreground until SIGTERM or Ctrl-C (used by ``sim.brokers``)."""
    parser = argparse.ArgumentParser(prog="python -m streamfl.coordinator.broker",
                                     description="Run an embedded amqtt MQTT broker.")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=1883, help="TCP port (default 1883)")
    parser.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("streamfl").setLevel(logging.INFO)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        broker = EmbeddedBroker(args.host, args.port).start()
    except StreamflError as exc:
        log.error("%s", exc)
        return getattr(exc, "exit_code", 1)
    try:
        while not stop.wait(1.0):
            if not broker.running:
                log.error("embedded broker thread died")
                return 1
    finally:
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
