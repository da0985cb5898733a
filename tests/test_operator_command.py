"""The operator's command channel over a real broker: ``send_operator_command`` (and ``streamfl
operator``) publish a ``Command`` on ``streamfl/v1/{fleet}/coordinator/command``, a real
``CoordinatorServer`` hands it to ``CoordinatorCore.on_operator``, and the ``sessions`` plug-in's
``new-session`` ends the session (a ``session`` event with ``what: boundary, reason: operator`` in
metrics.jsonl). A frame on that topic that is not a ``Command`` is counted and dropped.

The devices are plain paho clients publishing a retained Hello (as agents do) and, where a test
needs one, an update. The subscription of the coordinator is live once it handled those retained
Hellos: its filters go to the broker in one SUBSCRIBE, answered before any retained message.
"""
import json
import subprocess
import sys

import pytest

from factories import SPEC, UNBOUNDED_ADMISSION, make_hello, make_update
from polling import wait_until
from streamfl.cli import main as streamfl_main
from streamfl.config import build
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.metrics import read_metrics
from streamfl.coordinator.server import CoordinatorServer
from streamfl.errors import TransportError
from streamfl.operator import send_operator_command
from streamfl.protocol.codec import encode
from streamfl.protocol.topics import Topics
from streamfl.protocol.transport.base import MqttSettings
from streamfl.protocol.transport.paho import PahoTransport
from streamfl.sim.brokers import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

FLEET = "ops"
TOPICS = Topics(FLEET)
DEVICES = ("dev-a", "dev-b")


def _settings(broker, client_id: str, **kw) -> MqttSettings:
    kw.setdefault("persistent_session", False)
    return MqttSettings(host=broker.host, port=broker.port, client_id=client_id,
                        reconnect_min_s=0.2, reconnect_max_s=1.0, **kw)


class _Devices:
    """One paho client that speaks for the test's devices (retained Hellos, updates)."""

    def __init__(self, broker):
        self.transport = PahoTransport(_settings(broker, "test-devices"))
        self.transport.connect()
        wait_until(lambda: self.transport.connected, 10, "the devices' client to connect")

    def publish(self, topic: str, frame: bytes, retain: bool = False) -> None:
        probe = self.transport.publish_tracked(topic, frame, qos=1, retain=retain)
        assert probe is not None
        wait_until(probe, 10, "the broker's acknowledgement on %s" % topic)

    def hello(self, device_id: str) -> None:
        self.publish(TOPICS.device(device_id, "status"), encode(make_hello(device_id)), retain=True)

    def close(self) -> None:
        self.transport.close()


@pytest.fixture
def coordinator(mqtt_broker, tmp_path):
    """A running ``CoordinatorServer`` (sessions, ``init: previous``) whose two devices said Hello
    and whose first session started; yields ``(server, devices)``."""
    devices = _Devices(mqtt_broker)
    for device_id in DEVICES:
        devices.hello(device_id)
    config = build(CoordinatorConfig, {
        "fleet": FLEET, "model": SPEC, "persist_interval_s": 0.0, "admission": UNBOUNDED_ADMISSION,
        "plugins": {"sessions": {"init": "previous", "min_session_s": 0.0}}}, "test")
    server = CoordinatorServer(config, PahoTransport(_settings(mqtt_broker, "coordinator-ops",
                                                               persistent_session=True)),
                               tmp_path / "state", tmp_path / "run")
    server.start()
    try:
        sessions = _sessions(server)
        wait_until(lambda: set(server.core.online()) == set(DEVICES) and sessions.session == 0, 20,
                   "both devices online and session 0 started")
        yield server, devices
    finally:
        server.stop()
        devices.close()


def _sessions(server):
    return next(p for p in server.core.plugins if p.name == "sessions")


def _session_events(tmp_path):
    return [m for m in read_metrics(tmp_path / "run" / "metrics.jsonl") if m.get("event") == "session"]


def test_new_session_from_the_operator_ends_the_session(coordinator, mqtt_broker, tmp_path):
    server, devices = coordinator
    send_operator_command(_settings(mqtt_broker, "operator"), FLEET, "new-session", {}, timeout_s=10)
    sessions = _sessions(server)
    wait_until(lambda: sessions.session == 1, 20, "the operator's new session")
    assert server.core.counters["operator_commands"] == 1
    wait_until(lambda: any(e["what"] == "boundary" for e in _session_events(tmp_path)), 10,
               "the boundary event in metrics.jsonl")
    boundary = [e for e in _session_events(tmp_path) if e["what"] == "boundary"]
    assert len(boundary) == 1 and boundary[0]["reason"] == "operator", boundary
    assert boundary[0]["session"] == 1 and boundary[0]["devices"] == len(DEVICES), boundary
    assert [e["what"] for e in _session_events(tmp_path)] == ["start", "boundary"]
    assert server.healthy() and server.counters()["worker_errors"] == 0


def test_the_boundary_event_is_written_without_an_aggregation(coordinator, mqtt_broker, tmp_path):
    server, _ = coordinator
    send_operator_command(_settings(mqtt_broker, "operator"), FLEET, "new-session", {}, timeout_s=10)
    wait_until(lambda: _sessions(server).session == 1, 20, "the operator's new session")
    wait_until(lambda: any(e["what"] == "boundary" for e in _session_events(tmp_path)), 3,
               "the boundary event in metrics.jsonl (no update sent)")


