"""The live fleet table: what an operator sees of a running fleet, per device and fleet-wide.

Fed on the coordinator's worker thread by what the fleet sends (hellos, last wills, updates' fates,
telemetry), by the evaluations and by the methods' ``describe`` queries; read from any thread as
an immutable snapshot (``snapshot()``, a JSON-able dict, rebuilt by ``refresh``) and as bounded
time series (``series()``). The dashboard, ``/metrics``, ``streamfl status``, ``streamfl operator
status`` and the run's ``summary.json`` all read it, so they never disagree.

Every number a device sends is hostile until bounded: telemetry and update figures outside the
declared physical bounds of ``FleetTableConfig`` (a board's power, a round's energy, a clock, a
temperature) are shown as unknown and counted as implausible, never summed into a fleet total;
and the table, its rows and its series are bounded however many devices come and go.

Views tell the truth:

- **The coordinator's own broker link** (``on_broker``, from the server's connect and disconnect
  callbacks) is in every snapshot (``broker``: connected, since when, disconnects). While it is
  lost, nothing the coordinator holds about a device is news: every row's ``state`` is
  ``unknown`` (with when it was last heard), not ``offline``. A broker that stops sends every
  client's last will first (mosquitto does), so wills that arrive from ``broker_will_window_s``
  before the loss until the link is back are doubtful too: such a device stays ``unknown`` until it
  says hello again, or ``rejoin_wait_s`` after the reconnect, when it is shown offline.
- **Only live devices count now**: a row whose state is not ``online`` shows no power, clocks or
  temperature (its last ones are under ``last_heard``), and the fleet's power sums live rows only.
- **Modelled watts are not measured ones**: telemetry says which meter gave its watts
  (``Telemetry.power_meter``, ``power_measured``); each row's ``power_source`` is ``measured``,
  ``modelled`` or ``unknown`` (an agent that does not say), the fleet's power and energy are
  summed per source (``power_w_by_source``, ``energy_j_by_source``), never into one figure.
"""
import logging
import math
import os
import socket
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Sequence, Tuple

from streamfl.config import bounded
from streamfl.coordinator.plugins.base import MAX_STATE_KEYS, MethodState
from streamfl.protocol.messages import Hello, Offline, Telemetry

log = logging.getLogger(__name__)

SCHEMA = 1
#: The fates of an update the table counts (``UpdateRecord.outcome``), in display order.
OUTCOMES = ("aggregated", "buffered", "stale", "duplicate", "rejected", "withheld")
#: Longest string a method's state or an event text may show.
MAX_TEXT = 80
#: Where a figure of power or energy came from: a meter that measures, a power model, or an agent
#: that did not say (older agents).
POWER_SOURCES = ("measured", "modelled", "unknown")
#: Longest meter kind kept from telemetry.
MAX_METER_CHARS = 32
#: A device row's ``state``: heard online, gone (its will or a clean exit), or not known now.
STATES = ("online", "offline", "unknown")


