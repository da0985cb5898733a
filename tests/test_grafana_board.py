"""The shipped Grafana board (configs/grafana/streamfl-fleet.json) asks /metrics for what it
exports, the way its types allow: no rate(), irate() or increase() of a gauge (the global version
is one) and no deriv() or delta() of a counter; every expression is PromQL that Prometheus parses
(``promtool``: skipped without it, a failure under CI); it has the alerts' panels (an alert list,
disk, temperature, ...), their threshold lines at the rules' thresholds."""
import json
import subprocess
from typing import Dict, List

import pytest
import yaml

from fleet_snapshots import snapshot
from promql_lint import exported_types, misuses, names_in, promtool, selectors
from source_tree import ROOT
from test_alert_rules import EXPECTED_ALERTS, _thresholds

pytest.importorskip("prometheus_client")

BOARD = ROOT / "configs" / "grafana" / "streamfl-fleet.json"
#: Metrics the board uses that Prometheus makes itself: a target's scrape and the rules' alerts.
PROMETHEUS_OWN = {"up", "ALERTS"}
#: Panels with threshold lines, by title: the rules' thresholds (the file's table) they draw.
THRESHOLD_LINES = {"Temperature per device": ["TEMPERATURE_WARN_C", "TEMPERATURE_CRIT_C"],
                   "Free disk per board (state folder)": ["DISK_FREE_RATIO"],
                   "Accuracy below its best of the last hour": ["ACCURACY_DROP"],
                   "Rejected share of updates by reason (10 min)": ["REJECTED_RATIO"],
                   "Method flag changes in the last hour": ["FLAG_CHANGES_PER_HOUR"],
                   "Longest silence of an online board": ["BOARD_SILENT_S"]}


def _panels() -> List[dict]:
    return json.loads(BOARD.read_text())["panels"]


def _exprs() -> Dict[str, List[str]]:
    """Each panel's target expressions, by title."""
    return {p["title"]: [t["expr"] for t in p.get("targets", [])] for p in _panels()}


def _types() -> Dict[str, str]:
    """What /metrics exports and as what: a fleet's snapshot, and one whose coordinator lost its
    broker (the only time ``streamfl_broker_lost_since_timestamp_seconds`` is there)."""
    from streamfl.coordinator.monitor.prometheus import render
    lost = snapshot(3)
    lost["broker"] = dict(lost["broker"], connected=False)
    types: Dict[str, str] = {}
    for snap in (snapshot(3), lost):
        types.update(exported_types(render(snap, 100).decode()))
    return types


def test_no_rate_of_a_gauge_nor_a_slope_of_a_counter():
    types = _types()
    assert types["streamfl_global_version"] == "gauge"  # the one the board once took a rate() of
    wrong = {title: misuses(expr, types) for title, exprs in _exprs().items() for expr in exprs
             if misuses(expr, types)}
    assert wrong == {}


def test_the_linter_finds_a_rate_of_a_gauge_and_a_slope_of_a_counter():
    types = _types()
    assert misuses('rate(streamfl_global_version{job=~"$job"}[1m])', types) == [
        ("rate", "streamfl_global_version", "gauge")]
    assert misuses("sum(increase(streamfl_device_temperature_celsius[5m]))", types)[0][0] == "increase"
    assert misuses("deriv(streamfl_updates_received_total[5m])", types) == [
        ("deriv", "streamfl_updates_received_total", "counter")]
    assert misuses("rate(streamfl_updates_received_total[5m])", types) == []


def test_every_metric_the_board_uses_exists():
    types = _types()
    exprs = [e for es in _exprs().values() for e in es]
    used = names_in(exprs)
    assert len(used) >= 15, used
    assert used - set(types) == set()
    # The rest are Prometheus' own series, nothing made up.
    others = {n for e in exprs for n in selectors(e)} - set(types)
    assert others == PROMETHEUS_OWN


def test_every_expression_parses_as_promql(tmp_path):
    tool = promtool()
    rules = [{"record": "streamfl:board_check_%d" % i, "expr": expr.replace("$job", ".*")}
             for i, expr in enumerate(e for es in _exprs().values() for e in es)]
    path = tmp_path / "board.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "board", "rules": rules}]}))
    run = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_board_has_the_alerts_panels_with_the_rules_thresholds():
    panels = _panels()
    kinds = [p["type"] for p in panels]
    assert "alertlist" in kinds
    exprs = _exprs()
    joined = "\n".join(e for es in exprs.values() for e in es)
    assert 'ALERTS{alertname=~"Streamfl.*", alertstate="firing"' in joined
    for metric in ("streamfl_device_disk_free_bytes", "streamfl_device_temperature_celsius",
                   "streamfl_broker_connected", "streamfl_accuracy", "streamfl_updates_rejected_total"):
        assert metric in joined, metric
    assert 'changes(streamfl_method_value{job=~"$job", key="flag_since_version"}[1h])' in joined
    described = " ".join(p.get("description", "") for p in panels)
    assert {a for a in EXPECTED_ALERTS if a not in described} == set()
    thresholds = _thresholds()
    by_title = {p["title"]: p for p in panels}
    for title, names in THRESHOLD_LINES.items():
        defaults = by_title[title]["fieldConfig"]["defaults"]
        drawn = [s["value"] for s in defaults["thresholds"]["steps"] if s["value"] is not None]
        assert drawn == [float(thresholds[n]) for n in names], title
        assert defaults["custom"]["thresholdsStyle"]["mode"] == "line", title
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for p in panels:
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
