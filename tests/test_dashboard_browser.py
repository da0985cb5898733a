"""The fleet dashboard in a real headless chromium (selenium, Debian's chromium and chromedriver):
the page shows the devices of a fleet and follows it as versions arrive, first on a fleet view fed
by data that changes as a fleet's does, then on a running fleet of coordinator and agent processes
over a real broker, whose /metrics a scrape reads at the same time; and what the page says when the
coordinator's own broker link is lost, a board is offline, watts are modelled and the monitor's
port was taken (a real fleet table behind a real fleet view).

Without chromium, chromedriver or selenium these tests skip, except under CI (``CI=true``), where
that is a failure: CI installs them (``.ci/run``, the ``dev`` extra).
"""
import os
import shutil
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest

import socket

from factories import make_hello
from fleet_snapshots import GrowingFleet, snapshot
from streamfl.coordinator.fleet import FleetTable, FleetTableConfig
from streamfl.coordinator.monitor.config import MonitorConfig
from streamfl.coordinator.monitor.http import URL_FILE, MonitorServer
from streamfl.coordinator.registry import DeviceRegistry
from streamfl.protocol.messages import Offline, Telemetry

pytestmark = pytest.mark.slow

UNDER_CI = os.environ.get("CI") == "true"


def _missing(what: str) -> None:
    """Skip on a developer's machine; fail under CI, which must have the browser."""
    if UNDER_CI:
        pytest.fail("%s is missing under CI (.ci/run installs chromium and chromium-driver, the dev "
                    "extra selenium)" % what)
    pytest.skip("%s is not installed (apt-get install chromium chromium-driver; pip install selenium)" % what)