@dataclass(frozen=True)
class FleetTableConfig:
    """Bounds of the live fleet view (``fleet_view:`` in the coordinator YAML).

    The physical bounds are generous for the boards streamfl runs on (a Jetson AGX Orin draws up to
    60 W; a round of minutes at that power is tens of kJ): a figure outside them is a broken meter
    or a hostile device, shown as unknown and counted, not summed.
    """

    #: A device's telemetry goes to metrics.jsonl at most this often (seconds; 0 = never): a
    #: board sends it every few seconds, a week of it from thirty boards would be millions of lines.
    telemetry_metrics_every_s: float = bounded(30.0, 0.0, 86400.0)
    #: Devices kept in the table; a new one past it is counted in ``devices_untracked`` only.
    max_devices: int = bounded(10000, 1, 10 ** 6)
    #: Rows of the snapshot (online devices first, then by id); the rest are counted.
    max_rows: int = bounded(1000, 1, 10 ** 6)
    #: Points kept per series (accuracy, versions, energy, each device's clocks, events).
    series_points: int = bounded(2000, 10, 10 ** 6)
    #: Devices whose clocks are kept as series (the first seen).
    max_clock_series: int = bounded(64, 0, 10000)
    #: Versions per second are measured over this window (seconds).
    rate_window_s: float = bounded(30.0, 1.0, 3600.0)
    #: A series point of versions and energy is taken at most this often (seconds).
    series_every_s: float = bounded(2.0, 0.1, 3600.0)
    #: Largest plausible board power (W); telemetry above it is ignored.
    max_power_w: float = bounded(500.0, 1.0, 1e6)
    #: Largest plausible energy of one round (J); an update claiming more adds nothing.
    max_round_energy_j: float = bounded(1e6, 1.0, 1e12)
    #: Largest plausible prediction rate of one board (per second).
    max_predictions_per_s: float = bounded(10000.0, 1.0, 1e9)
    #: Largest plausible clock (MHz).
    max_clock_mhz: float = bounded(10000.0, 1.0, 1e6)
    #: Plausible temperatures (degrees C).
    min_temperature_c: float = bounded(-60.0, -273.15, 0.0)
    max_temperature_c: float = bounded(150.0, 0.0, 1000.0)
    #: Largest plausible filesystem of a board's state folder (bytes; 64 TiB: boards boot from SD
    #: cards, eMMC and NVMe drives of at most a few TB); a larger size, or more free than its size,
    #: is ignored.
    max_disk_bytes: float = bounded(float(2 ** 46), 1.0, 1e18)
    #: Seconds before the coordinator loses the broker within which a device's last will is taken
    #: for the broker's own going down (mosquitto sends every client's will as it stops, just
    #: before it drops the coordinator), not for the device's: that device shows as unknown.
    broker_will_window_s: float = bounded(5.0, 0.0, 3600.0)
    #: Seconds after the coordinator is back on the broker that a device whose will came with the
    #: broker's loss stays unknown while it reconnects (agents retry up to every 60 s by
    #: default, mqtt.reconnect_max_s); not back by then, it is shown offline.
    rejoin_wait_s: float = bounded(120.0, 0.0, 86400.0)


@dataclass
class DeviceRow:
    """What the table keeps of one device between snapshots."""

    device: str
    board: str = ""
    software: str = ""
    version: Optional[int] = None
    staleness: Optional[int] = None
    rounds: Optional[int] = None
    outcomes: Counter = field(default_factory=Counter)
    clipped: int = 0
    reasons: Counter = field(default_factory=Counter)
    energy_j: float = 0.0
    #: ``energy_j`` split by where it came from (``POWER_SOURCES``).
    energy_by_source: Counter = field(default_factory=Counter)
    power_w: Optional[float] = None
    #: Which meter gave ``power_w``, and what that makes it (``POWER_SOURCES``).
    power_meter: str = ""
    power_source: str = "unknown"
    clocks_mhz: Dict[str, float] = field(default_factory=dict)
    temperature_c: Optional[float] = None
    #: Bytes free on its state folder's filesystem and that filesystem's size (bounded).
    disk_free_bytes: Optional[int] = None
    disk_size_bytes: Optional[int] = None
    buffer_fill: Optional[int] = None
    buffer_capacity: Optional[int] = None
    #: Its telemetry says an operator paused it (fleet control): it starts no round.
    paused: bool = False
    #: Predictions on live windows (the agent's ``predict:``): per second, the latest
    #: confidence, and how many the device dropped; None while it does not predict.
    predictions_per_s: Optional[float] = None
    prediction_confidence: Optional[float] = None
    predictions_dropped: int = 0
    staleness_sum: int = 0
    #: When its telemetry last went to metrics.jsonl (seconds since start).
    telemetry_logged_s: float = -math.inf
    #: Wall time (s) its last will or clean exit arrived; None while it is online.
    offline_wall_s: Optional[float] = None


