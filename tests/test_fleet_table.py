"""The live fleet table (coordinator/fleet.py): rows from hellos, wills, telemetry and update fates,
bounds on what devices claim, its series, and the run summary the coordinator writes at stop; then
the same through a real broker, with a device that sends implausible figures."""
import json
import math

import pytest

from factories import SPEC, UNBOUNDED_ADMISSION, make_hello, make_update
from polling import wait_until
from streamfl.cli import main as streamfl_main
from streamfl.config import build
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.fleet import FleetTable, FleetTableConfig, method_name, status_result
from streamfl.coordinator.metrics import read_metrics
from streamfl.coordinator.plugins.base import MethodState
from streamfl.coordinator.registry import DeviceRegistry
from streamfl.coordinator.run_summary import summary_lines
from streamfl.coordinator.server import CoordinatorServer
from streamfl.protocol.codec import encode
from streamfl.protocol.messages import Offline, Telemetry
from streamfl.protocol.topics import Topics
from streamfl.protocol.transport.base import MqttSettings
from streamfl.protocol.transport.paho import PahoTransport


def _telemetry(device_id, **kw):
    fields = dict(device_id=device_id, time_s=1.0, buffer_fill=10, buffer_capacity=20, rounds=3,
                  power_w=4.5, clocks_khz={"cpu": 1500000, "gpu": 624750},
                  temperatures_c={"cpu": 48.0, "gpu": 51.5})
    fields.update(kw)
    return Telemetry(**fields)


def _update_event(device, outcome="aggregated", **kw):
    event = {"event": "update", "device": device, "outcome": outcome, "base_version": 4,
             "staleness": 1, "energy_j": 12.5}
    event.update(kw)
    return event


def _table(**kw):
    return FleetTable(FleetTableConfig(**kw), "lab", "fedasync+clp", "fedasync", ["clp"])


def test_rows_come_from_hellos_telemetry_and_update_fates():
    table, registry = _table(), DeviceRegistry()
    registry.on_hello(make_hello("pi-1", board="raspberry-pi-4"), 0.0)
    registry.on_hello(make_hello("orin-1", board="jetson-orin-nano"), 0.0)
    assert table.on_message(make_hello("pi-1", board="raspberry-pi-4"), 0.0)[0]["event"] == "device"
    table.on_message(_telemetry("pi-1"), 1.0)
    table.on_record(_update_event("pi-1"), 2.0)
    table.on_record(_update_event("pi-1", outcome="rejected", reason="norm", energy_j=99.0), 2.5)
    table.on_record(_update_event("pi-1", outcome="duplicate"), 2.6)
    table.on_record(_update_event("pi-1", clipped=True, staleness=3, base_version=6), 3.0)
    registry.on_offline(Offline("orin-1", reason="lost"), 3.0)
    table.on_eval(7, 0.625, 1.1, 3.5)
    snap = table.refresh(now=4.0, t_s=4.0, version=7, devices=registry.devices(),
                         methods={"clp": MethodState(fleet={"flag": "critical"},
                                                     devices={"pi-1": {"lr": 0.01}})})
    assert snap["version"] == 7 and snap["accuracy"] == 0.625 and snap["eval_version"] == 7
    assert snap["devices_online"] == 1 and snap["devices_known"] == 2
    assert snap["updates"] == {"aggregated": 2, "buffered": 0, "stale": 0, "duplicate": 1,
                               "rejected": 1, "withheld": 0, "received": 4, "clipped": 1}
    assert snap["rejected_by_reason"] == {"norm": 1}
    assert snap["methods"] == {"clp": {"flag": "critical"}}
    pi, orin = snap["devices"]  # online first
    assert pi["device"] == "pi-1" and pi["online"] and pi["board"] == "raspberry-pi-4"
    assert pi["clocks_mhz"] == {"cpu": 1500.0, "gpu": 624.75} and pi["power_w"] == 4.5
    assert pi["temperature_c"] == 51.5 and (pi["buffer_fill"], pi["buffer_capacity"]) == (10, 20)
    assert pi["version"] == 6 and pi["staleness"] == 3 and pi["rounds"] == 3
    assert pi["updates"] == {"accepted": 2, "clipped": 1, "rejected": 1, "duplicate": 1}
    assert pi["rejected_by_reason"] == {"norm": 1}
    assert pi["energy_j"] == 25.0  # the rejected and the duplicate rounds cost nothing counted
    assert pi["methods"] == {"clp": {"lr": 0.01}}
    assert orin["device"] == "orin-1" and not orin["online"] and orin["offline_reason"] == "lost"
    assert orin["board"] == "jetson-orin-nano" and orin["methods"] == {}
    assert snap["energy_j"] == 25.0
    json.dumps(snap, allow_nan=False)  # the API serves it as strict JSON


