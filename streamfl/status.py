"""``streamfl status``: the running coordinator's fleet in the terminal, read from its fleet view.

It asks the coordinator's read-only HTTP fleet view (``coordinator/monitor/``) for ``/api/fleet``,
the same snapshot the dashboard shows, and prints a header (fleet, run, method, version, versions
per second, accuracy, devices, updates and why they were rejected) and one line per device, with
as many columns as the terminal is wide (the least needed go first). ``--watch`` redraws it until
Ctrl-C; ``--json`` prints the snapshot as it came. Only the standard library is used, so that it
runs wherever streamfl is installed, a board included.

It says whose fleet it shows: the URL it read, the coordinator's host, process and run folder, and
whether its fleet view had to listen on another port than ``monitor.port``. With ``--run-dir`` the
URL comes from that folder's ``monitor.url``, and a fleet view that belongs to another run folder
(the file outlived its coordinator, and another one listens there now) is an error, not that other
fleet. It says when the coordinator has lost its broker (device states are then unknown, their
last-heard times shown), and tells measured power from modelled.
"""
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from streamfl.errors import ConfigError

HELP = "the running coordinator's fleet: devices, versions, accuracy, updates"
DETAILS = ("Reads the coordinator's fleet view (its monitor: section, http://127.0.0.1:8470 by "
           "default) and prints the fleet and one line per device, fitted to the terminal. Exits 1 "
           "with the reason when the coordinator cannot be reached or refuses the token.")
#: Where the coordinator's fleet view listens unless its monitor: section says otherwise.
DEFAULT_URL = "http://127.0.0.1:8470"
#: The file in a coordinator's run folder that names its fleet view's URL.
URL_FILE = "monitor.url"
#: Longest answer read from the fleet view, in bytes (a snapshot of thousands of rows is a few MB).
MAX_ANSWER_BYTES = 64 * 2 ** 20
#: Longest device id shown, in characters (a longer one is cut, with a ~).
DEVICE_CHARS = 24
#: Clears the terminal and homes the cursor between two ``--watch`` frames.
CLEAR = "\x1b[H\x1b[2J"


class StatusError(Exception):
    """The fleet view could not be read; the message is the one line printed. ``refused``: it
    answered 401 (asking again will not help)."""

    def __init__(self, message: str, refused: bool = False):
        super().__init__(message)
        self.refused = refused


def add_arguments(parser) -> None:
    """The options of ``streamfl status``."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--url", default=None,
                       help="the coordinator's fleet view (default %s, its monitor: section's "
                            "host and port)" % DEFAULT_URL)
    where.add_argument("--run-dir", default=None, metavar="DIR",
                       help="the coordinator's run folder: its %s file names the URL (a "
                            "coordinator on port 0 writes it there)" % URL_FILE)
    parser.add_argument("--token-file", default=None, metavar="FILE",
                        help="file whose first line is the fleet view's token (monitor.token_file)")
    parser.add_argument("--json", action="store_true",
                        help="print the fleet snapshot as JSON, as /api/fleet sends it")
    parser.add_argument("--watch", type=float, default=None, metavar="SECONDS",
                        help="redraw every SECONDS until Ctrl-C")
    parser.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                        help="seconds to wait for the coordinator's answer (default 5)")
    parser.add_argument("--log-level", default="WARNING")


def run(args) -> int:
    """Fetch and print once, or every ``--watch`` seconds; 1 (and the reason) when the fleet view
    cannot be read."""
    for name in ("watch", "timeout"):
        value = getattr(args, name)
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ConfigError("--%s must be a number of seconds > 0, got %r" % (name, value))
    try:
        url = base_url(args.url, args.run_dir)
        token = read_token(args.token_file) if args.token_file else None

        def get() -> Dict[str, Any]:
            snap = fetch(url, token, args.timeout)
            if args.run_dir is not None:
                check_run_dir(snap, args.run_dir, url)
            snap["_source"] = {"url": url, "run_dir": args.run_dir}
            return snap
        snapshot = get()
    except StatusError as exc:
        print("streamfl status: %s" % exc, file=sys.stderr)
        return 1
    if args.watch is None:
        print(draw(snapshot, args.json, fit_height=False))
        return 0
    return _watch(get, args.json, snapshot, args.watch)


def draw(snapshot: Dict[str, Any], as_json: bool, fit_height: bool) -> str:
    """The snapshot as JSON, or rendered to the terminal's width (and height, ``fit_height``)."""
    if as_json:
        return json.dumps({k: v for k, v in snapshot.items() if k != "_source"}, sort_keys=True)
    size = shutil.get_terminal_size((120, 40))
    return render(snapshot, size.columns, size.lines - 1 if fit_height else None)