def _finite_in(value: Any, lo: float, hi: float) -> Optional[float]:
    """``value`` as a float if it is a finite number within [lo, hi], else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and lo <= value <= hi else None


def power_source(meter: Any, measured: Any) -> str:
    """What a device's watts are (``POWER_SOURCES``) from what its telemetry says of its meter:
    ``modelled`` for a model (``measured`` False, or the ``modeled`` meter whatever it claims),
    ``measured`` only when it says so, ``unknown`` when it says nothing (older agents)."""
    if measured is False or meter == "modeled":
        return "modelled"
    return "measured" if measured is True else "unknown"


def _scalar(value: Any) -> Any:
    """A method's value as the view shows it: plain, finite, short."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return round(value, 6) if math.isfinite(value) else None
    return str(value)[:MAX_TEXT]


def _state_dict(values: Mapping[str, Any]) -> Dict[str, Any]:
    """At most ``MAX_STATE_KEYS`` of a method's values, made plain."""
    out = {}
    for key in list(values)[:MAX_STATE_KEYS]:
        out[str(key)[:MAX_TEXT]] = _scalar(values[key])
    return out


def event_text(event: Mapping[str, Any]) -> str:
    """A method's metrics event in one short line: its fields but the bookkeeping ones."""
    skip = {"event", "time_s", "wall_s", "method", "seed"}
    parts = []
    for key, value in event.items():
        if key in skip or isinstance(value, (dict, list)):
            continue
        value = _scalar(value)
        parts.append("%s=%s" % (key, ("%.4g" % value) if isinstance(value, float) else value))
    return " ".join(parts)[:MAX_TEXT * 2]


