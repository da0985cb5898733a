"""The ``monitor:`` section of the coordinator's configuration: where the fleet view listens, who may
read it and how much of the fleet it names."""
from dataclasses import dataclass
from typing import Optional

from streamfl.config import bounded
from streamfl.errors import ConfigError

#: Longest bearer token accepted from a token file, in characters.
MAX_TOKEN_CHARS = 4096
#: What ``monitor.if_port_taken`` may say.
IF_PORT_TAKEN = ("any_free", "exit")


def read_token(path: str) -> str:
    """The bearer token: the first line of ``path``, stripped. ``ConfigError`` if the file cannot be
    read or its first line is empty or too long."""
    try:
        with open(path, "r", encoding="utf-8") as fh:
            line = fh.readline(MAX_TOKEN_CHARS + 2)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("monitor.token_file %s: cannot read it (%s)" % (path, exc)) from None
    token = line.strip()
    if not token:
        raise ConfigError("monitor.token_file %s: its first line (the token) is empty" % path)
    if len(token) > MAX_TOKEN_CHARS:
        raise ConfigError("monitor.token_file %s: the token is longer than %d characters"
                          % (path, MAX_TOKEN_CHARS))
    return token


@dataclass(frozen=True)
class MonitorConfig:
    """The read-only fleet view the coordinator serves over HTTP (``coordinator/monitor/http.py``).

    It listens on localhost unless ``host`` says otherwise: it answers GET and HEAD only, yet it
    shows every device of the fleet, so reaching it from elsewhere goes through an ssh tunnel or a
    reverse proxy, or at least a ``token_file`` (docs/monitoring.md).
    """

    #: Serve the fleet view (dashboard page, /api/fleet, /api/series, /metrics, /healthz) from the
    #: coordinator process; false: no HTTP server at all.
    enabled: bool = True
    #: Address the fleet view listens on; 127.0.0.1 keeps it on this machine (0.0.0.0 or :: opens
    #: it to every interface: set a token_file then).
    host: str = "127.0.0.1"
    #: TCP port of the fleet view; 0 = any free port. The URL where it really listens is written
    #: to <run_dir>/monitor.url and logged; a port already taken is what if_port_taken says.
    port: int = bounded(8470, 0, 65535)
    #: When ``port`` is taken (another coordinator on this machine, often one being taken over):
    #: ``any_free`` listens on a free port the system picks, logs it as an error naming the port,
    #: writes the real URL to monitor.url and shows the move on the dashboard and in ``streamfl
    #: status``; ``exit`` refuses to start (exit code 2) naming the port, for setups whose
    #: Prometheus targets or proxies name the port (a --take-over on the same machine then needs
    #: another port). ``any_free`` is the default because a coordinator taking over from one on
    #: the same machine must start while the old one still holds the port.
    if_port_taken: str = "any_free"
    #: File whose first line is the bearer token every request must carry (``Authorization: Bearer
    #: <token>`` or ``?token=<token>``); null = no token. /healthz and the page's static files
    #: answer without it (they hold no fleet data).
    token_file: Optional[str] = None
    #: Serve /metrics in Prometheus' text format (needs prometheus-client, part of the server
    #: extra; without it /metrics answers 501 and the rest works).
    prometheus: bool = True
    #: Devices that /metrics labels one by one (online first, then by id); the others count only
    #: in the fleet totals, so that a large fleet cannot blow up a Prometheus server's series.
    max_device_labels: int = bounded(500, 0, 100000)
    #: Requests served at once; more get 503 at once (each holds a thread for up to
    #: request_timeout_s).
    max_connections: int = bounded(32, 1, 1024)
    #: Seconds a connection may take to send its request before it is closed (a slow client holds
    #: a thread no longer than this).
    request_timeout_s: float = bounded(10.0, 0.0, 600.0, lo_open=True)

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host.strip() or any(c.isspace() for c in self.host):
            raise ValueError("monitor.host must be a host name or address, got %r" % (self.host,))
        if self.if_port_taken not in IF_PORT_TAKEN:
            raise ValueError("monitor.if_port_taken must be one of %s, got %r"
                             % (", ".join(IF_PORT_TAKEN), self.if_port_taken))
        if self.token_file is not None:
            # Read now, so that a wrong path is a configuration error at start (exit 2), as the
            # signing key's is; the server reads it again when it starts.
            try:
                read_token(self.token_file)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
