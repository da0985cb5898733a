"""The shipped alert rules (configs/prometheus/streamfl-alerts.yml) as Prometheus reads them:
``promtool check rules`` and their unit tests (``promtool test rules``); every threshold the
file's table names is the one written where it is used, and changing any of them breaks a unit
test; every metric they ask for is one a real coordinator's /metrics exports (a renamed metric
breaks this), rates are of counters only; and a board's disk and temperature gauges are there
while it is online and gone when it goes offline.

Without promtool (Debian's ``prometheus`` package) the promtool tests skip, except under CI
(``CI=true``), where that is a failure: ``.ci/run`` installs it."""
import re
import shutil
import subprocess
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import pytest
import yaml

from factories import SPEC, UNBOUNDED_ADMISSION, make_hello, make_update
from polling import wait_until
from promql_lint import exported_types, misuses, names_in, promtool, selectors
from source_tree import ROOT
from streamfl.agent.disk import state_disk
from streamfl.config import build
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.server import CoordinatorServer
from streamfl.protocol.codec import encode
from streamfl.protocol.messages import Offline, Telemetry
from streamfl.protocol.topics import Topics
from streamfl.protocol.transport.base import MqttSettings
from streamfl.protocol.transport.paho import PahoTransport
from streamfl.sensors.datasets import save_npz

pytest.importorskip("prometheus_client")

RULES_DIR = ROOT / "configs" / "prometheus"
RULES = RULES_DIR / "streamfl-alerts.yml"
RULES_TEST = RULES_DIR / "streamfl-alerts.test.yml"
#: The alerts the issue asks for, by what they watch.
EXPECTED_ALERTS = {"StreamflBoardOffline", "StreamflBoardSilent", "StreamflBoardDiskLow",
                   "StreamflBoardDiskFull", "StreamflBoardHot", "StreamflBoardOverheating",
                   "StreamflCoordinatorDown", "StreamflCoordinatorBrokerLost",
                   "StreamflAccuracyFalling", "StreamflRejectionsRising", "StreamflMethodFlagFlapping"}
#: Metrics the rules use that Prometheus makes itself, not /metrics.
PROMETHEUS_OWN = {"up"}


def _rules() -> List[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def _run(*args: str, cwd: Path = RULES_DIR) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), cwd=str(cwd), capture_output=True, text=True, timeout=60)


def test_promtool_checks_the_rules_and_their_unit_tests_pass():
    tool = promtool()
    checked = _run(tool, "check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = _run(tool, "test", "rules", RULES_TEST.name)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def test_every_alert_asked_for_is_there_has_a_severity_and_a_unit_test_of_it_firing():
    rules = _rules()
    alerts = {r["alert"]: r for r in rules if "alert" in r}
    assert set(alerts) == EXPECTED_ALERTS
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    cases = [case for t in tests for case in t.get("alert_rule_test", [])]
    fired = {case["alertname"] for case in cases if case["exp_alerts"]}
    quiet = {case["alertname"] for case in cases if not case["exp_alerts"]}
    assert fired == EXPECTED_ALERTS and quiet == EXPECTED_ALERTS


# ---- the thresholds: named in the file's table, written where they are used ------------------

def _thresholds() -> Dict[str, str]:
    """The table of the file's header: name -> value."""
    head = RULES.read_text().split("\ngroups:", 1)[0]
    table = head.split("THRESHOLDS.", 1)[1]
    return dict(re.findall(r"^#   ([A-Z][A-Z0-9_]+) +(\S+) ", table, re.M))


def _uses(name: str) -> List[int]:
    """Indices of the lines of the rules (below the header) that name the threshold ``name``."""
    lines = RULES.read_text().split("\n")
    start = lines.index("groups:")
    return [i for i, line in enumerate(lines) if i > start and re.search(r"#\s*%s\b" % name, line)]


def test_each_named_threshold_is_written_where_it_is_used():
    thresholds = _thresholds()
    assert len(thresholds) >= 15, thresholds
    lines = RULES.read_text().split("\n")
    for name, value in thresholds.items():
        uses = _uses(name)
        assert uses, "%s is in the table but no rule names it" % name
        for i in uses:
            code = lines[i].split("#", 1)[0]
            assert re.search(r"(?<![\w.])%s(?![\w.])" % re.escape(value), code), (name, value, lines[i])


def test_the_monitoring_page_names_every_alert_and_threshold():
    page = (ROOT / "docs" / "monitoring.md").read_text()
    section = page.split("\n## Alert rules\n", 1)[1].split("\n## ", 1)[0]
    assert "configs/prometheus/streamfl-alerts.yml" in section
    missing = [a for a in EXPECTED_ALERTS if "`%s`" % a not in section]
    missing += [t for t in _thresholds() if "`%s`" % t not in section]
    assert missing == []


def _scaled(value: str, factor: float) -> str:
    """A threshold ``factor`` times as large: a duration in seconds, a number as a number."""
    duration = re.fullmatch(r"(\d+)([smhd])", value)
    if duration:
        seconds = int(duration.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[duration.group(2)]
        return "%ds" % max(1, round(seconds * factor))
    return repr(float(value) * factor)


def _mutant(tmp: Path, name: str, value: str, factor: float) -> Tuple[str, float, int, str]:
    lines = RULES.read_text().split("\n")
    for i in _uses(name):
        code, comment = lines[i].split("#", 1)
        code = re.sub(r"(?<![\w.])%s(?![\w.])" % re.escape(value), _scaled(value, factor), code)
        lines[i] = code + "#" + comment
    folder = tmp / ("%s-%g" % (name, factor))
    folder.mkdir()
    (folder / RULES.name).write_text("\n".join(lines))
    shutil.copy(RULES_TEST, folder / RULES_TEST.name)
    run = _run(promtool(), "test", "rules", RULES_TEST.name, cwd=folder)
    return name, factor, run.returncode, run.stdout[-400:]


def test_the_unit_tests_catch_every_threshold_made_ten_times_larger_or_smaller(tmp_path):
    """Each test case has series on both sides of its alert's thresholds: a threshold changed
    tenfold either way makes some case fail, so no threshold is there untested."""
    promtool()
    jobs = [(name, value, factor) for name, value in _thresholds().items() for factor in (10.0, 0.1)]
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda job: _mutant(tmp_path, *job), jobs))
    passed = [(name, factor, out) for name, factor, rc, out in results if rc == 0]
    assert passed == [], "the unit tests still pass with these thresholds changed: %s" % passed