class FleetTable:
    """Per-device rows and fleet figures of a live coordinator; see the module docstring."""

    def __init__(self, config: FleetTableConfig, fleet: str, method: str, strategy: str,
                 plugins: Sequence[str], wall_clock: Callable[[], float] = time.time):
        self.config = config
        self.fleet = fleet
        self.method = method
        self.strategy = strategy
        self.plugins = list(plugins)
        self.run_id = ""
        self._wall = wall_clock
        self._rows: Dict[str, DeviceRow] = {}
        self._untracked = 0
        self._implausible = Counter()
        self._outcomes = Counter()
        self._reasons = Counter()
        self._clipped = 0
        self._staleness = Counter()
        self._accuracy: Optional[Tuple[float, int, float, float]] = None  # (t, version, acc, loss)
        self._accuracies: List[float] = []
        self._first_accuracy: Optional[float] = None
        points = config.series_points
        self._lock = threading.Lock()
        self._series: Dict[str, Deque] = {k: deque(maxlen=points)
                                          for k in ("accuracy", "versions", "energy_j", "events")}
        self._clock_series: Dict[str, Dict[str, Deque]] = {}
        self._rate: Deque[Tuple[float, int]] = deque()
        self._last_point_s = -math.inf
        self._snapshot: Dict[str, Any] = {"schema": SCHEMA, "fleet": fleet, "devices": []}
        #: Who serves this table: the coordinator's run folder (absolute), host and process, so
        #: a reader can tell which coordinator it is looking at (``streamfl status``).
        self.run_dir = ""
        self.host = socket.gethostname()
        self.pid = os.getpid()
        # The coordinator's own broker link (``on_broker``, from the network thread): connected,
        # since when (wall s), disconnects, the last reason, and when it was last lost and back.
        # None until ``served_by``: a table nobody connects (a test's) has no link to show.
        self._broker: Optional[Dict[str, Any]] = None
        self._lost_wall_s: Optional[float] = None
        self._back_wall_s: Optional[float] = None

    def served_by(self, run_dir: str) -> None:
        """This table is a running coordinator's, whose run folder is ``run_dir``: from now on its
        broker link is shown, not connected until the first ``on_broker(True)``."""
        self.run_dir = str(run_dir)
        with self._lock:
            if self._broker is None:
                self._broker = {"connected": False, "since_wall_s": self._wall(), "disconnects": 0,
                                "connects": 0, "reason": "not connected yet"}

    # ---- the coordinator's broker link (network thread) ---------------------------------------
    def on_broker(self, connected: bool, reason: str = "") -> None:
        """The coordinator connected to the broker (``connected``) or lost it (``reason``)."""
        now = self._wall()
        with self._lock:
            if self._broker is None:
                self._broker = {"connected": False, "since_wall_s": now, "disconnects": 0,
                                "connects": 0, "reason": ""}
            b = self._broker
            if connected:
                b.update(connected=True, since_wall_s=now, reason="", connects=b["connects"] + 1)
                self._back_wall_s = now
            elif b["connected"]:
                b.update(connected=False, since_wall_s=now, reason=str(reason)[:MAX_TEXT],
                         disconnects=b["disconnects"] + 1)
                self._lost_wall_s, self._back_wall_s = now, None
            else:  # a failed attempt while not connected: the loss keeps its start
                b["reason"] = str(reason)[:MAX_TEXT] or b["reason"]

    def broker(self) -> Optional[Dict[str, Any]]:
        """The coordinator's broker link as the snapshot shows it (any thread); None when the
        table is not told (no ``served_by`` nor ``on_broker``)."""
        with self._lock:
            if self._broker is None:
                return None
            out = dict(self._broker)
        out["since_wall_s"] = round(out["since_wall_s"], 3)
        return out

    # ---- inputs (worker thread) ----------------------------------------------------------------
    def _row(self, device_id: str) -> Optional[DeviceRow]:
        row = self._rows.get(device_id)
        if row is None:
            if len(self._rows) >= self.config.max_devices:
                self._untracked += 1
                return None
            row = self._rows[device_id] = DeviceRow(device_id)
        return row

    def on_message(self, msg: Any, t_s: float) -> List[Dict[str, Any]]:
        """A hello, last will or telemetry: update the row; return the metrics lines it makes
        (a device coming or going, downsampled telemetry)."""
        if isinstance(msg, Hello):
            row = self._row(msg.device_id)
            if row is not None:
                row.board, row.software = msg.board[:MAX_TEXT], msg.software_version[:MAX_TEXT]
                row.buffer_capacity = msg.buffer_capacity
                row.offline_wall_s = None if msg.online else self._wall()
            return [{"event": "device", "device": msg.device_id, "online": bool(msg.online),
                     "board": msg.board[:MAX_TEXT], "software": msg.software_version[:MAX_TEXT]}]
        if isinstance(msg, Offline):
            row = self._row(msg.device_id)
            if row is not None:
                row.offline_wall_s = self._wall()
            return [{"event": "device", "device": msg.device_id, "online": False,
                     "reason": msg.reason[:MAX_TEXT]}]
        if isinstance(msg, Telemetry):
            return self._on_telemetry(msg, t_s)
        return []

    def _plausible(self, what: str, value: Any, lo: float, hi: float) -> Optional[float]:
        if value is None:
            return None
        out = _finite_in(value, lo, hi)
        if out is None:
            self._implausible[what] += 1
        return out

    def _on_telemetry(self, msg: Telemetry, t_s: float) -> List[Dict[str, Any]]:
        row = self._row(msg.device_id)
        if row is None:
            return []
        c = self.config
        row.rounds = msg.rounds
        row.buffer_fill, row.buffer_capacity = msg.buffer_fill, msg.buffer_capacity
        row.paused = msg.paused is True
        row.power_w = self._plausible("power_w", msg.power_w, 0.0, c.max_power_w)
        row.power_meter = str(msg.power_meter)[:MAX_METER_CHARS]
        row.power_source = power_source(row.power_meter, msg.power_measured)
        clocks = {}
        for domain, khz in list(msg.clocks_khz.items())[:MAX_STATE_KEYS]:
            mhz = self._plausible("clock", khz / 1000.0, 0.0, c.max_clock_mhz)
            if mhz is not None:
                clocks[str(domain)[:MAX_TEXT]] = round(mhz, 3)
        row.clocks_mhz = clocks
        temps = [self._plausible("temperature_c", v, c.min_temperature_c, c.max_temperature_c)
                 for v in list(msg.temperatures_c.values())[:64]]
        temps = [v for v in temps if v is not None]
        row.temperature_c = max(temps) if temps else None
        row.disk_free_bytes, row.disk_size_bytes = self._disk(msg)
        row.predictions_per_s = self._plausible("predictions_per_s", msg.predictions_per_s, 0.0,
                                                c.max_predictions_per_s)
        row.prediction_confidence = self._plausible("prediction_confidence", msg.prediction_confidence,
                                                    0.0, 1.0)
        row.predictions_dropped = msg.predictions_dropped
        self._clock_points(msg.device_id, clocks, t_s)
        if c.telemetry_metrics_every_s <= 0 or t_s - row.telemetry_logged_s < c.telemetry_metrics_every_s:
            return []
        row.telemetry_logged_s = t_s
        return [{"event": "telemetry", "device": msg.device_id, "rounds": msg.rounds,
                 "buffer_fill": msg.buffer_fill, "buffer_capacity": msg.buffer_capacity,
                 "power_w": row.power_w, "power_source": row.power_source,
                 "power_meter": row.power_meter, "clocks_mhz": dict(clocks),
                 "temperature_c": row.temperature_c, "diverged_rounds": msg.diverged_rounds,
                 "disk_free_bytes": row.disk_free_bytes, "disk_size_bytes": row.disk_size_bytes,
                 "predictions_per_s": row.predictions_per_s,
                 "prediction_confidence": row.prediction_confidence,
                 "predictions_dropped": row.predictions_dropped}]

    def _disk(self, msg: Telemetry) -> Tuple[Optional[int], Optional[int]]:
        """A telemetry's free and total bytes of the board's state folder, both None unless both
        are plausible: a size within ``max_disk_bytes``, free space within the size."""
        if msg.state_disk_free_bytes is None and msg.state_disk_size_bytes is None:
            return None, None
        size = self._plausible("disk_bytes", msg.state_disk_size_bytes, 1.0, self.config.max_disk_bytes)
        free = None if size is None else self._plausible("disk_bytes", msg.state_disk_free_bytes, 0.0, size)
        if size is None or free is None:
            return None, None
        return int(free), int(size)

    def _clock_points(self, device_id: str, clocks: Mapping[str, float], t_s: float) -> None:
        with self._lock:
            per_device = self._clock_series.get(device_id)
            if per_device is None:
                if len(self._clock_series) >= self.config.max_clock_series:
                    return
                per_device = self._clock_series[device_id] = {}
            for domain, mhz in clocks.items():
                points = per_device.get(domain)
                if points is None:
                    if len(per_device) >= MAX_STATE_KEYS:
                        continue
                    points = per_device[domain] = deque(maxlen=self.config.series_points)
                points.append((round(t_s, 3), mhz))

    def on_record(self, record: Mapping[str, Any], t_s: float) -> None:
        """A metrics line of a core step: an update's fate, or a method's event. An update's
        energy counts under its ``energy_source`` when the line has one (an earlier process's line,
        read back), else under the device's power source now, which is written into the line
        (``record`` is the dict the server then writes to metrics.jsonl), so that a line read back
        counts where it counted."""
        if record.get("event") != "update":
            if record.get("event"):
                with self._lock:
                    self._series["events"].append((round(t_s, 3), str(record["event"])[:MAX_TEXT],
                                                   event_text(record)))
            return
        outcome = str(record.get("outcome", ""))
        self._outcomes[outcome] += 1
        reason = record.get("reason")
        if outcome == "rejected" and reason:
            self._reasons[str(reason)] += 1
        if record.get("clipped"):
            self._clipped += 1
        row = self._rows.get(str(record.get("device")))
        if row is None and outcome != "rejected":  # a rejected sender gets no row of its own
            row = self._row(str(record.get("device")))
        if row is None:
            return
        row.outcomes[outcome] += 1
        if outcome == "rejected":
            if reason:
                row.reasons[str(reason)] += 1
            return
        if outcome == "duplicate":
            return
        row.clipped += int(bool(record.get("clipped")))
        row.version = int(record.get("base_version", 0))
        staleness = int(record.get("staleness", 0))
        row.staleness = staleness
        row.staleness_sum += staleness
        self._staleness[staleness] += 1
        energy = self._plausible("energy_j", record.get("energy_j"), 0.0, self.config.max_round_energy_j)
        if energy is not None:  # the round's energy is the device's meter's, as its power is
            source = record.get("energy_source")
            if source not in POWER_SOURCES:
                source = row.power_source
                if isinstance(record, dict):
                    record["energy_source"] = source
            row.energy_j += energy
            row.energy_by_source[source] += energy

    def on_eval(self, version: int, accuracy: float, loss: float, t_s: float) -> None:
        """An evaluation of the global model on the held-out set."""
        self._accuracy = (t_s, version, accuracy, loss)
        self._accuracies.append(accuracy)
        if self._first_accuracy is None:
            self._first_accuracy = accuracy
        with self._lock:
            self._series["accuracy"].append((round(t_s, 3), version, round(accuracy, 6)))

    # ---- the snapshot (built on the worker thread, read anywhere) ------------------------------
    def energy_j(self) -> float:
        """Joules of every round the fleet reported (bounded per round), of every source."""
        return sum(r.energy_j for r in self._rows.values())

    def energy_j_by_source(self) -> Dict[str, float]:
        """``energy_j`` split into measured, modelled and unknown joules."""
        total: Counter = Counter()
        for row in self._rows.values():
            total.update(row.energy_by_source)
        return {k: round(total.get(k, 0.0), 3) for k in POWER_SOURCES}

    def _state(self, row: Optional[DeviceRow], info: Any, broker: Optional[Mapping[str, Any]]) -> str:
        """A device's ``STATES`` entry now: unknown while the coordinator has lost the broker, and
        for a will that came with the broker's loss until the device is back or ``rejoin_wait_s``
        after the reconnect (module docstring)."""
        if broker is not None and not broker["connected"]:
            return "unknown"
        if getattr(info, "online", False):
            return "online"
        lost, back = self._lost_wall_s, self._back_wall_s
        gone = row.offline_wall_s if row is not None else None
        if (lost is not None and back is not None and gone is not None
                and gone >= lost - self.config.broker_will_window_s and gone <= back
                and self._wall() - back < self.config.rejoin_wait_s):
            return "unknown"
        return "offline"

    def refresh(self, now: float, t_s: float, version: int, devices: Mapping[str, Any],
                methods: Mapping[str, MethodState]) -> Dict[str, Any]:
        """Rebuild the snapshot from the table, the registry's ``devices`` (``DeviceInfo`` by id:
        online, last seen on the clock of ``now``) and each running method's ``describe``;
        ``t_s`` is seconds since the coordinator started. Returns the snapshot."""
        rate = self._versions_per_s(t_s, version)
        energy = self.energy_j()
        by_source = self.energy_j_by_source()
        if t_s - self._last_point_s >= self.config.series_every_s:
            self._last_point_s = t_s
            with self._lock:
                self._series["versions"].append((round(t_s, 3), version, round(rate, 4)))
                # (t, all, measured, modelled, unknown): the chart draws the sources apart.
                self._series["energy_j"].append((round(t_s, 3), round(energy, 3))
                                                + tuple(by_source[k] for k in POWER_SOURCES))
        broker = self.broker()
        states = {d: self._state(self._rows.get(d), devices.get(d), broker)
                  for d in set(self._rows) | set(devices)}
        ids = sorted(states, key=lambda d: (STATES.index(states[d]), d))
        rows = [self._row_dict(d, devices.get(d), methods, now, states[d])
                for d in ids[:self.config.max_rows]]
        power = {k: 0.0 for k in POWER_SOURCES}
        powered = {k: 0 for k in POWER_SOURCES}
        for d, state in states.items():
            row = self._rows.get(d)
            if state == "online" and row is not None and row.power_w is not None:
                power[row.power_source] += row.power_w
                powered[row.power_source] += 1
        counts = Counter(states.values())
        acc = self._accuracy
        received = sum(self._outcomes.values())
        snapshot = {
            "schema": SCHEMA, "fleet": self.fleet, "run_id": self.run_id, "method": self.method,
            "strategy": self.strategy, "plugins": list(self.plugins),
            "time_s": round(t_s, 3), "wall_s": round(self._wall(), 3), "version": version,
            "versions_per_s": round(rate, 4),
            "accuracy": None if acc is None else round(acc[2], 6),
            "loss": None if acc is None else round(acc[3], 6),
            "eval_version": None if acc is None else acc[1],
            "broker": broker,
            "coordinator": {"host": self.host, "pid": self.pid, "run_dir": self.run_dir},
            "devices_online": counts.get("online", 0),
            "devices_offline": counts.get("offline", 0),
            "devices_unknown": counts.get("unknown", 0),
            "devices_known": len(devices),
            "updates": dict({k: self._outcomes.get(k, 0) for k in OUTCOMES},
                            received=received, clipped=self._clipped),
            "rejected_by_reason": dict(sorted(self._reasons.items())),
            "implausible": dict(sorted(self._implausible.items())),
            "energy_j": round(energy, 3),
            "energy_j_by_source": by_source,
            "power_w_by_source": {k: round(v, 3) for k, v in power.items()},
            "devices_powered_by_source": powered,
            "methods": {name: _state_dict(state.fleet) for name, state in methods.items() if state.fleet},
            "devices": rows, "devices_shown": len(rows), "devices_total": len(ids),
            "devices_untracked": self._untracked,
        }
        self._snapshot = snapshot
        return snapshot

    def _row_dict(self, device_id: str, info: Any, methods: Mapping[str, MethodState],
                  now: float, state: str = "online") -> Dict[str, Any]:
        row = self._rows.get(device_id) or DeviceRow(device_id)
        hello = getattr(info, "hello", None)
        accepted = sum(n for k, n in row.outcomes.items() if k not in ("rejected", "duplicate"))
        live = state == "online"
        heard = {"power_w": row.power_w, "power_source": row.power_source if row.power_w is not None
                 else None, "clocks_mhz": dict(row.clocks_mhz), "temperature_c": row.temperature_c,
                 "disk_free_bytes": row.disk_free_bytes, "disk_size_bytes": row.disk_size_bytes}
        return {
            "device": device_id,
            "online": live,
            "state": state,
            "last_seen_s": (None if info is None
                            else round(max(0.0, now - info.last_seen_s), 1)),
            "offline_reason": getattr(info, "offline_reason", "") or "",
            # Hellos from two agent processes under this id (coordinator/registry.py): cloned boards.
            "duplicate_device_id": int(getattr(info, "duplicate_id", 0) or 0),
            "board": row.board or (hello.board[:MAX_TEXT] if hello is not None else ""),
            "software": row.software,
            "version": row.version, "staleness": row.staleness, "rounds": row.rounds,
            "updates": {"accepted": accepted, "clipped": row.clipped,
                        "rejected": row.outcomes.get("rejected", 0),
                        "duplicate": row.outcomes.get("duplicate", 0)},
            "rejected_by_reason": dict(sorted(row.reasons.items())),
            "clocks_mhz": heard["clocks_mhz"] if live else {},
            "power_w": row.power_w if live else None,
            "power_source": heard["power_source"] if live else None,
            "power_meter": row.power_meter,
            "temperature_c": row.temperature_c if live else None,
            "disk_free_bytes": row.disk_free_bytes if live else None,
            "disk_size_bytes": row.disk_size_bytes if live else None,
            "last_heard": None if live else heard,
            "energy_j": round(row.energy_j, 3),
            "energy_j_by_source": {k: round(v, 3) for k, v in sorted(row.energy_by_source.items())},
            "buffer_fill": row.buffer_fill, "buffer_capacity": row.buffer_capacity,
            "paused": row.paused and live,
            "predictions_per_s": row.predictions_per_s,
            "prediction_confidence": row.prediction_confidence,
            "predictions_dropped": row.predictions_dropped,
            "methods": {name: _state_dict(state.devices[device_id]) for name, state in methods.items()
                        if device_id in state.devices},
        }

    def _versions_per_s(self, t_s: float, version: int) -> float:
        self._rate.append((t_s, version))
        while len(self._rate) > 2 and t_s - self._rate[1][0] >= self.config.rate_window_s:
            self._rate.popleft()
        t0, v0 = self._rate[0]
        return (version - v0) / (t_s - t0) if t_s > t0 else 0.0

    def snapshot(self) -> Dict[str, Any]:
        """The latest snapshot (any thread; never changed once made)."""
        return self._snapshot

    def series(self, since_s: float = 0.0) -> Dict[str, Any]:
        """Points newer than ``since_s`` of every series (any thread)."""
        def newer(points) -> List[Any]:
            return [list(p) for p in points if p[0] > since_s]
        with self._lock:
            return {"time_s": self._snapshot.get("time_s"),
                    "accuracy": newer(self._series["accuracy"]),
                    "versions": newer(self._series["versions"]),
                    "energy_j": newer(self._series["energy_j"]),
                    "clocks_mhz": {d: {dom: newer(p) for dom, p in per.items()}
                                   for d, per in self._clock_series.items()},
                    "events": newer(self._series["events"])}

    # ---- the run's figures ----------------------------------------------------------------------
    def figures(self) -> Dict[str, Any]:
        """The run's figures for ``summary.json``, in the simulator's names where they apply."""
        updates = sum(self._outcomes.values())
        merged = sum(n for k, n in self._outcomes.items() if k not in ("rejected", "duplicate"))
        stale_n = sum(self._staleness.values())
        acc = self._accuracy
        return {
            "final_accuracy": None if acc is None else acc[2],
            "initial_accuracy": self._first_accuracy,
            "mean_accuracy": (round(sum(self._accuracies) / len(self._accuracies), 6)
                              if self._accuracies else None),
            "best_accuracy": max(self._accuracies) if self._accuracies else None,
            "evaluations": len(self._accuracies),
            "energy_j": round(self.energy_j(), 3),
            "energy_j_by_source": self.energy_j_by_source(),
            "energy_j_per_device": {d: round(r.energy_j, 3) for d, r in sorted(self._rows.items())},
            "updates": updates,
            "updates_by_outcome": {k: self._outcomes.get(k, 0) for k in OUTCOMES},
            "rejected_by_reason": dict(sorted(self._reasons.items())),
            "clipped": self._clipped,
            "mean_staleness": (round(sum(s * n for s, n in self._staleness.items()) / stale_n, 4)
                               if stale_n else None),
            "max_staleness": max(self._staleness) if self._staleness else None,
            "staleness_histogram": {str(k): v for k, v in sorted(self._staleness.items())},
            "updates_admitted": merged,
            "implausible": dict(sorted(self._implausible.items())),
            "devices": sorted(self._rows),
        }


def method_name(config: Any) -> str:
    """The name a run's figures go under: the named method it runs (``method:``), else its
    strategy and plug-ins joined as the simulator names them (``fedasync+clp``)."""
    named = getattr(config, "method", None)
    if named:
        return str(named)
    return "+".join([config.strategy] + list(config.plugins))


#: Fields of a device row that ``streamfl operator status`` answers with (the dashboard has all).
STATUS_ROW_FIELDS = ("device", "online", "state", "last_seen_s", "board", "version", "staleness",
                     "rounds", "updates", "power_w", "power_source", "energy_j", "temperature_c",
                     "buffer_fill", "paused",
                     "predictions_per_s", "prediction_confidence", "methods")


def status_result(snapshot: Mapping[str, Any], rows: int) -> Dict[str, Any]:
    """The answer to an operator's ``status`` command: the snapshot's fleet figures and its first
    ``rows`` devices, trimmed to ``STATUS_ROW_FIELDS`` so that the reply stays small."""
    out = {k: v for k, v in snapshot.items() if k != "devices"}
    out["devices"] = [{k: row.get(k) for k in STATUS_ROW_FIELDS} for row in snapshot.get("devices", [])[:rows]]
    out["devices_shown"] = len(out["devices"])
    return out
