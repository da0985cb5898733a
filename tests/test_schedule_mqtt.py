"""Device scheduling over a real MQTT broker: a FedAvg coordinator with the ``schedule`` plug-in
(FedTeddi) and four agent processes whose sensors stream different classes. The coordinator picks
who trains each round; the others are told to skip, and they do not train that round.

Everything is read from what the processes leave behind: the coordinator's metrics.jsonl
(``schedule`` events, ``update`` records), the agents' logs (``round N from vV``) and the agents'
telemetry, watched on the broker.

How the metrics say which choice governs which round (FedAvg, version V -> V+1 from base V): the
plug-in's events are written with an aggregation's records. At aggregation V the plug-in chooses
for the round from V (that batch's last event); choices it made on a tick (its first one, or a
re-choice after a timeout) wait for the next aggregation, so the batch's earlier events are
choices made during the round from V-1. An event that names its ``version`` is taken at its word.
"""
import re
import time
from collections import defaultdict
from typing import Any, Dict, List, Set

import pytest

from fleet import ModelWatcher
from streamfl.protocol.messages import Telemetry
from streamfl.methods.schedule.payloads import ScheduleStats

AGENTS = 4
MAX_DEVICES = 2
#: A skip outlasts a stalled round (FedAvg deadline) and the plug-in's re-choice after a timeout
#: (2 x T_max): an unchosen agent never resumes on its own while the fleet is healthy.
ROUND_INTERVAL_S = 0.5
SKIP_ROUNDS = 60  # 30 s
DEADLINE_S = 8.0
#: Rounds from the first choice that commanded every agent, checked in full.
CHECKED_ROUNDS = 3

AGENT = {
    "round_interval_s": ROUND_INTERVAL_S, "telemetry_interval_s": 0.5,
    "buffer_capacity": 64, "min_buffer": 32,
    # Rotating schedule frozen in its first phase: agent i streams classes {2i, 2i+1} mod 6.
    "sensor": {"kind": "synthetic", "windows_per_s": 50.0, "schedule": "rotating",
               "classes_per_phase": 2, "phase_s": 1.0e6},
    "plugins": {"schedule": {"stat_windows": 8}},
}
COORDINATOR = {
    "strategy": "fedavg",
    "fedavg": {"deadline_s": DEADLINE_S},
    "hparams": {"local_steps": 5},
    "eval_every_versions": 5,
    "plugins": {"schedule": {"policy": "fedteddi", "max_devices": MAX_DEVICES,
                             "skip_rounds": SKIP_ROUNDS, "deadline_s": DEADLINE_S}},
}
ROUND_LOG = re.compile(r"streamfl\.agent\.core: round \d+ from v(\d+)")


def agent_classes(index: int) -> Set[int]:
    return {(2 * index) % 6, (2 * index + 1) % 6}


