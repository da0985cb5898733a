"""/metrics: the fleet snapshot in Prometheus' text format, through a custom ``prometheus_client``
collector on a registry of its own.

Each scrape reads one snapshot (the coordinator's fleet table, ``/api/fleet``'s data) and turns it
into metric families named ``streamfl_*``, their units in their names (``_watts``, ``_hertz``,
``_joules_total``, ``_celsius``, ``_seconds``). Nothing is kept between scrapes, so the counters are
the coordinator's own totals, which restart from zero with the coordinator, as Prometheus'
``rate()`` expects of a counter.

Label sets are bounded. ``outcome``, ``reason``, ``method``, ``key`` and clock ``domain`` come from
the snapshot's keys, which the coordinator draws from fixed sets (at most ``MAX_KEYS`` of each are
kept, in sorted order). ``device`` labels go to the first ``max_device_labels`` rows of the snapshot
(online first, then by id, the snapshot's own order: the devices one looks at first); the others
count in the fleet totals only, and ``streamfl_devices_unlabelled`` says how many there are.

What is exported is what is known now: the coordinator's own broker link
(``streamfl_broker_connected``, ``streamfl_broker_disconnects_total``,
``streamfl_broker_lost_since_timestamp_seconds`` while it is lost); a device that is not online
(offline, or unknown while the coordinator has lost the broker) has no power, clock, temperature,
disk, buffer or prediction sample, and no ``streamfl_device_online`` sample while its state is
unknown; power and energy carry a ``source`` label (``measured``, ``modelled``, ``unknown``: what the
device's telemetry said of its meter), and the fleet's totals are per source, never modelled and
measured watts summed into one figure.
"""
import math
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

#: The content type of ``render``'s answer.
CONTENT_TYPE = CONTENT_TYPE_LATEST
#: Most distinct keys taken from one mapping of the snapshot (outcomes, reasons, a plug-in's
#: values, clock domains): the sets are small and fixed; this keeps a faulty one from growing them.
MAX_KEYS = 64
#: Longest label value, in characters (a longer device id or key is cut).
MAX_LABEL_CHARS = 128
#: The ``updates`` counts that are not an update's outcome, exported under names of their own.
NOT_OUTCOMES = {"received": "streamfl_updates_received", "clipped": "streamfl_updates_clipped"}
#: The ``source`` label's values (``coordinator/fleet.py``'s ``POWER_SOURCES``).
SOURCES = ("measured", "modelled", "unknown")
#: A row's keys that say how the device is now, exported only while it is online.
LIVE_ONLY = ("power_w", "temperature_c", "buffer_fill", "predictions_per_s", "prediction_confidence",
             "clocks_mhz", "disk_free_bytes", "disk_size_bytes", "paused")


def row_state(row: Dict[str, Any]) -> str:
    """A row's ``state`` (``online``, ``offline``, ``unknown``); rows of older coordinators have only
    ``online``."""
    state = row.get("state")
    if state in ("online", "offline", "unknown"):
        return state
    return "online" if row.get("online") else "offline"


def _source(value: Any) -> str:
    return value if value in SOURCES else "unknown"


