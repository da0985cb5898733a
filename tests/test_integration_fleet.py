"""A whole fleet as separate OS processes over a real mosquitto: coordinator + agents learn a model
above chance, survive a broker restart, and a coordinator restart resumes at its saved version.

Processes run exactly what a deployment runs (``python -m streamfl.coordinator`` and
``python -m streamfl.agent``) with the demo's YAML configs at a faster round pace.
"""
import json
import re
import time
from collections import Counter

import numpy as np
import pytest

from fleet import ModelWatcher


def _by_device(updates):
    return Counter(u["device"] for u in updates)


def _completed_rounds(proc) -> int:
    """Rounds the agent finished (each ends in one update handed to MQTT or the outbox)."""
    return len(re.findall(r"streamfl\.agent\.core: round \d+ from v", proc.log_text()))


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_coordinator_and_three_agents_learn_above_chance(fleet, mqtt_broker):
    run = fleet()
    devices = run.start_fleet(3)

    run.wait_for(lambda: run.version() >= 30, 150, "30 aggregations")
    good = run.wait_for(
        lambda: [e for e in run.evals() if e["version"] >= 30 and e["accuracy"] > 0.4], 60,
        "held-out accuracy > 0.4 (chance 1/6) at version >= 30")
    updates = run.updates()
    evals = run.evals()
    counts = _by_device(updates)
    assert set(counts) == devices, (counts, run.diagnostics())
    assert min(counts.values()) >= 5, (counts, run.diagnostics())
    # FedAsync: every aggregated update makes exactly one new version, in order, no gaps.
    aggregated = [u["version"] for u in updates if u["aggregated"]]
    assert aggregated == list(range(1, len(aggregated) + 1)), aggregated
    assert evals[0]["version"] == 0
    assert good[0]["accuracy"] > evals[0]["accuracy"] + 0.15, (evals[0], good[0])
    assert all(u["staleness"] >= 0 for u in updates)

    # Clean shutdown of everyone: exit 0, the coordinator's last model persisted; the retained one
    # is the newest published before it disconnected (what it drained after is published next start).
    run.stop_all()
    codes = {p.name: p.popen.returncode for p in run.procs}
    assert set(codes.values()) == {0}, (codes, run.diagnostics())
    saved = json.loads((run.coordinator_state / "state.json").read_text())["version"]
    assert saved == run.version() >= 30
    watcher = ModelWatcher(mqtt_broker.host, mqtt_broker.port, run.fleet, run.spec)
    try:
        retained = run.wait_for(watcher.models, 10, "the retained global model")
    finally:
        watcher.close()
    assert saved - 10 <= retained[0].version <= saved


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_broker_restart_everyone_reconnects_and_no_update_is_lost(fleet, mqtt_broker):
    run = fleet()
    devices = run.start_fleet(2)
    run.wait_for(lambda: run.version() >= 5 and set(_by_device(run.updates())) == devices, 120,
                 "5 versions with updates from both agents")

    mqtt_broker.stop()            # mqtt_broker.restart(down_s=3), split to mark the restart point
    time.sleep(0.5)               # the coordinator's worker drains what it had already received
    mark, v_restart = len(run.metrics()), run.version()
    time.sleep(2.5)
    mqtt_broker.start()

    # Everyone is back: new versions, and every agent trains from a model published after restart.
    run.wait_for(lambda: run.version() >= v_restart + 10, 60, "10 versions after the restart")
    run.wait_for(lambda: {u["device"] for u in run.updates(mark) if u["base_version"] > v_restart}
                 == devices, 60, "updates from both agents trained from post-restart models")
    for proc in [run.coordinator] + list(run.agents.values()):
        assert proc.log_text().count("connected to the broker") >= 2, run.diagnostics()
    # The broker sent the agents' wills when it went down; their Hellos set the registry right.
    run.wait_for(lambda: any(e["devices_online"] == 2 for e in run.evals(mark)), 30,
                 "the coordinator to see both agents online again")

    # No update lost: stop the agents (their updates in flight are acknowledged before they
    # exit), then every round an agent completed must have reached the coordinator exactly once.
    for proc in run.agents.values():
        assert proc.terminate() == 0, run.diagnostics()
    rounds = {run.device_id(i): _completed_rounds(p) for i, p in run.agents.items()}

    def delivered():
        got = _by_device(u for u in run.updates() if u["outcome"] != "duplicate")
        return all(got[d] == n for d, n in rounds.items()) and got
    run.wait_for(delivered, 20, "all %s updates at the coordinator" % rounds)
    assert run.coordinator.terminate() == 0, run.diagnostics()


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_coordinator_restart_resumes_at_the_saved_version(fleet, mqtt_broker):
    run = fleet()
    devices = run.start_fleet(2)
    run.wait_for(lambda: run.version() >= 5, 120, "5 versions")

    first = run.coordinator
    assert first.terminate() == 0, run.diagnostics()
    saved = json.loads((run.coordinator_state / "state.json").read_text())["version"]
    assert saved == run.version() >= 5, run.diagnostics()
    mark = len(run.metrics())
    watcher = ModelWatcher(mqtt_broker.host, mqtt_broker.port, run.fleet, run.spec)
    try:
        retained = run.wait_for(watcher.models, 10, "the retained model of the stopped coordinator")
        assert saved - 10 <= retained[0].version <= saved

        restarted_at = time.monotonic()
        second = run.start_coordinator()
        fresh = run.wait_for(lambda: watcher.models(restarted_at), 60,
                             "a model published by the restarted coordinator")
        run.wait_for(lambda: run.version() >= saved + 10, 60, "10 versions after the restart")
        run.wait_for(lambda: {u["device"] for u in run.updates(mark) if u["base_version"] > saved}
                     == devices, 60, "both agents training from the restarted coordinator's models")
        published = [m.version for m in watcher.models(restarted_at)]
    finally:
        watcher.close()

    assert re.search(r"continuing from \S+ at version %d\b" % saved, second.log_text()), second.tail()
    # It continued from the saved model, not from a fresh one: the first evaluation after the
    # restart is of version `saved`, and the first update it handled made `saved` + 1.
    after = run.metrics()[mark:]
    first_eval = next(m for m in after if m["event"] == "eval")
    first_update = next(m for m in after if m["event"] == "update")
    assert first_eval["version"] == saved, after[:3]
    assert first_update["version"] in (saved, saved + 1), first_update  # duplicate or aggregated
    assert min(published) >= saved, published
    assert published == sorted(published), published
    if fresh[0].version == saved == retained[0].version:  # republished before any queued update landed
        for name, arr in retained[0].tensors.items():
            np.testing.assert_array_equal(fresh[0].tensors[name], arr)
    for proc in run.agents.values():
        assert proc.alive, run.diagnostics()