def _watch(get: Callable[[], Dict[str, Any]], as_json: bool, first: Dict[str, Any],
           every_s: float) -> int:
    """Redraw until Ctrl-C (0). A coordinator that goes away is shown as unreachable and asked
    again; one that refuses the token ends it (1)."""
    snapshot = first
    problem = ""
    tty = sys.stdout.isatty()
    try:
        while True:
            text = draw(snapshot, as_json, fit_height=tty)
            if problem:
                text = "%s\n%s" % (text, problem)
            sys.stdout.write((CLEAR if tty else "") + text + "\n")
            sys.stdout.flush()
            time.sleep(every_s)
            try:
                snapshot, problem = get(), ""
            except StatusError as exc:
                if exc.refused:
                    print("streamfl status: %s" % exc, file=sys.stderr)
                    return 1
                problem = "(%s: %s)" % (time.strftime("%H:%M:%S"), exc)
    except KeyboardInterrupt:
        return 0


# ---- reading the fleet view ---------------------------------------------------------------------

def base_url(url: Optional[str], run_dir: Optional[str]) -> str:
    """The fleet view's base URL: ``url``, the one in ``run_dir``'s monitor.url, or the default."""
    if run_dir is not None:
        path = Path(run_dir) / URL_FILE
        try:
            url = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise StatusError("no %s in %s (%s): is the coordinator running there, with its fleet "
                              "view on (monitor.enabled)?" % (URL_FILE, run_dir, exc.strerror or exc))
    url = (url or DEFAULT_URL).strip()
    if not url.startswith(("http://", "https://")):
        raise StatusError("%r is not an http:// or https:// URL" % url)
    return url.rstrip("/")


def _same_folder(a: str, b: str) -> bool:
    try:
        if Path(a).resolve() == Path(b).resolve():
            return True
        return Path(a).exists() and Path(b).exists() and Path(a).samefile(b)
    except OSError:
        return False


def check_run_dir(snapshot: Dict[str, Any], run_dir: str, url: str) -> None:
    """``StatusError`` unless the fleet view at ``url`` is the coordinator of ``run_dir`` (a
    snapshot that does not name its run folder, from an older coordinator, passes)."""
    served = (snapshot.get("coordinator") or {}).get("run_dir") if isinstance(
        snapshot.get("coordinator"), dict) else None
    if not served or not isinstance(served, str) or _same_folder(served, run_dir):
        return
    raise StatusError("%s/%s names %s, but the coordinator there is the one of run folder %s "
                      "(fleet %s, run %s): the coordinator of %s is not running (its %s is stale)"
                      % (run_dir, URL_FILE, url, served, snapshot.get("fleet", "-"),
                         str(snapshot.get("run_id") or "-")[:12], run_dir, URL_FILE))


def read_token(path: str) -> str:
    """The first line of ``path``, stripped."""
    try:
        with open(path, "r", encoding="utf-8") as fh:
            token = fh.readline(8192).strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise StatusError("cannot read the token file %s (%s)" % (path, exc))
    if not token:
        raise StatusError("the token file %s has no token on its first line" % path)
    return token