def _number(value: Any) -> Optional[float]:
    """``value`` as a float if it is a number (a bool counts as 0 or 1), else None."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return None


def _label(value: Any) -> str:
    return str(value)[:MAX_LABEL_CHARS]


def _items(mapping: Any) -> List:
    """The first ``MAX_KEYS`` ``(key, value)`` pairs of ``mapping`` by key (none if it is not one)."""
    if not isinstance(mapping, dict):
        return []
    return sorted(((_label(k), v) for k, v in mapping.items()), key=lambda kv: kv[0])[:MAX_KEYS]


class FleetCollector:
    """A ``prometheus_client`` collector: every scrape calls ``snapshot()`` once and yields the
    fleet's and the labelled devices' metric families."""

    def __init__(self, snapshot: Callable[[], Dict[str, Any]], max_device_labels: int):
        self._snapshot = snapshot
        self.max_device_labels = max_device_labels

    def describe(self) -> List[Metric]:
        """Nothing: registering the collector must not take a snapshot."""
        return []

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        yield from fleet_families(snap)
        yield from device_families(snap, self.max_device_labels)


def _gauge(name: str, doc: str, value: Any) -> Optional[GaugeMetricFamily]:
    number = _number(value)
    return None if number is None else GaugeMetricFamily(name, doc, value=number)


def fleet_families(snap: Dict[str, Any]) -> Iterator[Metric]:
    """The fleet-wide metric families of one snapshot."""
    info = GaugeMetricFamily("streamfl_run_info", "The coordinator's run: always 1, its labels say "
                             "which fleet, run and method", labels=["fleet", "run_id", "method", "strategy"])
    info.add_metric([_label(snap.get(k) or "") for k in ("fleet", "run_id", "method", "strategy")], 1.0)
    yield info
    for family in (
            _gauge("streamfl_uptime_seconds", "Seconds since the coordinator started", snap.get("time_s")),
            _gauge("streamfl_global_version", "Newest global model version", snap.get("version")),
            _gauge("streamfl_versions_per_second", "Global versions made per second, over the last ~30 s",
                   snap.get("versions_per_s")),
            _gauge("streamfl_accuracy", "Held-out accuracy (0-1) of the global model at "
                   "streamfl_eval_version", snap.get("accuracy")),
            _gauge("streamfl_loss", "Held-out loss of the global model at streamfl_eval_version",
                   snap.get("loss")),
            _gauge("streamfl_eval_version", "Global version the held-out evaluation last ran on",
                   snap.get("eval_version")),
            _gauge("streamfl_devices_online", "Devices online now", snap.get("devices_online")),
            _gauge("streamfl_devices_known", "Devices the coordinator knows", snap.get("devices_known")),
            _gauge("streamfl_devices_untracked", "Devices beyond the fleet table's max_devices, "
                   "counted only", snap.get("devices_untracked")),
            _gauge("streamfl_devices_offline", "Devices known to be offline now", snap.get("devices_offline")),
            _gauge("streamfl_devices_unknown", "Devices whose state is not known now (the coordinator "
                   "lost the broker, or their last will came with the broker's loss)",
                   snap.get("devices_unknown"))):
        if family is not None:
            yield family
    updates = snap.get("updates") if isinstance(snap.get("updates"), dict) else {}
    by_outcome = CounterMetricFamily("streamfl_updates", "Updates by what became of them",
                                     labels=["outcome"])
    for key, value in _items(updates):
        number = _number(value)
        if number is None:
            continue
        if key in NOT_OUTCOMES:
            yield CounterMetricFamily(NOT_OUTCOMES[key], "Updates %s" % key, value=number)
        else:
            by_outcome.add_metric([key], number)
    yield by_outcome
    rejected = CounterMetricFamily("streamfl_updates_rejected", "Rejected updates by reason",
                                   labels=["reason"])
    for key, value in _items(snap.get("rejected_by_reason")):
        number = _number(value)
        if number is not None:
            rejected.add_metric([key], number)
    yield rejected
    implausible = CounterMetricFamily("streamfl_device_reports_implausible",
                                      "Figures devices reported outside the plausible bounds "
                                      "(fleet_view), by what they were", labels=["what"])
    for key, value in _items(snap.get("implausible")):
        number = _number(value)
        if number is not None:
            implausible.add_metric([key], number)
    yield implausible
    yield from broker_families(snap.get("broker"))
    by_source = snap.get("energy_j_by_source")
    energy = CounterMetricFamily("streamfl_energy_joules", "Energy the fleet's devices reported, "
                                 "summed per source: measured by a meter, modelled, or unknown",
                                 labels=["source"])
    if isinstance(by_source, dict):
        for source in SOURCES:
            energy.add_metric([source], _number(by_source.get(source)) or 0.0)
    elif _number(snap.get("energy_j")) is not None:  # a snapshot that does not say: unknown
        energy.add_metric(["unknown"], _number(snap.get("energy_j")))
    yield energy
    power = GaugeMetricFamily("streamfl_fleet_power_watts", "Power of the devices online now, summed "
                              "per source (measured, modelled, unknown); offline devices, devices "
                              "whose state is unknown and devices without a meter count 0",
                              labels=["source"])
    by_source = snap.get("power_w_by_source")
    if not isinstance(by_source, dict):
        by_source = {}
        for d in _rows(snap):
            if row_state(d) == "online" and _number(d.get("power_w")) is not None:
                key = _source(d.get("power_source"))
                by_source[key] = by_source.get(key, 0.0) + _number(d.get("power_w"))
    for source in SOURCES:
        power.add_metric([source], _number(by_source.get(source)) or 0.0)
    yield power
    methods = GaugeMetricFamily("streamfl_method_value", "The methods' fleet-wide values that are "
                                "numbers (a flag's yes/no as 1/0)", labels=["method", "key"])
    for method, values in _items(snap.get("methods")):
        for key, value in _items(values):
            number = _number(value)
            if number is not None:
                methods.add_metric([method, key], number)
    yield methods


def broker_families(broker: Any) -> Iterator[Metric]:
    """The coordinator's own broker link: nothing when the snapshot does not say (a table no
    coordinator serves)."""
    if not isinstance(broker, dict):
        return
    connected = bool(broker.get("connected"))
    yield GaugeMetricFamily("streamfl_broker_connected", "1 while the coordinator is connected to "
                            "the broker; 0: it lost it (or never had it), and the device states "
                            "are unknown meanwhile", value=1.0 if connected else 0.0)
    disconnects = _number(broker.get("disconnects"))
    if disconnects is not None:
        yield CounterMetricFamily("streamfl_broker_disconnects", "Times the coordinator lost the broker",
                                  value=disconnects)
    since = _number(broker.get("since_wall_s"))
    if not connected and since is not None:
        yield GaugeMetricFamily("streamfl_broker_lost_since_timestamp_seconds", "When (Unix time) the "
                                "coordinator lost the broker, or started without it; only while it "
                                "is lost", value=since)


def _rows(snap: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The snapshot's device rows that are mappings with a device id, each id once."""
    seen = set()
    out = []
    for row in snap.get("devices") or ():
        if isinstance(row, dict) and row.get("device") is not None and row["device"] not in seen:
            seen.add(row["device"])
            out.append(row)
    return out


