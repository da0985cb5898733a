"""The fleet view's HTTP server: the dashboard page, its JSON API and /metrics, read-only.

A stdlib ``ThreadingHTTPServer`` in a daemon thread of the coordinator process. It reads the fleet
through two callables the coordinator hands it (``snapshot()`` and ``series(since_s)``, each
returning a JSON-able dict) and never writes anything back: GET and HEAD only, everything else is
405. Routes:

- ``/``: the dashboard page; ``/static/<file>``: its script and style, shipped in this package
  (no CDN, nothing fetched from the network);
- ``/api/fleet``: the snapshot (its rows are capped by the fleet table, ``fleet_view.max_rows``);
- ``/api/series?since=T``: the time series points after ``T`` seconds;
- ``/metrics``: the snapshot in Prometheus' text format (``prometheus.py``);
- ``/healthz``: ``ok``.

With a ``token_file`` every route but ``/healthz`` and ``/static/`` (no fleet data there) needs the
token, as ``Authorization: Bearer <token>`` or ``?token=<token>``, compared in constant time;
without it the answer is 401. Requests are bounded: the target's length, a socket timeout per
connection and a cap on the connections served at once (503 beyond it).

``bind()`` takes the address (the coordinator calls it when it is made, before it touches the
broker); ``start()`` serves and writes the URL where it really listens to ``<run_dir>/monitor.url``
(making the run folder if it is new: how tools and tests find a server on port 0) and removes it on
``stop()``.

A port already taken is never silent (it used to be a warning, and a second coordinator ran
without a view while ``streamfl status`` showed the first one's fleet). ``monitor.if_port_taken``
says what happens: ``any_free`` (default) listens on a port the system picks, logs an error naming
the port and the key, writes that URL to ``monitor.url``, and tells every reader of ``/api/fleet``
(``monitor``: the port asked for and the one used; the dashboard and ``streamfl status`` show it);
``exit`` is a ``StartupError`` (exit code 2) naming the port and the key. ``any_free`` is the default
because a coordinator that takes a fleet over from one on the same machine starts while the old one
still holds the port; ``exit`` suits setups whose Prometheus targets or proxies name the port. An
address that cannot be had for another reason (a host that is not this machine's, a port below 1024
without the right) is a ``StartupError`` either way: no other port would help.
"""
import errno
import hmac
import json
import logging
import math
import socket
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple
from urllib.parse import parse_qs, urlsplit

from streamfl.coordinator.monitor.config import MonitorConfig, read_token
from streamfl.errors import ConfigError, StartupError
from streamfl.fileio import atomic_write

log = logging.getLogger(__name__)

#: The file in the run folder that holds the fleet view's URL while it runs.
URL_FILE = "monitor.url"
#: The shipped page and its assets.
STATIC_DIR = Path(__file__).resolve().parent / "static"
#: Content types of the shipped assets, by suffix; a file with another suffix is not served.
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
    ".svg": "image/svg+xml",
}
#: Longest request target (path and query) accepted, in characters; longer ones get 414.
MAX_TARGET_CHARS = 2048
#: Every answer: no sniffing, no framing, no referrer (a token may sit in the page's URL), and
#: the page may load only its own files and talk only to its own server.
SECURITY_HEADERS = (
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; "
                                "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; "
                                "base-uri 'none'; form-action 'none'"),
)

SnapshotFn = Callable[[], Dict[str, Any]]
SeriesFn = Callable[[float], Dict[str, Any]]