def test_implausible_figures_are_unknown_and_never_summed():
    table = _table()
    table.on_message(_telemetry("evil", power_w=1e30, clocks_khz={"cpu": 10 ** 15},
                                temperatures_c={"cpu": 5000.0, "soc": -1e9}), 1.0)
    table.on_record(_update_event("evil", energy_j=1e300), 1.0)
    table.on_record(_update_event("evil", energy_j=-5.0), 1.0)
    table.on_record(_update_event("good", energy_j=3.0), 1.0)
    snap = table.refresh(1.0, 1.0, 2, {}, {})
    evil = next(r for r in snap["devices"] if r["device"] == "evil")
    assert evil["power_w"] is None and evil["clocks_mhz"] == {} and evil["temperature_c"] is None
    assert evil["energy_j"] == 0.0 and snap["energy_j"] == 3.0
    assert snap["implausible"] == {"clock": 1, "energy_j": 2, "power_w": 1, "temperature_c": 2}
    assert table.figures()["energy_j"] == 3.0


def test_the_table_its_rows_and_its_series_are_bounded():
    table = _table(max_devices=5, max_rows=3, series_points=10, max_clock_series=2,
                   series_every_s=0.1)
    for i in range(20):
        table.on_message(_telemetry("d%02d" % i), float(i))
        table.on_record(_update_event("d%02d" % i), float(i))
    for i in range(50):
        table.on_eval(i, 0.5, 1.0, float(i))
        table.refresh(float(i), float(i), i, {}, {})
    snap = table.snapshot()
    assert snap["devices_total"] == 5 and snap["devices_shown"] == 3 and len(snap["devices"]) == 3
    assert snap["devices_untracked"] == 30  # 15 devices past the bound, twice each
    series = table.series()
    assert len(series["accuracy"]) == 10 and len(series["versions"]) == 10
    assert len(series["clocks_mhz"]) == 2
    assert table.series(since_s=45.0)["accuracy"] == [[float(i), i, 0.5] for i in range(46, 50)]


def test_method_state_is_trimmed_to_plain_short_values():
    table = _table()
    table.on_record(_update_event("a"), 0.0)
    many = {"k%d" % i: i for i in range(20)}
    snap = table.refresh(0.0, 0.0, 1, {}, {"m": MethodState(
        fleet=dict(many, k0=float("nan"), k1="x" * 500, k2=[1, 2]), devices={"a": many, "ghost": many})})
    assert len(snap["methods"]["m"]) == 8 and snap["methods"]["m"]["k0"] is None
    assert len(snap["methods"]["m"]["k1"]) == 80 and snap["methods"]["m"]["k2"] == "[1, 2]"
    assert [r["device"] for r in snap["devices"]] == ["a"]  # describe() adds no rows


def test_prediction_figures_reach_the_row_bounded():
    table = _table()
    table.on_message(_telemetry("a", predictions_per_s=1.5, prediction_confidence=0.8,
                                predictions_dropped=2), 0.0)
    table.on_message(_telemetry("b", predictions_per_s=1e12, prediction_confidence=7.0), 0.0)
    rows = {r["device"]: r for r in table.refresh(0.0, 0.0, 1, {}, {})["devices"]}
    assert (rows["a"]["predictions_per_s"], rows["a"]["prediction_confidence"]) == (1.5, 0.8)
    assert rows["a"]["predictions_dropped"] == 2
    assert rows["b"]["predictions_per_s"] is None and rows["b"]["prediction_confidence"] is None
    assert table.snapshot()["implausible"] == {"prediction_confidence": 1, "predictions_per_s": 1}