#: Per-device gauges: ``(name, help, the row's key)``.
DEVICE_GAUGES = (
    ("streamfl_device_online", "1 while the device is online", "online"),
    ("streamfl_device_last_seen_seconds", "Seconds since the device was last heard from", "last_seen_s"),
    ("streamfl_device_version", "Base version of the device's last update", "version"),
    ("streamfl_device_staleness_versions", "Staleness of the device's last update, in versions",
     "staleness"),
    ("streamfl_device_temperature_celsius", "The device's hottest thermal zone", "temperature_c"),
    ("streamfl_device_disk_free_bytes", "Bytes free to the agent on its state folder's filesystem",
     "disk_free_bytes"),
    ("streamfl_device_disk_size_bytes", "Size of the filesystem of the agent's state folder, in bytes",
     "disk_size_bytes"),
    ("streamfl_device_paused", "1 while the device is online and paused by an operator "
     "('streamfl operator pause'): it starts no round until 'resume'", "paused"),
    ("streamfl_device_buffer_fill_windows", "Windows in the device's training buffer", "buffer_fill"),
    ("streamfl_device_buffer_capacity_windows", "Capacity of the device's training buffer, in windows",
     "buffer_capacity"),
    ("streamfl_device_predictions_per_second", "Predictions the device made on live windows per second",
     "predictions_per_s"),
    ("streamfl_device_prediction_confidence", "Confidence of the device's latest prediction (0-1)",
     "prediction_confidence"),
)
#: Per-device counters: ``(name without _total, help, the row's key)``.
DEVICE_COUNTERS = (
    ("streamfl_device_rounds", "Local training rounds the device reported", "rounds"),
    ("streamfl_device_energy_joules", "Energy the device reported using", "energy_j"),
    ("streamfl_device_predictions_dropped", "Predictions the device dropped (queue full)",
     "predictions_dropped"),
)


