"""The fleet view's HTTP server on a real socket: its routes, the token, read-only methods, a taken
port, bounded requests, and /metrics as Prometheus' own parser reads it (label bounds with a
thousand devices, and every metric the shipped Grafana dashboard asks for)."""
import http.client
import json
import logging
import re
import select
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from fleet_snapshots import GrowingFleet, snapshot
from source_tree import ROOT
from streamfl.coordinator.config import load_config
from streamfl.coordinator.monitor.config import MonitorConfig
from streamfl.coordinator.monitor.http import URL_FILE, MonitorServer
from streamfl.errors import ConfigError

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
    assert json.loads(body) == snapshot(3)
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


def test_a_taken_port_is_a_warning_and_no_server(tmp_path, caplog):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        port = taken.getsockname()[1]
        server = MonitorServer(MonitorConfig(port=port), lambda: snapshot(1), lambda s: {}, tmp_path)
        with caplog.at_level(logging.WARNING, logger="streamfl.coordinator.monitor.http"):
            assert server.start() is None
        assert any(r.levelno == logging.WARNING and "cannot listen on 127.0.0.1:%d" % port in r.getMessage()
                   and "runs without" in r.getMessage() for r in caplog.records)
        assert not (tmp_path / URL_FILE).exists()
        server.stop()  # nothing to stop: no error
    finally:
        taken.close()


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
    assert status == 200 and json.loads(body) == {"version": None, "devices": []}  # strict JSON


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
    assert value("streamfl_energy_joules") == pytest.approx(snap["energy_j"])
    assert value("streamfl_method_value", method="clp", key="changes") == 3
    assert value("streamfl_method_value", method="clp", key="critical") == 1
    assert ("key", "flag") not in {k for labels in _samples(fam["streamfl_method_value"]) for k in labels}
    assert value("streamfl_run_info", fleet="lab", run_id="run-test", method="fedasync+clp",
                 strategy="fedasync") == 1
    row = snap["devices"][1]  # dev-0002: a Jetson, with a meter and a GPU
    assert value("streamfl_device_power_watts", device="dev-0002") == row["power_w"]
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
    # A Raspberry Pi without a meter has no power sample rather than a zero.
    assert ("device", "dev-0003") not in {k for labels in _samples(fam["streamfl_device_power_watts"]) for k in labels}
    assert value("streamfl_devices_unlabelled") == 0


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
    # The fleet totals still count every device.
    assert _samples(fam["streamfl_energy_joules"])[()] == pytest.approx(snap["energy_j"])
    assert _samples(fam["streamfl_fleet_power_watts"])[()] == pytest.approx(
        sum(d["power_w"] or 0 for d in snap["devices"]))
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