def test_telemetry_reaches_metrics_downsampled():
    table = _table(telemetry_metrics_every_s=30.0)
    lines = [line for t in range(0, 100, 5) for line in table.on_message(_telemetry("a"), float(t))]
    assert [line["event"] for line in lines] == ["telemetry"] * 4  # t = 0, 30, 60, 90
    assert lines[0]["clocks_mhz"] == {"cpu": 1500.0, "gpu": 624.75} and lines[0]["power_w"] == 4.5
    assert _table(telemetry_metrics_every_s=0.0).on_message(_telemetry("a"), 0.0) == []


def test_method_name_and_status_result():
    config = CoordinatorConfig(plugins={"clp": {}, "balance": {}})
    assert method_name(config) == "fedasync+clp+balance"
    table = _table()
    for d in ("a", "b", "c"):
        table.on_record(_update_event(d), 0.0)
    result = status_result(table.refresh(0.0, 0.0, 1, {}, {}), rows=2)
    assert result["devices_shown"] == 2 and result["devices_total"] == 3
    assert set(result["devices"][0]) == {"device", "online", "state", "last_seen_s", "board", "version",
                                         "staleness", "rounds", "updates", "power_w", "power_source",
                                         "energy_j", "temperature_c", "buffer_fill", "paused",
                                         "predictions_per_s", "prediction_confidence", "methods"}


# ---- what is known now: the broker link, offline devices, modelled watts ----------------------