def fetch(url: str, token: Optional[str], timeout_s: float) -> Dict[str, Any]:
    """The snapshot from ``url``/api/fleet; ``StatusError`` saying why when there is none."""
    import urllib.error
    import urllib.request
    request = urllib.request.Request(url + "/api/fleet", headers={"Accept": "application/json"})
    if token:
        request.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            body = answer.read(MAX_ANSWER_BYTES + 1)
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            raise StatusError("%s answered 401: %s" % (url, "the token was refused" if token else
                                                       "the fleet view needs its token (--token-file)"),
                              refused=True)
        raise StatusError("%s answered %d %s" % (url, exc.code, exc.reason))
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise StatusError("cannot reach the coordinator's fleet view at %s (%s): is it running, with "
                          "monitor.enabled, and is that its host and port?" % (url, reason))
    if len(body) > MAX_ANSWER_BYTES:
        raise StatusError("%s sent more than %d bytes" % (url, MAX_ANSWER_BYTES))
    try:
        snapshot = json.loads(body.decode("utf-8"))
    except ValueError:
        raise StatusError("%s did not answer with JSON: is it a streamfl coordinator?" % url)
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("devices"), list):
        raise StatusError("%s did not answer with a fleet snapshot: is it a streamfl coordinator?" % url)
    return snapshot


# ---- drawing --------------------------------------------------------------------------------------

def _num(value: Any, pattern: str = "%g") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return pattern % value
    return str(value)


def _ago(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        return "-"
    if seconds < 60:
        return "%.0fs" % seconds
    if seconds < 3600:
        return "%.0fm" % (seconds / 60)
    return "%.1fh" % (seconds / 3600)


def _pairs(mapping: Any) -> str:
    if not isinstance(mapping, dict) or not mapping:
        return ""
    return ", ".join("%s %s" % (k, _num(v)) for k, v in sorted(mapping.items()))


def _clock(wall_s: Any) -> str:
    if not isinstance(wall_s, (int, float)) or isinstance(wall_s, bool) or not math.isfinite(wall_s):
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(wall_s))


def whose(s: Dict[str, Any]) -> str:
    """Where the snapshot came from and whose coordinator that is."""
    source = s.get("_source") if isinstance(s.get("_source"), dict) else {}
    c = s.get("coordinator") if isinstance(s.get("coordinator"), dict) else {}
    parts = []
    if source.get("url"):  # ``streamfl operator status`` renders an answer that came over MQTT
        parts.append("from %s" % source["url"])
        if source.get("run_dir"):
            parts[0] += " (%s/%s)" % (source["run_dir"], URL_FILE)
    if c:
        parts.append("coordinator pid %s on %s, run folder %s" % (
            _num(c.get("pid")), c.get("host") or "-", c.get("run_dir") or "-"))
    monitor = s.get("monitor") if isinstance(s.get("monitor"), dict) else {}
    if monitor.get("port_taken"):
        parts.append("its monitor.port %s was taken: it listens on %s" % (
            _num(monitor.get("port")), monitor.get("url")))
    return " · ".join(parts)


def broker_line(s: Dict[str, Any]) -> Optional[str]:
    """The coordinator's own broker link, or None when the snapshot does not say."""
    b = s.get("broker")
    if not isinstance(b, dict):
        return None
    disconnects = _num(b.get("disconnects"))
    if b.get("connected"):
        return "broker connected since %s · %s disconnect(s) so far" % (_clock(b.get("since_wall_s")),
                                                                       disconnects)
    reason = str(b.get("reason") or "")
    return ("%s since %s%s · %s disconnect(s): the coordinator hears nothing, so the "
            "devices' states are unknown (last heard shown)" % (
                "BROKER LOST" if b.get("connects") != 0 else "NO BROKER YET",
                _clock(b.get("since_wall_s")), " (%s)" % reason if reason else "", disconnects))