# ---- the metrics: what the rules ask for is what a real coordinator exports -----------------

FLEET = "alerts"
TOPICS = Topics(FLEET)


def _mqtt(broker, client_id: str, **kw) -> PahoTransport:
    return PahoTransport(MqttSettings(host=broker.host, port=broker.port, client_id=client_id,
                                      persistent_session=False, reconnect_min_s=0.2,
                                      reconnect_max_s=0.5, **kw))


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url + "metrics", timeout=10) as answer:
        return answer.read().decode()


def _sample(text: str, name: str, **labels: str):
    """The value of ``name`` with exactly ``labels`` in a scrape, or None."""
    from prometheus_client.parser import text_string_to_metric_families
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_every_metric_the_rules_use_is_one_a_real_coordinator_exports(mqtt_broker, tmp_path):
    """A coordinator running the CLP plug-in with held-out data on a real mosquitto, a board that
    says hello, sends telemetry (disk and temperature) and an update: its /metrics has every metric
    the rules name, counters where they take a rate; the board's disk and temperature are there
    while it is online, and gone once it is offline."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((20, SPEC.window_len, SPEC.in_channels)).astype(np.float32)
    y = rng.integers(0, SPEC.num_classes, 20).astype(np.int64)
    eval_path = save_npz(tmp_path / "eval.npz", x, y, np.zeros(20, dtype=np.int64), ["a", "b"])
    config = build(CoordinatorConfig, {
        "fleet": FLEET, "model": SPEC, "plugins": {"clp": {}}, "persist_interval_s": 0.0,
        "admission": UNBOUNDED_ADMISSION, "eval_path": str(eval_path), "eval_every_versions": 1,
        "monitor": {"port": 0}, "mqtt": {"reconnect_min_s": 0.2, "reconnect_max_s": 0.5}}, "test")
    server = CoordinatorServer(config, _mqtt(mqtt_broker, "coordinator-alerts"), tmp_path / "state",
                               tmp_path / "run")
    board = _mqtt(mqtt_broker, "pi-1")
    server.start()
    try:
        board.connect()
        wait_until(lambda: board.connected and server.transport.connected, 15, "both connected")
        url = server.monitor.url

        def send(kind: str, msg) -> None:
            wait_until(board.publish_tracked(TOPICS.device("pi-1", kind), encode(msg), qos=1), 10,
                       "the broker's acknowledgement")
        send("status", make_hello("pi-1"))
        wait_until(lambda: "pi-1" in server.core.online(), 15, "the board greeted")
        disk = state_disk(tmp_path)
        assert disk["state_disk_free_bytes"] > 0 and disk["state_disk_size_bytes"] > 0
        send("telemetry", Telemetry(device_id="pi-1", time_s=1.0, buffer_fill=1, buffer_capacity=2,
                                    temperatures_c={"cpu-thermal": 61.5}, **disk))
        send("update", make_update(SPEC, 0.5, device_id="pi-1", base_version=0))
        wait_until(lambda: server.fleet.snapshot().get("accuracy") is not None
                   and server.fleet.snapshot()["devices"][0].get("disk_free_bytes") is not None,
                   30, "an evaluation and the board's disk in the fleet table")
        text = _scrape(url)
        types = exported_types(text)

        rules = _rules()
        exprs = [r["expr"] for r in rules]
        asked = names_in(exprs + [v for r in rules for v in r.get("annotations", {}).values()])
        assert len(asked) >= 10, asked
        assert asked - set(types) == set(), "the rules ask for metrics /metrics does not export"
        others = {n for e in exprs for n in selectors(e) if ":" not in n} - set(types)
        assert others == PROMETHEUS_OWN
        assert [m for e in exprs for m in misuses(e, types)] == []
        flag = re.search(r'streamfl_method_value\{key="([a-z_]+)"\}', "\n".join(exprs)).group(1)
        assert _sample(text, "streamfl_method_value", method="clp", key=flag) is not None

        assert _sample(text, "streamfl_device_disk_free_bytes", device="pi-1") == pytest.approx(
            disk["state_disk_free_bytes"], rel=0.01)
        size = _sample(text, "streamfl_device_disk_size_bytes", device="pi-1")
        assert size == disk["state_disk_size_bytes"]
        assert _sample(text, "streamfl_device_temperature_celsius", device="pi-1") == 61.5
        assert types["streamfl_device_disk_free_bytes"] == "gauge"

        send("status", Offline("pi-1", reason="stopped"))
        wait_until(lambda: _sample(_scrape(url), "streamfl_device_online", device="pi-1") == 0, 15,
                   "the board offline in /metrics")
        text = _scrape(url)
        for gone in ("streamfl_device_disk_free_bytes", "streamfl_device_disk_size_bytes",
                     "streamfl_device_temperature_celsius"):
            assert _sample(text, gone, device="pi-1") is None, gone
    finally:
        board.close()
        server.stop()