@pytest.fixture(scope="module")
def driver():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _missing("selenium")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    chromedriver = shutil.which("chromedriver")
    if chromium is None:
        _missing("chromium")
    if chromedriver is None:
        _missing("chromedriver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1200", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    # An explicit driver path: selenium never tries to download one.
    browser = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    browser.set_page_load_timeout(30)
    try:
        yield browser
    finally:
        browser.quit()


def wait(predicate: Callable[[], Any], timeout_s: float, what: str, page=None) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            status = page.find_element("id", "status").text if page is not None else ""
            raise AssertionError("timed out after %.0f s waiting for %s (page status: %r)"
                                 % (timeout_s, what, status))
        time.sleep(0.2)


def rows(page) -> Dict[str, Dict[str, str]]:
    """The device table: ``{device: {column: text}}``, read in one script call."""
    return page.execute_script("""
        var out = {};
        document.querySelectorAll('#devices tbody tr').forEach(function (tr) {
          var cells = {};
          tr.querySelectorAll('td').forEach(function (td) { cells[td.dataset.col] = td.textContent; });
          cells._class = tr.className;
          out[tr.dataset.device] = cells;
        });
        return out;""")


def version(page) -> Optional[int]:
    text = page.find_element("id", "version").text
    return int(text) if text.isdigit() else None


def inked(page, canvas_id: str) -> int:
    """Pixels a chart has drawn on."""
    return page.execute_script("""
        var c = document.getElementById(arguments[0]);
        var d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data, n = 0;
        for (var i = 3; i < d.length; i += 4) { if (d[i] > 0) { n++; } }
        return n;""", canvas_id)


@pytest.fixture
def serve(tmp_path):
    started: List[MonitorServer] = []

    def make(snap_fn, series_fn=lambda since: {}, **config: Any) -> MonitorServer:
        server = MonitorServer(MonitorConfig(**dict({"port": 0}, **config)), snap_fn, series_fn, tmp_path)
        assert server.start()
        started.append(server)
        return server
    yield make
    for server in started:
        server.stop()


def test_the_page_shows_the_devices_and_follows_the_versions(driver, serve):
    fleet = GrowingFleet(devices=3, join_every_s=1.5, versions_per_s=5.0)
    server = serve(fleet.snapshot, fleet.series)
    driver.get(server.url)
    first = wait(lambda: rows(driver), 15, "the first device row", driver)
    assert "dev-0001" in first
    v0 = wait(lambda: version(driver), 10, "a version", driver)
    # Devices join and versions arrive: the page follows without a reload.
    table = wait(lambda: (lambda r: r if len(r) == 3 else None)(rows(driver)), 20, "three devices", driver)
    assert set(table) == {"dev-0001", "dev-0002", "dev-0003"}
    wait(lambda: (version(driver) or 0) > v0, 10, "a newer version than %d" % v0, driver)
    assert "live" in driver.find_element("id", "status").get_attribute("class")
    # Every column of a device row, the clock domains and the methods' values among them.
    row = table["dev-0002"]
    for column in ("device", "state", "last seen", "board", "software", "version", "staleness", "rounds",
                   "accepted", "clipped", "rejected", "rejected by reason", "cpu MHz", "gpu MHz",
                   "power W", "energy J", "temp °C", "buffer", "clp lr", "clp critical"):
        assert column in row, column
    assert row["board"] == "jetson-orin-nano" and row["state"] == "online" and row["power W"] == "5.00"
    assert row["clp lr"] == "0.03" and row["rejected by reason"] == "norm 2"
    assert table["dev-0003"]["gpu MHz"] == "-"  # a Raspberry Pi has no GPU clock
    assert row["_class"] == "online"
    assert driver.find_element("id", "fleet").text == "lab"
    assert "fedasync+clp" in driver.find_element("id", "run").text
    assert "norm 1" in driver.find_element("id", "reasons").text
    # The charts are drawn, and the method events listed.
    for chart in ("chart-accuracy", "chart-versions", "chart-energy", "chart-clocks"):
        wait(lambda: inked(driver, chart) > 500, 10, "a drawn %s" % chart, driver)
    events = wait(lambda: driver.find_elements("css selector", "#events li"), 10, "method events", driver)
    assert "clp" in events[0].text and "flag" in events[0].text
    assert fleet.calls >= 3


def test_offline_devices_and_a_token_from_the_page_url(driver, serve, tmp_path):
    (tmp_path / "token").write_text("page-token\n")
    server = serve(lambda: snapshot(4, online=3), token_file=str(tmp_path / "token"))
    driver.get(server.url + "?token=page-token")
    # The rows arrive only if the page's own API calls carried the token.
    table = wait(lambda: (lambda r: r if len(r) == 4 else None)(rows(driver)), 15, "four devices", driver)
    assert table["dev-0004"]["_class"] == "offline" and table["dev-0004"]["state"].startswith("offline")
    assert table["dev-0001"]["_class"] == "online"
    assert driver.find_element("id", "devices-online").text == "3 / 4"
    driver.get(server.url)
    assert "401" in driver.find_element("tag name", "body").text


def text(page, element_id: str) -> str:
    return page.find_element("id", element_id).text


def test_a_lost_broker_an_offline_board_modelled_watts_and_a_taken_port_on_the_page(driver, tmp_path):
    """The table a coordinator keeps, fed as the server feeds it, behind a fleet view whose
    monitor.port was taken: the badge says the broker is lost (never "live"), the boards are
    unknown with when they were last heard, a board offline before shows no watts, modelled
    watts say so, and the page says where the view really listens."""
    table = FleetTable(FleetTableConfig(), "lab", "fedasync", "fedasync", [])
    table.served_by(str(tmp_path / "run"))
    registry = DeviceRegistry()
    table.on_broker(True)
    for d, watts, meter, measured in (("orin-1", 6.25, "ina3221-hwmon", True), ("nano-1", 3.5, "modeled", False),
                                      ("pi5-dead", 2.7, "rpi5-pmic", True)):
        hello = make_hello(d)
        registry.on_hello(hello, 0.0)
        table.on_message(hello, 0.0)
        table.on_message(Telemetry(device_id=d, time_s=0.0, buffer_fill=1, buffer_capacity=2, power_w=watts,
                                   power_meter=meter, power_measured=measured, clocks_khz={"cpu": 1_500_000}), 0.0)
    registry.on_offline(Offline("pi5-dead"), 1.0)
    table.on_message(Offline("pi5-dead"), 1.0)
    clock = {"now": 2.0}

    def snap() -> Dict[str, Any]:
        return table.refresh(clock["now"], clock["now"], 3, registry.devices(), {})
    snap()
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    server = MonitorServer(MonitorConfig(port=taken.getsockname()[1]), snap, table.series, tmp_path / "run")
    try:
        url = server.start()
        driver.get(url)
        table_rows = wait(lambda: (lambda r: r if len(r) == 3 else None)(rows(driver)), 15, "three boards", driver)
        assert "live" in driver.find_element("id", "status").get_attribute("class")
        assert table_rows["orin-1"]["power W"] == "6.25"                 # measured: the plain figure
        assert table_rows["nano-1"]["power W"] == "3.50modelled"         # a model: labelled so
        assert table_rows["pi5-dead"]["state"] == "offline (lost)"
        assert table_rows["pi5-dead"]["power W"] == "-last 2.70" and table_rows["pi5-dead"]["cpu MHz"] == "-"
        assert text(driver, "power") == "6.3 W"                          # the dead board's 2.7 W is not in it
        assert "modelled 3.5 W (1)" in text(driver, "power-more")
        notice = driver.find_element("id", "notice")
        assert notice.is_displayed() and "monitor.port %d was taken" % taken.getsockname()[1] in notice.text
        assert url in notice.text
        assert "run folder %s" % (tmp_path / "run") in text(driver, "whose")
        wait(lambda: inked(driver, "chart-energy") > 500, 10, "the energy chart, by source", driver)
        # The broker goes: it sends the live boards' wills, then drops the coordinator.
        for d in ("orin-1", "nano-1"):
            registry.on_offline(Offline(d), 3.0)
            table.on_message(Offline(d), 3.0)
        table.on_broker(False, "connection lost")
        clock["now"] = 10.0
        wait(lambda: "broker-lost" in driver.find_element("id", "status").get_attribute("class"), 10,
             "the broker-lost badge", driver)
        badge = text(driver, "status")
        assert badge.startswith("broker lost since ") and "1 disconnect(s)" in badge and "live" not in badge
        table_rows = wait(lambda: (lambda r: r if r["orin-1"]["state"].startswith("unknown") else None)(rows(driver)),
                          10, "unknown states", driver)
        for d in ("orin-1", "nano-1", "pi5-dead"):
            assert table_rows[d]["state"].startswith("unknown (last heard "), table_rows[d]
            assert table_rows[d]["_class"] == "unknown" and table_rows[d]["power W"].startswith("-last ")
        assert text(driver, "devices-online") == "0 / 3"
        assert text(driver, "devices-unknown") == "3 unknown: the coordinator lost the broker"
        assert text(driver, "power") == "0.0 W"
        # Back: the live boards say hello again.
        table.on_broker(True)
        for d in ("orin-1", "nano-1"):
            registry.on_hello(make_hello(d), 11.0)
            table.on_message(make_hello(d), 11.0)
        clock["now"] = 12.0
        wait(lambda: "live" == driver.find_element("id", "status").get_attribute("class").split()[-1], 10,
             "the live badge again", driver)
        table_rows = rows(driver)
        assert table_rows["orin-1"]["state"] == "online"
    finally:
        server.stop()
        taken.close()


def _scrape(url: str) -> Dict[str, Dict[tuple, float]]:
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(url + "metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {f.name: {tuple(sorted(s.labels.items())): s.value for s in f.samples}
            for f in text_string_to_metric_families(text)}


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_running_fleet_on_the_page_and_in_metrics(driver, fleet):
    pytest.importorskip("prometheus_client")
    run = fleet(coordinator_overrides={"monitor": {"port": 0}, "eval_every_versions": 2})
    devices = run.start_fleet(2)
    url_file: Path = run.run_dir / URL_FILE
    url = run.wait_for(lambda: url_file.is_file() and url_file.read_text().strip(), 60,
                       "the coordinator's monitor.url")

    def scraped_version(min_version: int) -> Optional[Dict[str, Any]]:
        m = _scrape(url)
        online = {dict(k)["device"] for k, v in m.get("streamfl_device_online", {}).items() if v == 1}
        v = m.get("streamfl_global_version", {}).get(())
        return m if online == devices and v is not None and v >= min_version else None
    first = run.wait_for(lambda: scraped_version(1), 120, "/metrics: both devices online and a version")
    v1 = first["streamfl_global_version"][()]
    assert first["streamfl_devices_online"][()] == 2
    assert {dict(k)["device"] for k in first["streamfl_device_info"]} == devices
    later = run.wait_for(lambda: scraped_version(v1 + 2), 60, "/metrics: a growing version")
    assert later["streamfl_updates"][(("outcome", "aggregated"),)] >= v1 + 2

    driver.get(url)
    table = wait(lambda: (lambda r: r if set(r) == devices else None)(rows(driver)), 30,
                 "the fleet's devices %s on the page" % sorted(devices), driver)
    assert all(cells["state"] == "online" for cells in table.values())
    assert all(cells["board"] not in ("", "-") for cells in table.values())
    shown = wait(lambda: version(driver), 15, "a version on the page", driver)
    wait(lambda: (version(driver) or 0) > shown, 60, "the page's version to grow past %d" % shown, driver)
    wait(lambda: inked(driver, "chart-versions") > 500, 30, "the versions chart", driver)
    run.check_alive()
