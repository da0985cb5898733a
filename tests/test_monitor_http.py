"""The fleet view's HTTP server on a real socket: its routes, the token, read-only methods, a taken
port (moved elsewhere and said, or refused with exit 2), monitor.url in a fresh run folder, bounded
requests, and /metrics as Prometheus' own parser reads it (label bounds with a thousand devices,
every metric the shipped Grafana dashboard asks for, modelled watts labelled, offline devices'
gauges gone); then a real coordinator over real mosquitto through a broker outage."""
import http.client
import json
import logging
import re
import select
import subprocess
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from factories import SPEC, UNBOUNDED_ADMISSION, make_hello
from fleet_snapshots import GrowingFleet, snapshot
from polling import wait_until
from source_tree import ROOT
from streamfl.cli import main as streamfl_main
from streamfl.config import build
from streamfl.coordinator.config import CoordinatorConfig, load_config
from streamfl.coordinator.fleet import FleetTable, FleetTableConfig
from streamfl.coordinator.monitor.config import MonitorConfig
from streamfl.coordinator.monitor.http import URL_FILE, MonitorServer
from streamfl.coordinator.monitor.prometheus import render
from streamfl.coordinator.registry import DeviceRegistry
from streamfl.coordinator.server import CoordinatorServer
from streamfl.errors import ConfigError, StartupError
from streamfl.protocol.codec import encode
from streamfl.protocol.messages import Offline, Telemetry
from streamfl.protocol.topics import Topics
from streamfl.protocol.transport.base import MqttSettings
from streamfl.protocol.transport.paho import PahoTransport

prometheus_parser = pytest.importorskip("prometheus_client.parser")

GRAFANA = ROOT / "configs" / "grafana" / "streamfl-fleet.json"


class Served:
    """A started MonitorServer and what it was asked."""

    def __init__(self, server: MonitorServer, url: str, since: List[float]):
        self.server, self.url, self.since = server, url, since
        host, port = server._server.server_address[:2]
        self.host, self.port = host, port

    def get(self, path: str, headers: Optional[Dict[str, str]] = None) -> Tuple[int, Dict[str, str], bytes]:
        return self.request("GET", path, headers)

    def request(self, method: str, path: str, headers: Optional[Dict[str, str]] = None
                ) -> Tuple[int, Dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            conn.request(method, path, headers=headers or {})
            answer = conn.getresponse()
            return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
        finally:
            conn.close()


@pytest.fixture
def serve(tmp_path):
    started: List[MonitorServer] = []

    def make(snap_fn=None, series_fn=None, **config: Any) -> Served:
        since: List[float] = []
        fleet = snapshot(3)

        def series(s: float) -> Dict[str, Any]:
            since.append(s)
            return {"time_s": 5.0, "accuracy": [[t, 1, 0.5] for t in (1.0, 2.0, 3.0) if t > s],
                    "versions": [], "energy_j": [], "clocks_mhz": {}, "events": []}
        server = MonitorServer(MonitorConfig(**dict({"port": 0}, **config)), snap_fn or (lambda: fleet),
                               series_fn or series, run_dir=tmp_path)
        url = server.start()
        assert url is not None
        started.append(server)
        return Served(server, url, since)
    yield make
    for server in started:
        server.stop()


def test_the_routes_answer_with_the_page_the_snapshot_and_the_series(serve, tmp_path):
    served = serve()
    assert (tmp_path / URL_FILE).read_text().strip() == served.url
    assert served.url == "http://127.0.0.1:%d/" % served.port
    status, headers, body = served.get("/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert b'src="static/dashboard.js"' in body and b"<canvas" in body
    assert "script-src 'self'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"
    for name, kind in (("dashboard.js", "text/javascript"), ("dashboard.css", "text/css")):
        status, headers, body = served.get("/static/" + name)
        assert status == 200 and headers["content-type"].startswith(kind) and len(body) > 1000
    status, headers, body = served.get("/api/fleet")
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(body) == dict(snapshot(3), monitor={"url": served.url, "port": 0, "port_taken": False})
    status, _, body = served.get("/api/series?since=1.5")
    assert status == 200 and [p[0] for p in json.loads(body)["accuracy"]] == [2.0, 3.0]
    assert served.get("/api/series")[0] == 200
    assert served.since == [1.5, 0.0]
    for bad in ("abc", "nan", "inf", "1e999"):
        status, _, body = served.get("/api/series?since=" + bad)
        assert status == 400 and "since" in json.loads(body)["error"]
    assert served.get("/healthz")[:3:2] == (200, b"ok\n")
    assert served.get("/nothing-here")[0] == 404
    # No way out of static/: only the shipped files by bare name.
    for path in ("/static/../http.py", "/static/%2e%2e/http.py", "/static/http.py", "/static/"):
        assert served.get(path)[0] == 404, path
    status, headers, body = served.request("HEAD", "/api/fleet")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 100
    served.server.stop()
    assert not (tmp_path / URL_FILE).exists()
    with pytest.raises(OSError):
        socket.create_connection((served.host, served.port), timeout=2).close()


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "FROB"])
def test_it_is_read_only(serve, method):
    served = serve()
    for path in ("/", "/api/fleet", "/metrics"):
        status, headers, _ = served.request(method, path)
        assert status == 405 and headers["allow"] == "GET, HEAD"