class Wall:
    """A wall clock the test moves."""

    def __init__(self, t: float = 1_800_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _served_table(wall, **kw):
    table = FleetTable(FleetTableConfig(**kw), "lab", "fedasync", "fedasync", [], wall_clock=wall)
    table.served_by("/runs/r1")
    return table


def _greet(table, registry, device_id, now):
    hello = make_hello(device_id)
    registry.on_hello(hello, now)
    table.on_message(hello, now)


def test_a_lost_broker_is_in_the_snapshot_and_makes_device_states_unknown_not_offline():
    wall, registry = Wall(), DeviceRegistry()
    table = _served_table(wall, broker_will_window_s=5.0, rejoin_wait_s=60.0)
    snap = table.refresh(0.0, 0.0, 0, registry.devices(), {})
    assert snap["broker"]["connected"] is False and snap["broker"]["reason"] == "not connected yet"
    assert snap["coordinator"]["run_dir"] == "/runs/r1" and snap["coordinator"]["pid"] > 0
    table.on_broker(True)
    for d in ("a", "b", "c"):
        _greet(table, registry, d, 1.0)
        table.on_message(_telemetry(d, power_measured=True, power_meter="ina3221-hwmon"), 1.0)
    # c's board really died long before the outage: its will is believed.
    registry.on_offline(Offline("c"), 2.0)
    table.on_message(Offline("c"), 2.0)
    wall.t += 100
    # The broker stops: it sends every client's will first (mosquitto does), then drops us.
    for d in ("a", "b"):
        registry.on_offline(Offline(d), 3.0)
        table.on_message(Offline(d), 3.0)
    wall.t += 1
    table.on_broker(False, "connection lost")
    wall.t += 30
    snap = table.refresh(40.0, 40.0, 5, registry.devices(), {})
    assert snap["broker"] == {"connected": False, "since_wall_s": 1_800_000_101.0, "disconnects": 1,
                              "connects": 1, "reason": "connection lost"}
    states = {r["device"]: r["state"] for r in snap["devices"]}
    assert states == {"a": "unknown", "b": "unknown", "c": "unknown"}  # nothing is news now
    assert (snap["devices_online"], snap["devices_unknown"], snap["devices_offline"]) == (0, 3, 0)
    assert all(not r["online"] and r["power_w"] is None and r["clocks_mhz"] == {} for r in snap["devices"])
    a = next(r for r in snap["devices"] if r["device"] == "a")
    assert a["last_heard"]["power_w"] == 4.5 and a["last_seen_s"] == 39.0
    assert snap["power_w_by_source"] == {"measured": 0.0, "modelled": 0.0, "unknown": 0.0}
    # Back on the broker: a says hello again; b's will came with the loss, so b is unknown while
    # it may still be reconnecting, then offline; c's will came before: offline all along.
    wall.t += 10
    table.on_broker(True)
    _greet(table, registry, "a", 50.0)
    states = {r["device"]: r["state"] for r in table.refresh(50.0, 50.0, 5, registry.devices(), {})["devices"]}
    assert states == {"a": "online", "b": "unknown", "c": "offline"}
    assert table.snapshot()["broker"]["connected"] and table.snapshot()["broker"]["disconnects"] == 1
    wall.t += 61
    states = {r["device"]: r["state"] for r in table.refresh(111.0, 111.0, 5, registry.devices(), {})["devices"]}
    assert states == {"a": "online", "b": "offline", "c": "offline"}


def test_offline_devices_leave_the_fleet_power_and_show_no_current_figures():
    wall, registry = Wall(), DeviceRegistry()
    table = _served_table(wall)
    table.on_broker(True)
    for d, watts in (("alive", 4.5), ("dead", 2.7)):
        _greet(table, registry, d, 0.0)
        table.on_message(_telemetry(d, power_w=watts, power_measured=True, power_meter="ina3221-iio"), 1.0)
    snap = table.refresh(1.0, 1.0, 1, registry.devices(), {})
    assert snap["power_w_by_source"]["measured"] == pytest.approx(7.2)
    registry.on_offline(Offline("dead"), 2.0)
    table.on_message(Offline("dead"), 2.0)
    snap = table.refresh(3.0, 3.0, 1, registry.devices(), {})
    assert snap["power_w_by_source"] == {"measured": 4.5, "modelled": 0.0, "unknown": 0.0}
    assert snap["devices_powered_by_source"] == {"measured": 1, "modelled": 0, "unknown": 0}
    dead = next(r for r in snap["devices"] if r["device"] == "dead")
    assert dead["state"] == "offline" and dead["power_w"] is None and dead["temperature_c"] is None
    assert dead["clocks_mhz"] == {} and dead["last_heard"]["power_w"] == 2.7
    assert dead["last_heard"]["clocks_mhz"] == {"cpu": 1500.0, "gpu": 624.75}


def test_modelled_watts_are_told_apart_from_measured_ones():
    table, registry = _table(), DeviceRegistry()
    for d, meter, measured in (("orin", "ina3221-hwmon", True), ("nano", "modeled", False),
                               ("liar", "modeled", True), ("old-agent", "", None)):
        registry.on_hello(make_hello(d), 0.0)
        table.on_message(_telemetry(d, power_w=5.0, power_meter=meter, power_measured=measured), 1.0)
        table.on_record(_update_event(d, energy_j=10.0), 2.0)
    snap = table.refresh(3.0, 3.0, 4, registry.devices(), {})
    sources = {r["device"]: r["power_source"] for r in snap["devices"]}
    assert sources == {"orin": "measured", "nano": "modelled", "liar": "modelled", "old-agent": "unknown"}
    assert snap["power_w_by_source"] == {"measured": 5.0, "modelled": 10.0, "unknown": 5.0}
    assert snap["energy_j_by_source"] == {"measured": 10.0, "modelled": 20.0, "unknown": 10.0}
    assert table.figures()["energy_j_by_source"] == {"measured": 10.0, "modelled": 20.0, "unknown": 10.0}
    assert snap["energy_j"] == 40.0
    assert table.series()["energy_j"][-1] == [3.0, 40.0, 10.0, 20.0, 10.0]  # the chart's sources apart
    nano = next(r for r in snap["devices"] if r["device"] == "nano")
    assert nano["power_meter"] == "modeled" and nano["energy_j_by_source"] == {"modelled": 10.0}
    # The update's line in metrics.jsonl says where its energy came from, and counts there when an
    # earlier process's line is read back (the run's record), whatever the device says now.
    line = _update_event("nano", energy_j=1.0)
    table.on_record(line, 4.0)
    assert line["energy_source"] == "modelled"
    again = _table()
    again.on_record(line, 0.0)
    assert again.figures()["energy_j_by_source"] == {"measured": 0.0, "modelled": 1.0, "unknown": 0.0}
    # The telemetry line in metrics.jsonl says it too.
    line, = _table().on_message(_telemetry("nano", power_meter="modeled", power_measured=False), 0.0)
    assert line["power_source"] == "modelled" and line["power_meter"] == "modeled"


# ---- through a real broker ----------------------------------------------------------------------

FLEET = "fv"
TOPICS = Topics(FLEET)


def _settings(broker, client_id, **kw):
    kw.setdefault("persistent_session", False)
    return MqttSettings(host=broker.host, port=broker.port, client_id=client_id,
                        reconnect_min_s=0.2, reconnect_max_s=1.0, **kw)


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_a_real_run_gets_its_summary_its_report_and_a_hostile_device_moves_no_total(mqtt_broker, tmp_path,
                                                                                    caplog):
    config = build(CoordinatorConfig, {
        "fleet": FLEET, "model": SPEC, "persist_interval_s": 0.0, "admission": UNBOUNDED_ADMISSION,
        "monitor": {"enabled": False}, "fleet_view": {"telemetry_metrics_every_s": 0.5}}, "test")
    server = CoordinatorServer(config, PahoTransport(_settings(mqtt_broker, "coordinator-fv")),
                               tmp_path / "state", tmp_path / "run")
    client = PahoTransport(_settings(mqtt_broker, "devices"))
    client.connect()
    server.start()
    try:
        wait_until(lambda: client.connected and server.transport.connected, 10, "both connected")

        def send(device_id, kind, msg):
            probe = client.publish_tracked(TOPICS.device(device_id, kind), encode(msg), qos=1)
            wait_until(probe, 10, "the broker's acknowledgement")

        for d in ("honest", "hostile"):
            send(d, "status", make_hello(d))
        wait_until(lambda: set(server.core.online()) == {"honest", "hostile"}, 10, "both greeted")
        send("honest", "telemetry", _telemetry("honest"))
        send("hostile", "telemetry", _telemetry("hostile", power_w=1e300, temperatures_c={"x": 1e9}))
        send("honest", "update", make_update(SPEC, 0.5, device_id="honest", energy_j=20.0))
        send("hostile", "update", make_update(SPEC, 0.5, device_id="hostile", energy_j=1e200))
        send("hostile", "update", make_update(SPEC, 0.5, device_id="hostile", energy_j=-1.0))
        wait_until(lambda: server.core.counters["updates_received"] == 3, 10, "three updates")
        wait_until(lambda: len(server.fleet.snapshot()["devices"]) == 2
                   and server.fleet.snapshot()["updates"]["received"] == 3, 10, "the table refreshed")
        snap = server.fleet.snapshot()
        assert snap["energy_j"] == 20.0 and snap["implausible"]["energy_j"] == 2
        hostile = next(r for r in snap["devices"] if r["device"] == "hostile")
        assert hostile["power_w"] is None and hostile["temperature_c"] is None
    finally:
        server.stop()
        client.close()
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    (method, entry), = summary["methods"].items()
    assert method == "fedasync" and summary["kind"] == "fleet"
    run_figures = entry["runs"][0]
    assert run_figures["updates"] == 3 and run_figures["energy_j"] == 20.0
    assert run_figures["energy_j_per_device"] == {"honest": 20.0, "hostile": 0.0}
    assert sum(run_figures["updates_by_outcome"].values()) == run_figures["updates"]
    lines = [line for line in read_metrics(run / "metrics.jsonl", strict=True)]
    assert all(line["method"] == "fedasync" and line["seed"] == 0 for line in lines)
    assert {"device", "telemetry", "update"} <= {line["event"] for line in lines}
    # The stop summary is readable text, every update accounted for.
    text = "\n".join(summary_lines(summary))
    assert "updates: 3 received; 3 merged into a new version" in text, text
    assert any("coordinator stopped at version 3\n" in r.getMessage() for r in caplog.records)
    # streamfl report reads a real run's folder.
    assert streamfl_main(["report", str(run), "--markdown"]) == 0
    assert streamfl_main(["report", str(run)]) == 0 and (run / "report.html").is_file()
    assert not math.isnan(summary["duration_s"])