def power_line(s: Dict[str, Any]) -> Optional[str]:
    """Power now and energy so far, measured apart from modelled."""
    power = s.get("power_w_by_source") if isinstance(s.get("power_w_by_source"), dict) else None
    energy = s.get("energy_j_by_source") if isinstance(s.get("energy_j_by_source"), dict) else None
    counts = s.get("devices_powered_by_source") if isinstance(s.get("devices_powered_by_source"),
                                                              dict) else {}
    parts = []
    if power is not None:
        now = ["%s W %s (%s device(s))" % (_num(power.get(k), "%.2f"), k if k != "unknown" else
                                             "of unknown source", _num(counts.get(k)))
               for k in ("measured", "modelled", "unknown") if power.get(k) or counts.get(k)]
        parts.append("power now (online devices): %s" % (", ".join(now) or "none reported"))
    if energy is not None:
        parts.append("energy %s J (measured %s, modelled %s, unknown %s)" % (
            _num(s.get("energy_j"), "%.0f"), _num(energy.get("measured"), "%.0f"),
            _num(energy.get("modelled"), "%.0f"), _num(energy.get("unknown"), "%.0f")))
    elif s.get("energy_j") is not None:
        parts.append("energy %s J" % _num(s.get("energy_j"), "%.0f"))
    return " · ".join(parts) if parts else None


def header(s: Dict[str, Any]) -> List[str]:
    """The fleet's lines above the device table."""
    u = s.get("updates") if isinstance(s.get("updates"), dict) else {}
    accuracy = s.get("accuracy")
    acc = ("%.1f %% (version %s)" % (100 * accuracy, _num(s.get("eval_version")))
           if isinstance(accuracy, (int, float)) else "-")
    reasons = _pairs(s.get("rejected_by_reason"))
    others = ", ".join("%s %s" % (k, _num(u[k])) for k in sorted(u)
                       if k not in ("received", "aggregated", "rejected"))
    lines = [
        "fleet %s · run %s · method %s · up %s" % (
            s.get("fleet", "-"), str(s.get("run_id") or "-")[:12], s.get("method", "-"),
            _ago(s.get("time_s"))),
        "version %s · %s versions/s · accuracy %s · devices %s/%s online%s" % (
            _num(s.get("version")), _num(s.get("versions_per_s"), "%.2f"), acc,
            _num(s.get("devices_online")), _num(s.get("devices_known")),
            ", %s unknown" % _num(s.get("devices_unknown")) if s.get("devices_unknown") else ""),
        "updates: %s received, %s aggregated, %s rejected%s" % (
            _num(u.get("received")), _num(u.get("aggregated")), _num(u.get("rejected")),
            " (%s)" % reasons if reasons else ""),
    ]
    if others:
        lines.append("         %s" % others)
    broker = broker_line(s)
    if broker is not None:
        lines.insert(1, broker)
    if whose(s):
        lines.insert(1, whose(s))
    power = power_line(s)
    if power is not None:
        lines.append(power)
    return lines


def state(d: Dict[str, Any]) -> str:
    """A row's state as the STATE column shows it."""
    value = d.get("state")
    if value not in ("online", "offline", "unknown"):
        value = "online" if d.get("online") else "offline"
    if value == "online" and d.get("paused") is True:  # an operator's pause (fleet control)
        return "paused"
    return value


#: Below the device table when a power cell is marked (``power_cell``).
POWER_LEGEND = ("POWER_W: ~ modelled (a board profile's model, no meter), ? source not said (an "
                "older agent), (...) last heard of a device not online now")


def power_cell(d: Dict[str, Any]) -> str:
    """Watts now: plain when measured, ``~`` before a modelled figure, ``?`` after one whose
    source the agent did not say; an offline or unknown device's last figure in brackets."""
    watts, source = d.get("power_w"), d.get("power_source")
    if watts is None and isinstance(d.get("last_heard"), dict):
        last = d["last_heard"]
        if last.get("power_w") is not None:
            return "(%s)" % _marked(last.get("power_w"), last.get("power_source"))
    if watts is None:
        return "-"
    return _marked(watts, source)


def _marked(watts: Any, source: Any) -> str:
    text = _num(watts, "%.2f")
    return text if source == "measured" else "~" + text if source == "modelled" else text + "?"


#: A column: (title, priority (lower stays longer), right-aligned, the cell of a row).
Column = Tuple[str, int, bool, Callable[[Dict[str, Any]], str]]