def test_a_token_is_needed_for_every_route_with_fleet_data(serve, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\nignored second line\n")
    served = serve(token_file=str(token_file))
    for path in ("/", "/api/fleet", "/api/series?since=0", "/metrics"):
        status, headers, body = served.get(path)
        assert status == 401 and headers["www-authenticate"].startswith("Bearer"), path
        assert b"token" in body
        assert served.get(path, {"Authorization": "Bearer wrong"})[0] == 401
        assert served.get(path + ("&" if "?" in path else "?") + "token=s3cret-toke")[0] == 401
        assert served.get(path, {"Authorization": "Bearer s3cret-token"})[0] == 200, path
        assert served.get(path + ("&" if "?" in path else "?") + "token=s3cret-token")[0] == 200
    # No fleet data there: the health check and the page's own files.
    assert served.get("/healthz")[0] == 200
    assert served.get("/static/dashboard.js")[0] == 200


def test_an_unreadable_token_file_is_a_configuration_error(tmp_path):
    with pytest.raises(ValueError, match="token_file .*cannot read"):
        MonitorConfig(token_file=str(tmp_path / "missing"))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        MonitorConfig(token_file=str(tmp_path / "empty"))
    yaml_path = tmp_path / "coordinator.yaml"
    yaml_path.write_text("monitor:\n  port: 0\n  token_file: %s\n" % (tmp_path / "missing"))
    with pytest.raises(ConfigError, match="monitor"):
        load_config(yaml_path)
    yaml_path.write_text("monitor:\n  port: 0\n  host: 0.0.0.0\n  max_device_labels: 7\n")
    config = load_config(yaml_path).monitor
    assert (config.port, config.host, config.max_device_labels) == (0, "0.0.0.0", 7)
    assert load_config().monitor == MonitorConfig()
    assert MonitorConfig().host == "127.0.0.1"
    # A token file that vanished after loading: no server rather than one without the token.
    (tmp_path / "token").write_text("t\n")
    config = MonitorConfig(port=0, token_file=str(tmp_path / "token"))
    (tmp_path / "token").unlink()
    server = MonitorServer(config, lambda: {}, lambda s: {}, tmp_path)
    assert server.start() is None and not (tmp_path / URL_FILE).exists()


@pytest.fixture
def taken_port():
    """A port some other process listens on."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        yield taken.getsockname()[1]
    finally:
        taken.close()


def test_a_taken_port_is_never_silent_the_view_listens_elsewhere_and_says_where(tmp_path, caplog, taken_port):
    run_dir = tmp_path / "a" / "fresh" / "run"  # a new run folder: nothing made it yet
    server = MonitorServer(MonitorConfig(port=taken_port), lambda: snapshot(1), lambda s: {}, run_dir)
    with caplog.at_level(logging.WARNING, logger="streamfl.coordinator.monitor.http"):
        url = server.start()
    try:
        assert url is not None and ":%d/" % taken_port not in url
        assert (run_dir / URL_FILE).read_text().strip() == url  # written where it really listens
        assert any(r.levelno == logging.ERROR and "port %d (monitor.port) is taken" % taken_port
                   in r.getMessage() and url in r.getMessage() for r in caplog.records)
        with urllib.request.urlopen(url + "api/fleet", timeout=10) as answer:
            fleet = json.loads(answer.read())
        assert fleet["monitor"] == {"url": url, "port": taken_port, "port_taken": True}
    finally:
        server.stop()
    assert not (run_dir / URL_FILE).exists()


def test_a_taken_port_with_if_port_taken_exit_is_refused(tmp_path, taken_port):
    server = MonitorServer(MonitorConfig(port=taken_port, if_port_taken="exit"), lambda: snapshot(1),
                           lambda s: {}, tmp_path)
    with pytest.raises(StartupError, match=r"port 127\.0\.0\.1:%d is taken \(monitor\.port" % taken_port) as caught:
        server.start()
    assert caught.value.exit_code == 2 and "monitor.if_port_taken" in str(caught.value)
    assert not (tmp_path / URL_FILE).exists()
    server.stop()  # nothing to stop: no error
    with pytest.raises(ValueError, match="monitor.if_port_taken must be one of any_free, exit"):
        MonitorConfig(if_port_taken="retry")
    # Not a taken port but an address that is not this machine's: no other port would help.
    with pytest.raises(StartupError, match="monitor.host and monitor.port"):
        MonitorServer(MonitorConfig(host="192.0.2.1", port=0), lambda: {}, lambda s: {}, tmp_path).bind()


@pytest.mark.timeout(120)
def test_the_coordinator_command_exits_2_naming_the_taken_port(tmp_path, taken_port):
    """The real ``streamfl-coordinator`` with monitor.if_port_taken: exit, before it touches the
    broker (none listens at --port: it never gets that far)."""
    config = tmp_path / "coordinator.yaml"
    config.write_text("fleet: portcheck\nmonitor:\n  port: %d\n  if_port_taken: exit\n" % taken_port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nobody = s.getsockname()[1]
    proc = subprocess.run([sys.executable, "-m", "streamfl.coordinator", "--config", str(config),
                           "--broker", "127.0.0.1", "--port", str(nobody), "--state-dir",
                           str(tmp_path / "state"), "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=100, cwd=str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert "127.0.0.1:%d is taken (monitor.port" % taken_port in proc.stderr
    assert not (tmp_path / "run" / URL_FILE).exists() and not (tmp_path / "run" / "summary.json").exists()


def test_monitor_url_is_written_into_a_new_run_folder(tmp_path):
    run_dir = tmp_path / "runs" / "20260101-000000"
    server = MonitorServer(MonitorConfig(port=0), lambda: snapshot(1), lambda s: {}, run_dir)
    try:
        url = server.start()
        assert (run_dir / URL_FILE).read_text() == url + "\n"
    finally:
        server.stop()


def test_requests_are_bounded(serve):
    served = serve(max_connections=1, request_timeout_s=2.0)
    assert served.get("/" + "a" * 3000)[0] == 414
    # A client that connects and says nothing holds the one slot until its timeout, no longer.
    # Polled, not slept: on a busy machine the server may accept the idle connection after the
    # first probe, which then still gets the slot; and the thread of the request before may not
    # have given the slot back yet, so the idle connection itself is turned away with a 503 (it
    # becomes readable) and is opened again.
    idle = None
    deadline = time.monotonic() + 10
    try:
        while True:
            assert time.monotonic() < deadline, "the idle connection never held the slot"
            if idle is None:
                idle = socket.create_connection((served.host, served.port), timeout=5)
            probe = served.get("/healthz")[0]
            # The server answers connections in order, so a turn-away of the idle connection has
            # arrived by the time the probe's answer has.
            if select.select([idle], [], [], 0)[0]:  # turned away or timed out: try again
                idle.close()
                idle = None
            elif probe == 503:
                break
            time.sleep(0.05)
        deadline = time.monotonic() + 6
        while served.get("/healthz")[0] != 200:
            assert time.monotonic() < deadline, "the idle connection was never timed out"
            time.sleep(0.1)
        assert idle.recv(1024) == b""  # the server closed it
    finally:
        if idle is not None:
            idle.close()


def test_a_failing_snapshot_is_a_500_and_the_server_goes_on(serve, caplog):
    calls = []

    def flaky() -> Dict[str, Any]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("table not ready")
        return {"version": float("nan"), "devices": []}
    served = serve(snap_fn=flaky)
    assert served.get("/api/fleet")[0] == 500
    assert "table not ready" in caplog.text
    status, _, body = served.get("/api/fleet")
    assert status == 200 and json.loads(body)["version"] is None  # strict JSON
    assert json.loads(body)["devices"] == []


def _families(text: str) -> Dict[str, Any]:
    return {f.name: f for f in prometheus_parser.text_string_to_metric_families(text)}


def _samples(family) -> Dict[Tuple, float]:
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples
            if not s.name.endswith("_created")}


def test_metrics_parse_and_say_what_the_snapshot_says(serve):
    snap = snapshot(4, version=42, online=3)
    served = serve(snap_fn=lambda: snap)
    status, headers, body = served.get("/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=")
    fam = _families(body.decode())
    value = lambda name, **labels: _samples(fam[name])[tuple(sorted(labels.items()))]  # noqa: E731
    assert value("streamfl_global_version") == 42
    assert value("streamfl_devices_online") == 3 and value("streamfl_devices_known") == 4
    assert value("streamfl_accuracy") == pytest.approx(snap["accuracy"])
    assert fam["streamfl_updates"].type == "counter"
    assert value("streamfl_updates", outcome="aggregated") == 42
    assert value("streamfl_updates_received") == 126
    assert "received" not in {s.labels.get("outcome") for s in fam["streamfl_updates"].samples}
    assert value("streamfl_updates_rejected", reason="unknown_device") == 3
    assert value("streamfl_energy_joules", source="unknown") == pytest.approx(snap["energy_j"])
    assert value("streamfl_method_value", method="clp", key="changes") == 3
    assert value("streamfl_method_value", method="clp", key="critical") == 1
    assert ("key", "flag") not in {k for labels in _samples(fam["streamfl_method_value"]) for k in labels}
    assert value("streamfl_run_info", fleet="lab", run_id="run-test", method="fedasync+clp",
                 strategy="fedasync") == 1
    row = snap["devices"][1]  # dev-0002: a Jetson, with a meter and a GPU
    assert value("streamfl_device_power_watts", device="dev-0002", source="measured") == row["power_w"]
    # dev-0001's watts are its board profile's model: labelled so, never as measured.
    assert value("streamfl_device_power_watts", device="dev-0001", source="modelled") == snap["devices"][0]["power_w"]
    assert value("streamfl_fleet_power_watts", source="measured") == row["power_w"]
    assert value("streamfl_fleet_power_watts", source="modelled") == snap["devices"][0]["power_w"]
    assert value("streamfl_fleet_power_watts", source="unknown") == 0
    assert value("streamfl_device_clock_hertz", device="dev-0002", domain="cpu") == row["clocks_mhz"]["cpu"] * 1e6
    assert value("streamfl_device_clock_hertz", device="dev-0002", domain="gpu") == pytest.approx(
        row["clocks_mhz"]["gpu"] * 1e6)
    assert value("streamfl_device_energy_joules", device="dev-0002") == row["energy_j"]
    assert value("streamfl_device_online", device="dev-0002") == 1
    assert value("streamfl_device_online", device="dev-0004") == 0
    assert value("streamfl_device_staleness_versions", device="dev-0002") == row["staleness"]
    assert value("streamfl_device_buffer_fill_windows", device="dev-0002") == row["buffer_fill"]
    assert value("streamfl_device_temperature_celsius", device="dev-0002") == row["temperature_c"]
    assert value("streamfl_device_updates", device="dev-0002", outcome="rejected") == 2
    assert value("streamfl_device_method_value", device="dev-0002", method="clp", key="lr") == row["methods"]["clp"]["lr"]
    # A Raspberry Pi without a meter has no power sample rather than a zero; the offline dev-0004
    # (a Jetson whose last watts the snapshot still holds) has no power, clock or temperature.
    powered = {dict(labels)["device"] for labels in _samples(fam["streamfl_device_power_watts"])}
    assert powered == {"dev-0001", "dev-0002"}
    for name in ("streamfl_device_clock_hertz", "streamfl_device_temperature_celsius"):
        assert "dev-0004" not in {dict(labels)["device"] for labels in _samples(fam[name])}, name
    assert value("streamfl_devices_unlabelled") == 0
    assert value("streamfl_broker_connected") == 1 and value("streamfl_broker_disconnects") == 0
    assert "streamfl_broker_lost_since_timestamp_seconds" not in fam  # only while it is lost
    del snap["broker"]
    assert "streamfl_broker_connected" not in _render(snap)  # a snapshot that does not say: no sample


def _render(snap) -> Dict[str, Any]:
    return _families(render(snap, 100).decode())


def test_metrics_of_a_real_fleet_table_drop_an_offline_board_and_label_modelled_watts():
    table = FleetTable(FleetTableConfig(), "lab", "fedasync", "fedasync", [])
    table.served_by("/runs/r")
    table.on_broker(True)
    registry = DeviceRegistry()
    for d, watts, meter, measured in (("orin", 6.0, "ina3221-hwmon", True), ("nano", 3.0, "modeled", False),
                                      ("dead", 2.7, "rpi5-pmic", True)):
        registry.on_hello(make_hello(d), 0.0)
        table.on_message(make_hello(d), 0.0)
        table.on_message(Telemetry(device_id=d, time_s=0.0, buffer_fill=1, buffer_capacity=2, power_w=watts,
                                   power_meter=meter, power_measured=measured,
                                   clocks_khz={"cpu": 1_000_000}, temperatures_c={"soc": 50.0},
                                   paused=d != "orin"), 1.0)
    registry.on_offline(Offline("dead"), 2.0)
    table.on_message(Offline("dead"), 2.0)
    fam = _render(table.refresh(3.0, 3.0, 1, registry.devices(), {}))
    fleet_power = _samples(fam["streamfl_fleet_power_watts"])
    assert fleet_power == {(("source", "measured"),): 6.0, (("source", "modelled"),): 3.0,
                           (("source", "unknown"),): 0.0}  # the dead board's 2.7 W is not in it
    assert set(_samples(fam["streamfl_device_power_watts"])) == {
        (("device", "orin"), ("source", "measured")), (("device", "nano"), ("source", "modelled"))}
    for name in ("streamfl_device_clock_hertz", "streamfl_device_temperature_celsius",
                 "streamfl_device_buffer_fill_windows"):
        assert "dead" not in {dict(labels)["device"] for labels in _samples(fam[name])}, name
    assert _samples(fam["streamfl_device_online"])[(("device", "dead"),)] == 0
    # paused: said for the online boards only (the dead board's last "paused" is not its state now)
    assert _samples(fam["streamfl_device_paused"]) == {(("device", "orin"),): 0.0, (("device", "nano"),): 1.0}
    assert _samples(fam["streamfl_broker_connected"])[()] == 1
    assert _samples(fam["streamfl_broker_disconnects"])[()] == 0
    assert "streamfl_broker_lost_since_timestamp_seconds" not in fam
    table.on_broker(False, "connection lost")
    fam = _render(table.refresh(4.0, 4.0, 1, registry.devices(), {}))
    assert _samples(fam["streamfl_broker_connected"])[()] == 0
    assert _samples(fam["streamfl_broker_disconnects"])[()] == 1
    assert _samples(fam["streamfl_broker_lost_since_timestamp_seconds"])[()] == pytest.approx(time.time(), abs=60)
    assert _samples(fam["streamfl_devices_unknown"])[()] == 3 and _samples(fam["streamfl_devices_online"])[()] == 0
    # Unknown: no online sample at all (neither 1 nor 0), no power anywhere.
    assert _samples(fam["streamfl_device_online"]) == {}
    assert _samples(fam["streamfl_device_power_watts"]) == {}
    assert set(_samples(fam["streamfl_fleet_power_watts"]).values()) == {0.0}


def test_a_thousand_devices_get_bounded_labels(serve):
    snap = snapshot(1000, online=600)
    served = serve(snap_fn=lambda: snap, max_device_labels=500)
    started = time.monotonic()
    status, _, body = served.get("/metrics")
    assert status == 200 and time.monotonic() - started < 5.0
    fam = _families(body.decode())
    for name, family in fam.items():
        devices = {s.labels["device"] for s in family.samples if "device" in s.labels}
        assert len(devices) <= 500, name
    labelled = {s.labels["device"] for s in fam["streamfl_device_online"].samples}
    assert labelled == {"dev-%04d" % i for i in range(1, 501)}  # the snapshot's order: online first
    assert _samples(fam["streamfl_devices_unlabelled"])[()] == 500
    # The fleet totals still count every device (online ones for power, by source).
    assert _samples(fam["streamfl_energy_joules"])[(("source", "unknown"),)] == pytest.approx(snap["energy_j"])
    for source in ("measured", "modelled"):
        assert _samples(fam["streamfl_fleet_power_watts"])[(("source", source),)] == pytest.approx(
            sum(d["power_w"] for d in snap["devices"] if d["online"] and d["power_source"] == source))
    assert _samples(fam["streamfl_devices_online"])[()] == 600
    # No device labels at all is a setting too.
    quiet = serve(snap_fn=lambda: snap, max_device_labels=0)
    fam = _families(quiet.get("/metrics")[2].decode())
    assert not any("device" in s.labels for f in fam.values() for s in f.samples)


def test_metrics_off_or_without_prometheus_client_and_the_rest_works(serve, monkeypatch):
    served = serve(prometheus=False)
    status, _, body = served.get("/metrics")
    assert status == 404 and b"monitor.prometheus" in body
    # As if prometheus-client were not installed: importing it fails.
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.delitem(sys.modules, "streamfl.coordinator.monitor.prometheus", raising=False)
    served = serve()
    status, _, body = served.get("/metrics")
    assert status == 501 and b"prometheus-client" in body
    assert served.get("/api/fleet")[0] == 200 and served.get("/")[0] == 200


def _grafana_metrics() -> Dict[str, List[str]]:
    dashboard = json.loads(GRAFANA.read_text())
    exprs: Dict[str, List[str]] = {}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            for name in re.findall(r"\bstreamfl_[a-z_]+", target["expr"]):
                exprs.setdefault(name, []).append(panel["title"])
    return exprs


def test_the_grafana_dashboard_imports_and_asks_for_metrics_that_exist(serve):
    dashboard = json.loads(GRAFANA.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for word in ("accuracy", "versions", "devices online", "power", "clock", "energy", "rejected"):
        assert word in titles, word
    for panel in dashboard["panels"]:
        if panel.get("type") != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
    served = serve(snap_fn=lambda: snapshot(3))
    text = served.get("/metrics")[2].decode()
    names = {s.name for f in prometheus_parser.text_string_to_metric_families(text) for s in f.samples}
    asked = _grafana_metrics()
    assert len(asked) >= 8
    missing = {name: panels for name, panels in asked.items() if name not in names}
    assert missing == {}


# ---- a real coordinator over real mosquitto ---------------------------------------------------

OUTAGE_FLEET = "outage"
OUTAGE_TOPICS = Topics(OUTAGE_FLEET)


def _mqtt(broker, client_id, will=None):
    settings = MqttSettings(host=broker.host, port=broker.port, client_id=client_id,
                            persistent_session=False, reconnect_min_s=0.2, reconnect_max_s=0.5)
    transport = PahoTransport(settings)
    if will is not None:
        transport.set_will(*will, qos=1, retain=True)
    return transport


def _poll(get, timeout_s: float, what: str) -> Any:
    """The first truthy answer of ``get()`` within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = get()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out waiting for " + what
        time.sleep(0.1)


def _scrape(url: str) -> Dict[str, Any]:
    with urllib.request.urlopen(url + "metrics", timeout=10) as answer:
        return _families(answer.read().decode())


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_broker_outage_through_a_real_coordinator_reads_as_the_coordinator_s_not_a_dead_fleet(
        mqtt_broker, tmp_path, capsys, monkeypatch):
    """mosquitto stopped under a coordinator (monitor on port 0, a run folder nobody made yet) and a
    board: the broker sends the board's will as it goes, the coordinator loses it; /metrics says
    the broker is lost and the board unknown, ``streamfl status`` says BROKER LOST; back up, the
    board says hello again and all is well, one disconnect counted."""
    run_dir = tmp_path / "runs" / "fresh"
    config = build(CoordinatorConfig, {
        "fleet": OUTAGE_FLEET, "model": SPEC, "persist_interval_s": 0.0, "admission": UNBOUNDED_ADMISSION,
        "monitor": {"port": 0}, "mqtt": {"reconnect_min_s": 0.2, "reconnect_max_s": 0.5}}, "test")
    settings = MqttSettings(host=mqtt_broker.host, port=mqtt_broker.port, client_id="coordinator-outage",
                            reconnect_min_s=0.2, reconnect_max_s=0.5)
    server = CoordinatorServer(config, PahoTransport(settings), tmp_path / "state", run_dir)
    board = _mqtt(mqtt_broker, "board-1", will=(OUTAGE_TOPICS.device("board-1", "status"),
                                                encode(Offline("board-1"))))
    board.on_connect = lambda _present: board.publish(OUTAGE_TOPICS.device("board-1", "status"),
                                                      encode(make_hello("board-1")), qos=1, retain=True)
    server.start()
    try:
        url = (run_dir / URL_FILE).read_text().strip()  # written into the fresh run folder
        assert url == server.monitor.url
        board.connect()
        wait_until(lambda: "board-1" in server.core.online(), 20, "the board greeted")
        board.publish(OUTAGE_TOPICS.device("board-1", "telemetry"), encode(Telemetry(
            device_id="board-1", time_s=1.0, buffer_fill=1, buffer_capacity=2, power_w=2.7,
            power_meter="modeled", power_measured=False)), qos=1)

        def metric(fam, name, **labels):
            return _samples(fam[name]).get(tuple(sorted(labels.items()))) if name in fam else None
        fam = _poll(lambda: (lambda f: f if metric(f, "streamfl_device_power_watts", device="board-1",
                                                    source="modelled") == 2.7 else None)(_scrape(url)),
                    20, "the board's modelled watts in /metrics")
        assert metric(fam, "streamfl_broker_connected") == 1
        assert metric(fam, "streamfl_fleet_power_watts", source="measured") == 0

        mqtt_broker.stop()  # wills first, then the coordinator's connection goes
        fam = _poll(lambda: (lambda f: f if metric(f, "streamfl_broker_connected") == 0
                             and metric(f, "streamfl_devices_unknown") == 1 else None)(_scrape(url)),
                    20, "/metrics: the broker lost, the board unknown")
        assert metric(fam, "streamfl_broker_disconnects") == 1
        assert metric(fam, "streamfl_broker_lost_since_timestamp_seconds") == pytest.approx(time.time(), abs=30)
        assert metric(fam, "streamfl_device_online", device="board-1") is None
        assert metric(fam, "streamfl_fleet_power_watts", source="modelled") == 0
        monkeypatch.setenv("COLUMNS", "400")
        assert streamfl_main(["status", "--run-dir", str(run_dir)]) == 0
        out = capsys.readouterr().out
        assert "BROKER LOST since " in out and "1 disconnect(s)" in out, out
        assert re.search(r"\nboard-1 +unknown ", out) and "offline" not in out.split("DEVICE", 1)[1], out
        assert "(~2.70)" in out  # its last watts, modelled, in brackets: not a figure of now
        assert "run folder %s" % run_dir.resolve() in out, out

        mqtt_broker.start()
        _poll(lambda: (lambda f: metric(f, "streamfl_broker_connected") == 1
                       and metric(f, "streamfl_device_online", device="board-1") == 1)(_scrape(url)),
              30, "/metrics: back on the broker, the board online again")
        assert streamfl_main(["status", "--run-dir", str(run_dir)]) == 0
        out = capsys.readouterr().out
        assert "broker connected since" in out and "1 disconnect(s) so far" in out, out
    finally:
        board.close()
        server.stop()