def device_families(snap: Dict[str, Any], max_device_labels: int) -> Iterator[Metric]:
    """The per-device metric families of the first ``max_device_labels`` devices of ``snap``."""
    rows = _rows(snap)
    labelled = rows[:max_device_labels]
    total = _number(snap.get("devices_total"))
    unlabelled = max(len(rows), int(total) if total is not None else 0) - len(labelled)
    yield GaugeMetricFamily("streamfl_devices_unlabelled", "Devices counted in the fleet totals "
                            "only, beyond monitor.max_device_labels (or the snapshot's rows)",
                            value=float(unlabelled))
    info = GaugeMetricFamily("streamfl_device_info", "Always 1; the labels say the device's board and "
                             "software", labels=["device", "board", "software"])
    for row in labelled:
        info.add_metric([_label(row["device"]), _label(row.get("board") or ""),
                         _label(row.get("software") or "")], 1.0)
    yield info
    live = [row for row in labelled if row_state(row) == "online"]
    for name, doc, key in DEVICE_GAUGES:
        rows_for = labelled
        if key == "online":
            rows_for = [row for row in labelled if row_state(row) != "unknown"]
        elif key in LIVE_ONLY:
            rows_for = live
        yield _per_device(GaugeMetricFamily(name, doc, labels=["device"]), rows_for, key)
    power = GaugeMetricFamily("streamfl_device_power_watts", "The device's power draw now (boards "
                              "with a meter, online ones), ``source`` measured or modelled",
                              labels=["device", "source"])
    for row in live:
        number = _number(row.get("power_w"))
        if number is not None:
            power.add_metric([_label(row["device"]), _source(row.get("power_source"))], number)
    yield power
    for name, doc, key in DEVICE_COUNTERS:
        yield _per_device(CounterMetricFamily(name, doc, labels=["device"]), labelled, key)
    yield _per_device_keyed(CounterMetricFamily(
        "streamfl_device_energy_by_source_joules", "The device's reported energy per source "
        "(measured, modelled, unknown)", labels=["device", "source"]), labelled, "energy_j_by_source")
    yield _per_device_keyed(CounterMetricFamily(
        "streamfl_device_updates", "The device's updates: accepted, clipped, rejected",
        labels=["device", "outcome"]), labelled, "updates")
    yield _per_device_keyed(CounterMetricFamily(
        "streamfl_device_updates_rejected", "The device's rejected updates by reason",
        labels=["device", "reason"]), labelled, "rejected_by_reason")
    yield _per_device_keyed(GaugeMetricFamily(
        "streamfl_device_clock_hertz", "The device's clock per domain (cpu, gpu, ...)",
        labels=["device", "domain"]), live, "clocks_mhz", scale=1e6)
    methods = GaugeMetricFamily("streamfl_device_method_value", "The methods' per-device values "
                                "that are numbers", labels=["device", "method", "key"])
    for row in labelled:
        for method, values in _items(row.get("methods")):
            for key, value in _items(values):
                number = _number(value)
                if number is not None:
                    methods.add_metric([_label(row["device"]), method, key], number)
    yield methods


def _per_device(family: Metric, rows: Sequence[Dict[str, Any]], key: str) -> Metric:
    for row in rows:
        number = _number(row.get(key))
        if number is not None:
            family.add_metric([_label(row["device"])], number)
    return family


def _per_device_keyed(family: Metric, rows: Sequence[Dict[str, Any]], key: str,
                      scale: float = 1.0) -> Metric:
    for row in rows:
        for sub, value in _items(row.get(key)):
            number = _number(value)
            if number is not None:
                family.add_metric([_label(row["device"]), sub],
                                  number * scale if math.isfinite(number) else number)
    return family


class Exporter:
    """The registry behind /metrics: one ``FleetCollector`` on a ``CollectorRegistry`` of its own
    (not the process-wide default, so nothing else in the process adds series)."""

    def __init__(self, snapshot: Callable[[], Dict[str, Any]], max_device_labels: int):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(FleetCollector(snapshot, max_device_labels))

    def render(self) -> bytes:
        """One scrape in the text format."""
        return generate_latest(self.registry)


def render(snap: Dict[str, Any], max_device_labels: int) -> bytes:
    """``snap`` in Prometheus' text format (a registry made for this one snapshot)."""
    return Exporter(lambda: snap, max_device_labels).render()
