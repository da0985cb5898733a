"""Two boards with one device id under the SHIPPED broker config (TLS, passwords, ACL,
``use_username_as_clientid true``): two real ``streamfl-agent`` processes share ``demo-01``, its
account and its password, as boards flashed from one image do. Both detect the broker's take-over
cycle, say so and back off (the broker's log shows the take-overs slowing down), and the
coordinator process counts ``duplicate_device_id`` from their alternating Hellos."""
import json
import re
import sys
import time
from pathlib import Path

import pytest

from fleet import FleetRun
from streamfl.sim.demo import DemoOptions

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the repository root, for field/
from field.broker import ShippedBroker  # noqa: E402

DEVICE = "demo-01"
#: What mosquitto 2 logs when a second client connects with a client id already connected.
TAKEOVER = re.compile(r"^(\d+): Client (\S+) already connected, closing old connection", re.M)


def _takeovers(broker):
    return [int(t) for t, client in TAKEOVER.findall(broker.log_text()) if client == DEVICE]


@pytest.mark.timeout(120)
def test_two_boards_with_one_id_are_caught_on_both_sides_and_back_off(tmp_path):
    broker = ShippedBroker(tmp_path / "broker", devices=[DEVICE]).start()
    try:
        def mqtt(account, **more):
            return dict({"tls_ca": str(broker.ca_file), "username": account,
                         "password_file": str(broker.password_file(account))}, **more)

        # A tiny model, no predictions, slow rounds: the test is about connections, not learning.
        run = FleetRun(tmp_path / "fleet", broker.host, broker.port,
                       opts=DemoOptions(seed=0, model="mlp"),
                       agent_overrides={"round_interval_s": 5.0, "predict": {"enabled": False}})
        try:
            run.start_coordinator(mqtt=mqtt("coordinator"), exclusive={
                "probe_password_file": str(broker.password_file("coordinator-probe"))})
            agent = mqtt(DEVICE, reconnect_min_s=0.2, reconnect_max_s=1.0)
            first = run.start_agent(0, mqtt=agent)
            clone = run.start_agent(1, device_id=DEVICE, mqtt=agent)  # its own state folder
            said = "another board is probably using device id %s" % DEVICE
            run.wait_for(lambda: said in first.log_text() and said in clone.log_text(), 40,
                         "both agents to report the shared id")
            detected = time.time()
            counted = run.wait_for(
                lambda: [m for m in run.metrics() if m.get("event") == "duplicate_device_id"], 30,
                "the coordinator's duplicate_device_id event")
            assert counted[0]["device"] == DEVICE and counted[0]["instances"] == 2
            # Backing off: the take-overs the broker logs come slower and slower.
            time.sleep(max(0.0, detected + 12.0 - time.time()))
            end = time.time()
            takeovers = _takeovers(broker)
            log = run.coordinator.log_text()
        finally:
            run.stop_all()
    finally:
        broker.stop()
    assert len(takeovers) >= 4, broker.log_text()[-3000:]
    late = [t for t in takeovers if t >= end - 8]
    assert len(late) <= 3, "still fighting: %d take-overs in the last 8 s (%s)" % (len(late), takeovers)
    gaps = [b - a for a, b in zip(takeovers, takeovers[1:])]
    assert max(gaps) >= 4, "the take-over cycle did not slow down: %s" % takeovers
    for proc in (first, clone):
        text = proc.log_text()
        assert "Backing off: next reconnect in" in text
        assert "use_username_as_clientid" in text
    assert "device id %s is used by 2 agent processes" % DEVICE in log
    # The core's counter, kept in its state (and so across its restarts).
    state = json.loads((run.coordinator_state / "state.json").read_text())
    assert state["counters"]["duplicate_device_id"] >= 1