def choices_by_round(metrics: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Every ``schedule`` event with ``base``, the global version the round it governs trains from."""
    out: List[Dict[str, Any]] = []
    version = 0
    batch: List[Dict[str, Any]] = []
    before: Dict[str, Any] = {}

    def flush() -> None:
        if before.get("event") == "update" and before.get("aggregated"):
            made = int(before["version"])
        else:  # a deadline closed the round on a tick: no update record names the new version
            made = version + 1
        for i, event in enumerate(batch):
            base = event["version"] if "version" in event else (made if i == len(batch) - 1 else made - 1)
            out.append(dict(event, base=int(base)))
        batch.clear()

    for rec in metrics:
        if rec.get("event") == "schedule":
            batch.append(rec)
            continue
        if batch:
            flush()
        if rec.get("event") in ("update", "eval") and "version" in rec:
            version = int(rec["version"])
        before = rec
    if batch:
        flush()
    return out


def analyse(run) -> Dict[str, Any]:
    metrics = run.metrics()
    choices = choices_by_round(metrics)
    updates = [m for m in metrics if m.get("event") == "update"]
    versions = max([int(u["version"]) for u in updates] or [0])
    chosen_for: Dict[int, Set[str]] = defaultdict(set)
    for c in choices:
        chosen_for[c["base"]].update(c["chosen"])
    # The first choice made with every agent online and reporting: from it on, every agent is
    # either told to train for one round or told to skip. The round it was made in may still
    # hold an update an agent started before it; the rounds after it are checked in full.
    full = [c for c in choices if c["candidates"] == AGENTS]
    first = full[0]["base"] + 1 if full else None
    checked = [] if first is None else [
        v for v in range(first, versions) if any(c["base"] == v for c in choices)]
    return {"metrics": metrics, "choices": choices, "updates": updates, "chosen_for": chosen_for,
            "first": first, "checked": checked, "versions": versions}


@pytest.mark.integration
@pytest.mark.timeout(150)
def test_fedteddi_selects_devices_and_unselected_agents_do_not_train(fleet, mqtt_broker):
    run = fleet(agent_overrides=AGENT, coordinator_overrides=COORDINATOR)
    devices = {run.device_id(i): i for i in range(AGENTS)}
    watcher = ModelWatcher(mqtt_broker.host, mqtt_broker.port, run.fleet, run.spec,
                           extra_topics=(run.topics.all_devices("telemetry"),))
    try:
        # Agents first: they say Hello and fill their buffers; then the coordinator's first model
        # reaches them all at once, so every agent reports before the choices settle.
        for i in range(AGENTS):
            run.start_agent(i)  # the demo config: sensor phase_offset 2i, user i + 1
        run.start_coordinator()

        def enough():
            a = analyse(run)
            return a if len(a["checked"]) >= CHECKED_ROUNDS else None
        a = run.wait_for(enough, 100, "%d aggregated rounds after a choice among all %d agents"
                         % (CHECKED_ROUNDS, AGENTS), poll_s=0.5)

        def telemetry_ok():
            return all(skipping_telemetry(run, watcher, a, d) for d in unchosen(a))
        run.wait_for(telemetry_ok, 20, "telemetry with schedule_stats from every skipping agent")
        telemetry_counts = {d: len(watcher.on_topic(run.topics.device(d, "telemetry")))
                            for d in devices}
    finally:
        watcher.close()
    run.stop_all()
    # The same rounds, read again once every process has stopped: an update of a checked round
    # that arrived late (stale) is in the metrics now.
    a = dict(analyse(run), checked=a["checked"])

    choices, chosen_for, updates = a["choices"], a["chosen_for"], a["updates"]
    diag = "\n".join(str(c) for c in choices[:30])
    # FedTeddi made the choices: several, bounded, and non-trivial (someone sat a round out).
    assert len(choices) >= 2, diag
    assert all(c["policy"] == "fedteddi" for c in choices), diag
    assert [c["round"] for c in choices] == list(range(len(choices))), diag  # none lost
    assert all(1 <= len(c["chosen"]) <= MAX_DEVICES for c in choices), diag
    assert all(set(c["chosen"]) <= set(devices) for c in choices), diag
    assert any(len(c["chosen"]) < c["candidates"] for c in choices), diag
    checked_choices = [c for c in choices if c["base"] in a["checked"]]
    assert any(set(devices) - set(c["chosen"]) for c in checked_choices), diag

    # Each checked round merged only updates of the devices chosen for it, and got at least one.
    for v in a["checked"]:
        merged = {u["device"] for u in updates if u["base_version"] == v
                  and u["outcome"] in ("buffered", "aggregated")}
        assert merged, (v, diag)
        assert merged <= chosen_for[v], (v, merged, chosen_for[v], diag)
        # An agent not chosen for the round did not train from its version at all: the
        # coordinator got no update of it from that version (merged, stale or otherwise) ...
        for d in set(devices) - chosen_for[v]:
            assert not [u for u in updates if u["device"] == d and u["base_version"] == v], (
                v, d, chosen_for[v], diag)
    # ... and the agent itself logged no round from it (its own account, not the coordinator's).
    trained = {d: [int(m) for m in ROUND_LOG.findall(run.agents[i].log_text())]
               for d, i in devices.items()}
    for v in a["checked"]:
        for d in set(devices) - chosen_for[v]:
            assert v not in trained[d], (v, d, trained[d], diag)
        # A chosen agent trains its round once (train: rounds=1), then waits to be told again.
        for d in chosen_for[v]:
            assert trained[d].count(v) <= 1, (v, d, trained[d])
    assert all(telemetry_counts[d] > 0 for d in devices), telemetry_counts
    codes = {p.name: p.popen.returncode for p in run.procs}
    assert set(codes.values()) == {0}, (codes, run.diagnostics())


def unchosen(a: Dict[str, Any]) -> Dict[str, float]:
    """Devices some checked choice left out, with the wall time of the first such choice."""
    out: Dict[str, float] = {}
    for c in a["choices"]:
        if c["base"] not in a["checked"]:
            continue
        for i in range(AGENTS):
            d = "demo-%02d" % (i + 1)
            if d not in c["chosen"] and d not in out:
                out[d] = float(c["wall_s"])
    return out


def skipping_telemetry(run, watcher: ModelWatcher, a: Dict[str, Any], device: str) -> bool:
    """The device reported its class counts in telemetry sent after it was told to skip: a
    ``schedule_stats`` extra of the model's classes, counting only the classes it streams."""
    since = unchosen(a)[device]
    index = int(device.split("-")[1]) - 1
    for _, msg in watcher.on_topic(run.topics.device(device, "telemetry")):
        if not isinstance(msg, Telemetry) or msg.time_s < since:
            continue
        stats = msg.extras.get(ScheduleStats.KIND)
        if not isinstance(stats, ScheduleStats) or len(stats.counts) != 6 or sum(stats.counts) == 0:
            continue
        seen = {c for c, n in enumerate(stats.counts) if n > 0}
        assert seen <= agent_classes(index), (device, stats)
        return True
    return False