def columns(rows: Sequence[Dict[str, Any]]) -> List[Column]:
    """Every column the rows have, with the clock domains and the methods' values they show."""
    def updates(key: str) -> Callable[[Dict[str, Any]], str]:
        return lambda d: _num((d.get("updates") or {}).get(key))
    cols: List[Column] = [
        ("DEVICE", 0, False, lambda d: _cut(str(d.get("device")), DEVICE_CHARS)),
        ("STATE", 0, False, state),
        ("SEEN", 1, True, lambda d: _ago(d.get("last_seen_s"))),
        ("VERSION", 1, True, lambda d: _num(d.get("version"))),
        ("STALE", 2, True, lambda d: _num(d.get("staleness"))),
        ("ROUNDS", 3, True, lambda d: _num(d.get("rounds"))),
        ("ACCEPTED", 2, True, updates("accepted")),
        ("REJECTED", 2, True, updates("rejected")),
        ("CLIPPED", 5, True, updates("clipped")),
    ]
    domains = sorted({k for d in rows for k in (d.get("clocks_mhz") or {})})
    for i, domain in enumerate(domains):
        cols.append(("%s_MHZ" % domain.upper(), 3 if i == 0 else 4, True,
                     lambda d, k=domain: _num((d.get("clocks_mhz") or {}).get(k), "%.0f")))
    cols += [
        ("POWER_W", 3, True, power_cell),
        ("ENERGY_J", 4, True, lambda d: _num(d.get("energy_j"), "%.0f")),
        ("TEMP_C", 4, True, lambda d: _num(d.get("temperature_c"), "%.1f")),
        ("BUFFER", 3, True, lambda d: "%s/%s" % (_num(d.get("buffer_fill")), _num(d.get("buffer_capacity")))),
        ("PRED/S", 6, True, lambda d: _num(d.get("predictions_per_s"), "%.2f")),
        ("CONF", 6, True, lambda d: _num(d.get("prediction_confidence"), "%.2f")),
        ("BOARD", 5, False, lambda d: str(d.get("board") or "-")),
        ("SOFTWARE", 7, False, lambda d: str(d.get("software") or "-")),
        ("METHODS", 6, False, lambda d: "; ".join(
            "%s %s" % (m, " ".join("%s=%s" % (k, _num(v)) for k, v in sorted((vals or {}).items())))
            for m, vals in sorted((d.get("methods") or {}).items())) or "-"),
    ]
    return cols


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "~"


def table(rows: Sequence[Dict[str, Any]], width: int) -> List[str]:
    """The device table, dropping the least needed columns until it is at most ``width`` wide."""
    cols = columns(rows)
    cells = [[get(d) for _, _, _, get in cols] for d in rows]
    widths = [max([len(title)] + [len(r[i]) for r in cells]) for i, (title, _, _, _) in enumerate(cols)]
    keep = list(range(len(cols)))
    while len(keep) > 2 and sum(widths[i] for i in keep) + 2 * (len(keep) - 1) > width:
        keep.remove(max(keep, key=lambda i: (cols[i][1], i)))

    def line(values: Sequence[str]) -> str:
        return "  ".join(values[i].rjust(widths[i]) if cols[i][2] else values[i].ljust(widths[i])
                         for i in keep).rstrip()
    out = [line([c[0] for c in cols])] + [line(r) for r in cells]
    return [_cut(text, width) for text in out]


def render(s: Dict[str, Any], width: int = 120, height: Optional[int] = None) -> str:
    """The header and the device table in ``width`` columns and, with ``height``, at most that many
    lines (the devices that do not fit are counted on the last line)."""
    width = max(40, width)
    lines = [_cut(text, width) for text in header(s)]
    rows = [d for d in s.get("devices") or [] if isinstance(d, dict)]
    total = s.get("devices_total") if isinstance(s.get("devices_total"), int) else len(rows)
    lines.append("")
    if not rows:
        lines.append("no devices yet")
        return "\n".join(lines)
    room = None if height is None else max(1, height - len(lines) - 2)
    shown = rows if room is None else rows[:room]
    lines += table(shown, width)
    if total > len(shown):
        lines.append("... %d more device(s), online first" % (total - len(shown)))
    if any(power_cell(d) != _num(d.get("power_w"), "%.2f") for d in shown):
        lines.append(_cut(POWER_LEGEND, width))
    return "\n".join(lines)