def test_a_frame_that_is_not_a_command_is_dropped_and_counted(coordinator, mqtt_broker, tmp_path):
    server, devices = coordinator
    before = server.counters()
    devices.publish(TOPICS.coordinator_command, encode(make_hello("dev-a")))  # a message, not a Command
    devices.publish(TOPICS.coordinator_command, b"not a frame at all")
    wait_until(lambda: server.counters()["wrong_kind"] == before["wrong_kind"] + 1
               and server.counters()["frames_rejected"] == before["frames_rejected"] + 1, 10,
               "both frames counted")
    assert server.core.counters["operator_commands"] == 0 and _sessions(server).session == 0
    assert server.core.counters["hellos"] == before["hellos"]  # the Hello did not reach the core
    # The coordinator keeps running: the operator's command line is obeyed after them.
    code = streamfl_main(["operator", "new-session", "--broker", mqtt_broker.host,
                          "--port", str(mqtt_broker.port), "--fleet", FLEET, "--timeout", "10"])
    assert code == 0
    wait_until(lambda: _sessions(server).session == 1, 20, "the new session from 'streamfl operator'")
    assert server.core.counters["operator_commands"] == 1
    # A kind no running plug-in knows is answered with an error, and the session stays.
    reply = send_operator_command(_settings(mqtt_broker, "operator"), FLEET, "no-such-kind", {"x": 1}, 10)
    assert not reply.ok and reply.handled_by == [] and "no running plug-in handles" in reply.error, reply
    assert "sessions" in reply.error  # it names what runs
    assert server.core.counters["operator_commands"] == 2
    assert _sessions(server).session == 1 and server.healthy()
    assert server.counters()["worker_errors"] == 0


def test_operator_status_answers_with_the_live_fleet_table(coordinator, mqtt_broker, capsys):
    server, _ = coordinator
    reply = send_operator_command(_settings(mqtt_broker, "operator"), FLEET, "status", {}, timeout_s=10)
    assert reply.ok and reply.handled_by == ["coordinator"] and reply.run_id == server.core.run_id
    result = reply.result
    assert result["fleet"] == FLEET and result["run_id"] == server.core.run_id
    assert result["version"] == server.core.version and result["plugins"] == ["sessions"]
    rows = {row["device"]: row for row in result["devices"]}
    assert set(rows) == set(DEVICES) and all(row["online"] for row in rows.values()), rows
    # The command line prints it, as a table or as JSON, and exits 0.
    argv = ["operator", "status", "--broker", mqtt_broker.host, "--port", str(mqtt_broker.port),
            "--fleet", FLEET, "--timeout", "10"]
    capsys.readouterr()
    assert streamfl_main(argv) == 0
    table = capsys.readouterr().out
    assert all(d in table for d in DEVICES) and FLEET in table, table
    assert streamfl_main(argv + ["--json"]) == 0
    printed = capsys.readouterr().out  # under pytest, the in-process coordinator's log lines too
    answer = json.loads(printed[printed.index("{\n"):])
    assert answer["ok"] and {r["device"] for r in answer["result"]["devices"]} == set(DEVICES)
    # Status is the coordinator's own: no plug-in saw it.
    assert server.core.counters["operator_commands"] == 0


def test_a_kind_nobody_handles_exits_non_zero(coordinator, mqtt_broker, capsys):
    server, _ = coordinator
    code = streamfl_main(["operator", "no-such-kind", "--broker", mqtt_broker.host, "--port",
                          str(mqtt_broker.port), "--fleet", FLEET, "--timeout", "10"])
    err = capsys.readouterr().err
    assert code == 1 and "no running plug-in handles 'no-such-kind'" in err, err
    assert server.core.counters["operator_commands"] == 1 and server.healthy()


def test_no_answer_is_an_error_not_a_success(mqtt_broker):
    """No coordinator on the fleet: the broker acknowledges, nobody answers."""
    with pytest.raises(TransportError, match="no answer to the status command"):
        send_operator_command(_settings(mqtt_broker, "operator"), "nobody-here", "status", {}, timeout_s=1.5)


def _streamfl(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamfl.cli"] + list(argv), capture_output=True,
                          text=True, timeout=60)


def test_streamfl_operator_refuses_a_bad_kind_in_one_line():
    done = _streamfl("operator", "New Session", "--port", str(free_port()))
    assert done.returncode == 2 and done.stdout == "", done
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "'New Session'" in done.stderr and "kind" in done.stderr


def test_streamfl_operator_without_a_broker_fails_in_one_line():
    port = free_port()
    done = _streamfl("operator", "new-session", "--port", str(port), "--timeout", "1")
    assert done.returncode == 1 and done.stdout == "", done
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "localhost:%d" % port in done.stderr
    with pytest.raises(TransportError, match="within 0.5 s"):
        send_operator_command(MqttSettings(host="127.0.0.1", port=port, client_id="op",
                                           persistent_session=False), FLEET, "new-session", {}, 0.5)