def url_for(host: str, port: int) -> str:
    """The URL a local tool uses to reach a server listening on ``host:port`` (a wildcard address
    is reached through the loopback one)."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = "[%s]" % host
    return "http://%s:%d/" % (host, port)


def to_json(data: Any) -> bytes:
    """``data`` as strict JSON (a NaN or infinity, which browsers cannot parse, becomes null)."""
    try:
        text = json.dumps(data, allow_nan=False, separators=(",", ":"))
    except ValueError:
        text = json.dumps(_finite(data), allow_nan=False, separators=(",", ":"))
    return text.encode("utf-8")


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None, nested."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


class _Server(ThreadingHTTPServer):
    """A ``ThreadingHTTPServer`` that serves at most ``max_connections`` requests at once and
    answers 503 to the rest without starting a thread for them."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, address: Tuple[str, int], handler: type, monitor: "MonitorServer"):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.monitor = monitor
        self._slots = threading.BoundedSemaphore(monitor.config.max_connections)
        super().__init__(address, handler)

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            try:
                request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
                                b"Content-Length: 20\r\nRetry-After: 1\r\n\r\ntoo many connections")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _Handler(BaseHTTPRequestHandler):
    """One request: the route, the token, the answer; read-only."""

    server: _Server
    server_version = "streamfl-monitor"
    sys_version = ""
    protocol_version = "HTTP/1.0"

    def setup(self) -> None:
        self.timeout = self.server.monitor.config.request_timeout_s
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
        log.debug("%s %s", self.address_string(), format % args)

    # ---- methods ------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._serve(head=False)

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def _not_allowed(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, b"read-only: GET and HEAD only\n", "text/plain",
                   head=False, extra=(("Allow", "GET, HEAD"),))

    def __getattr__(self, name: str) -> Any:
        # Every method but GET and HEAD (POST, PUT, DELETE, and names no standard knows) is 405,
        # where the stdlib would answer 501 to a method without a do_ handler.
        if name.startswith("do_"):
            return self._not_allowed
        raise AttributeError(name)

    # ---- routing ------------------------------------------------------------------------------

    def _serve(self, head: bool) -> None:
        monitor = self.server.monitor
        if len(self.path) > MAX_TARGET_CHARS:
            self._text(HTTPStatus.REQUEST_URI_TOO_LONG, "request target longer than %d characters"
                       % MAX_TARGET_CHARS, head)
            return
        target = urlsplit(self.path)
        path = target.path
        try:
            query = parse_qs(target.query, keep_blank_values=True, max_num_fields=16)
        except ValueError:
            self._text(HTTPStatus.BAD_REQUEST, "too many query fields", head)
            return
        if path == "/healthz":
            self._text(HTTPStatus.OK, "ok", head)
            return
        if path.startswith("/static/"):
            self._static(path[len("/static/"):], head)
            return
        if not self._authorized(query):
            self._send(HTTPStatus.UNAUTHORIZED,
                       b"401: this fleet view needs its token: 'Authorization: Bearer <token>' or "
                       b"?token=<token>\n", "text/plain", head,
                       extra=(("WWW-Authenticate", 'Bearer realm="streamfl"'),))
            return
        try:
            if path in ("/", "/index.html"):
                self._static("index.html", head)
            elif path == "/api/fleet":
                self._json(dict(monitor.snapshot(), monitor=monitor.describe()), head)
            elif path == "/api/series":
                since = _since(query)
                if since is None:
                    self._json_error(HTTPStatus.BAD_REQUEST, "since must be a finite number of "
                                     "seconds, e.g. /api/series?since=12.5", head)
                    return
                self._json(monitor.series(since), head)
            elif path == "/metrics":
                self._metrics(head)
            else:
                self._text(HTTPStatus.NOT_FOUND, "no such page: / (dashboard), /api/fleet, "
                           "/api/series?since=T, /metrics, /healthz", head)
        except Exception:  # the coordinator's callables must not take the server down
            log.exception("monitor: %s failed", path)
            self._text(HTTPStatus.INTERNAL_SERVER_ERROR, "the fleet view failed to answer; the "
                       "coordinator's log says why", head)

    def _authorized(self, query: Dict[str, Any]) -> bool:
        token = self.server.monitor.token
        if token is None:
            return True
        given = None
        header = self.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            given = value.strip()
        elif query.get("token"):
            given = query["token"][0]
        if given is None:
            return False
        return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode("utf-8"))

    # ---- answers ------------------------------------------------------------------------------

    def _static(self, name: str, head: bool) -> None:
        body = self.server.monitor.asset(name)
        if body is None:
            self._text(HTTPStatus.NOT_FOUND, "no such file", head)
            return
        self._send(HTTPStatus.OK, body, CONTENT_TYPES[Path(name).suffix], head,
                   extra=(("Cache-Control", "no-cache"),))

    def _metrics(self, head: bool) -> None:
        monitor = self.server.monitor
        if not monitor.config.prometheus:
            self._text(HTTPStatus.NOT_FOUND, "/metrics is off (monitor.prometheus: false)", head)
            return
        if monitor.exporter is None:
            self._text(HTTPStatus.NOT_IMPLEMENTED, "/metrics needs the prometheus-client package "
                       "(pip install 'streamfl[server]'): %s" % monitor.exporter_missing, head)
            return
        from streamfl.coordinator.monitor.prometheus import CONTENT_TYPE
        self._send(HTTPStatus.OK, monitor.exporter.render(), CONTENT_TYPE, head)

    def _json(self, data: Any, head: bool) -> None:
        self._send(HTTPStatus.OK, to_json(data), "application/json", head)

    def _json_error(self, status: HTTPStatus, message: str, head: bool) -> None:
        self._send(status, to_json({"error": message}), "application/json", head)

    def _text(self, status: HTTPStatus, message: str, head: bool) -> None:
        self._send(status, (message + "\n").encode("utf-8"), "text/plain; charset=utf-8", head)

    def _send(self, status: HTTPStatus, body: bytes, content_type: str, head: bool,
              extra: Tuple[Tuple[str, str], ...] = ()) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if not any(name == "Cache-Control" for name, _ in extra):
            self.send_header("Cache-Control", "no-store")
        for name, value in SECURITY_HEADERS + tuple(extra):
            self.send_header(name, value)
        self.end_headers()
        if not head:
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass


def _since(query: Dict[str, Any]) -> Optional[float]:
    """The ``since`` of an /api/series query (0 when absent); None when it is not a finite number."""
    values = query.get("since")
    if not values or values[0] == "":
        return 0.0
    try:
        since = float(values[0])
    except ValueError:
        return None
    return since if math.isfinite(since) else None


class MonitorServer:
    """The fleet view of one coordinator: ``start()`` it, read ``url``, ``stop()`` it.

    ``snapshot`` and ``series`` are called from the server's request threads, so they must be safe
    to call from any thread (the coordinator's fleet table hands out immutable snapshots).
    ``run_dir`` gets the ``monitor.url`` file (None: no file).
    """

    def __init__(self, config: MonitorConfig, snapshot: SnapshotFn, series: SeriesFn,
                 run_dir: Optional[Path] = None):
        self.config = config
        self.snapshot = snapshot
        self.series = series
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.token: Optional[str] = None
        self.url: Optional[str] = None
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None
        self._assets: Dict[str, bytes] = {}
        #: The /metrics registry (None: prometheus-client is missing, ``exporter_missing`` says
        #: why, or monitor.prometheus is off).
        self.exporter: Any = None
        self.exporter_missing = ""
        #: The configured port when it was taken and the view listens elsewhere (else None).
        self.port_taken: Optional[int] = None
        self._bound: Optional[Tuple[str, int]] = None

    @property
    def url_file(self) -> Optional[Path]:
        return self.run_dir / URL_FILE if self.run_dir is not None else None

    def describe(self) -> Dict[str, Any]:
        """Where the view listens, for the readers of /api/fleet: ``url``, the ``port`` asked for,
        and ``port_taken`` (true when that port was taken and ``url`` is elsewhere)."""
        asked = self.port_taken if self.port_taken is not None else self.config.port
        return {"url": self.url, "port": asked, "port_taken": self.port_taken is not None}

    def bind(self) -> Optional[str]:
        """Take the address now (not serving yet); the URL it will serve on. A taken port is what
        ``monitor.if_port_taken`` says (module docstring); another address error is a
        ``StartupError`` (exit code 2) naming ``monitor.host`` and ``monitor.port``."""
        if self._server is not None:
            return self.url
        host, port = self.config.host, self.config.port
        try:
            server = self._listen(port)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or port == 0:
                raise StartupError("the fleet view cannot listen on %s:%d (%s): set monitor.host and "
                                   "monitor.port to an address of this machine, or monitor.enabled: false"
                                   % (host, port, exc.strerror or exc)) from None
            if self.config.if_port_taken == "exit":
                raise StartupError("the fleet view's port %s:%d is taken (monitor.port; is another "
                                   "coordinator running on this machine?): set monitor.port to a free "
                                   "port (0: any), or monitor.if_port_taken: any_free" % (host, port)) from None
            try:
                server = self._listen(0)
            except OSError as again:
                raise StartupError("the fleet view's port %s:%d is taken (monitor.port) and no other "
                                   "port could be had (%s)" % (host, port, again.strerror or again)) from None
            self.port_taken = port
        self._server = server
        self.url = url_for(host, server.server_address[1])
        if self.port_taken is not None:
            log.error("monitor: port %d (monitor.port) is taken, maybe by another coordinator: this one's "
                      "fleet view listens on %s instead (in %s; monitor.if_port_taken: exit refuses to "
                      "start instead)", port, self.url, self.url_file or "the log only")
        return self.url

    def _listen(self, port: int) -> "_Server":
        return _Server((self.config.host, port), _Handler, self)

    def asset(self, name: str) -> Optional[bytes]:
        """A shipped file by its bare name (no folders, so no way out of ``static/``), or None."""
        return self._assets.get(name)

    def start(self) -> Optional[str]:
        """Serve in a daemon thread (``bind`` first if that was not done); the URL, or None (logged)
        when the token file cannot be read (the configuration checked it when it loaded; no token
        is never the fallback for a lost one: then there is no fleet view at all).
        ``StartupError`` from ``bind``."""
        if self._thread is not None:
            return self.url
        if self.config.token_file is not None:
            try:
                self.token = read_token(self.config.token_file)
            except ConfigError as exc:
                log.error("monitor: %s: the coordinator runs without its fleet view", exc)
                self._close_unserved()
                return None
        self._assets = {p.name: p.read_bytes() for p in sorted(STATIC_DIR.iterdir())
                        if p.is_file() and p.suffix in CONTENT_TYPES}
        if "index.html" not in self._assets:
            raise FileNotFoundError("the dashboard page is missing from %s" % STATIC_DIR)
        if self.config.prometheus:
            try:
                from streamfl.coordinator.monitor.prometheus import Exporter
            except ImportError as exc:
                self.exporter_missing = str(exc)
                log.warning("monitor: /metrics answers 501: prometheus-client is not installed (%s)", exc)
            else:
                self.exporter = Exporter(self.snapshot, self.config.max_device_labels)
        self.bind()
        server = self._server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="streamfl-monitor", daemon=True)
        self._thread.start()
        if self.url_file is not None:
            try:  # a run folder the coordinator has not written to yet does not exist yet
                self.url_file.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(self.url_file, (self.url + "\n").encode("ascii"))
            except OSError as exc:
                log.error("monitor: cannot write %s (%s): tools that read the run folder will not "
                          "find the fleet view at %s", self.url_file, exc, self.url)
        log.info("fleet view at %s%s", self.url, " (token required)" if self.token else "")
        return self.url

    def _close_unserved(self) -> None:
        """Close a socket ``bind`` took that will never be served."""
        server, self._server = self._server, None
        if server is not None and self._thread is None:
            server.server_close()

    def stop(self) -> None:
        """Stop serving, close the socket and remove ``monitor.url`` if it is still ours."""
        server, self._server = self._server, None
        if server is None:
            return
        if self._thread is None:  # bound, never served
            server.server_close()
            return
        server.shutdown()
        server.server_close()
        self._thread.join(5.0)
        self._thread = None
        url_file = self.url_file
        if url_file is not None:
            try:
                if url_file.read_text().strip() == self.url:
                    url_file.unlink()
            except OSError:
                pass
