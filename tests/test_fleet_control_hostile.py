"""Fleet control against hostile clients, over a real broker (anonymous, so any client may publish
anywhere, as on a broker without the shipped ACL): a real ``CoordinatorServer`` with a signing key,
one real ``streamfl-agent`` process pinning its public key, and a plain paho client that plays a
board (``dev-h``) and an attacker.

- The agent ignores a ``pause`` nobody signed, one signed by another key and a replay of a real
  signed one (its ``logs`` answer shows the lines that say so), and obeys the real ones;
- the coordinator drops and counts a board's answers that are oversized, not a ``DeviceReply``,
  from another device than their topic names, for a command it did not send, of the wrong shape,
  a second copy, and one that comes after the wait; the good answer is still taken.
"""
import threading
import time

import pytest

from factories import make_hello
from fleet import FleetRun
from polling import wait_until
from streamfl.config import build
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.server import CoordinatorServer
from streamfl.operator import send_operator_command
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.control import MAX_REPLY_BYTES
from streamfl.protocol.messages import Command, DeviceReply
from streamfl.protocol.signing import Ed25519Signer, NullVerifier, generate_key_pair
from streamfl.protocol.topics import Topics
from streamfl.protocol.transport.base import MqttSettings
from streamfl.protocol.transport.paho import PahoTransport
from streamfl.sim.demo import FLEET, DemoOptions

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

AGENT, HOSTILE = "demo-01", "dev-h"
TOPICS = Topics(FLEET)


def _settings(broker, client_id: str, persistent: bool = False) -> MqttSettings:
    return MqttSettings(host=broker.host, port=broker.port, client_id=client_id,
                        persistent_session=persistent, reconnect_min_s=0.2, reconnect_max_s=1.0)


class Client:
    """A paho client that keeps what arrives on its subscriptions and publishes with an ack."""

    def __init__(self, broker, client_id, topics=()):
        self.got = []
        self.transport = PahoTransport(_settings(broker, client_id))
        self.transport.on_message = lambda topic, payload: self.got.append((topic, bytes(payload)))
        for topic in topics:
            self.transport.subscribe(topic, qos=1)
        self.transport.connect()
        wait_until(lambda: self.transport.connected and self.transport.subscribed, 10,
                   "the test client %s to connect" % client_id)

    def publish(self, topic, payload, retain=False):
        probe = self.transport.publish_tracked(topic, payload, qos=1, retain=retain)
        wait_until(probe, 10, "the broker's acknowledgement on %s" % topic)

    def on(self, topic):
        return [payload for t, payload in self.got if t == topic]


@pytest.fixture
def lab(tmp_path, mqtt_broker):
    keys = tmp_path / "keys"
    key_file, _, public = generate_key_pair(keys)
    run = FleetRun(tmp_path / "fleet", mqtt_broker.host, mqtt_broker.port,
                   opts=DemoOptions(seed=0, model="mlp"),
                   agent_overrides={"predict": {"enabled": False}, "coordinator_public_key": public})
    config = build(CoordinatorConfig, run.coordinator_config(
        signing_key_file=str(key_file), operator={"max_per_minute": 120}), "test")
    server = CoordinatorServer(config, PahoTransport(_settings(mqtt_broker, "coordinator-h", True)),
                               tmp_path / "state", tmp_path / "run")
    server.start()
    hostile = Client(mqtt_broker, "hostile", [TOPICS.device(HOSTILE, "command"),
                                              TOPICS.device(AGENT, "command")])
    try:
        hostile.publish(TOPICS.device(HOSTILE, "status"), encode(make_hello(HOSTILE)), retain=True)
        run.start_agent(0)
        run.wait_for(lambda: {AGENT, HOSTILE} <= set(server.core.online()), 40,
                     "the agent and the hostile board online")
        yield server, run, hostile, keys, mqtt_broker
    finally:
        run.stop_all()
        server.stop()
        hostile.transport.close()


def _op(broker, kind, params, timeout_s=10.0):
    return send_operator_command(_settings(broker, "operator-%d" % time.monotonic_ns()), FLEET, kind,
                                 params, timeout_s=timeout_s)


def test_the_agent_obeys_only_the_coordinators_signed_fresh_commands(lab):
    server, run, hostile, keys, broker = lab
    topic = TOPICS.device(AGENT, "command")
    other = Ed25519Signer.from_file(generate_key_pair(keys, name="attacker")[0])
    hostile.publish(topic, encode(Command("pause")))                                 # unsigned
    hostile.publish(topic, other.sign(topic, encode(Command("pause", run_id=server.core.run_id,
                                                            seq=2 ** 60))))          # forged
    reply = _op(broker, "logs", {"devices": [AGENT], "wait_s": 5.0})
    assert reply.ok, reply
    lines = reply.result["devices"][AGENT]["answer"]["lines"]
    assert any("unsigned" in line for line in lines) and any("bad_signature" in line for line in lines), lines
    state = run.agent_state(0) / "control.json"
    assert not state.exists()  # neither paused it (a real pause writes it)
    # A real pause and resume are obeyed; the captured pause replayed is not.
    reply = _op(broker, "pause", {"devices": AGENT, "wait_s": 5.0})
    assert reply.ok and reply.result["devices"][AGENT]["answer"] == {"paused": True, "was_paused": False}
    wait_until(lambda: len(hostile.on(topic)) == 4, 10, "the logs and pause commands at the hostile client")
    captured = hostile.on(topic)[-1]
    reply = _op(broker, "resume", {"devices": AGENT, "wait_s": 5.0})
    assert reply.ok and reply.result["devices"][AGENT]["answer"] == {"paused": False, "was_paused": True}
    hostile.publish(topic, captured)
    reply = _op(broker, "logs", {"devices": AGENT, "lines": 20, "wait_s": 5.0})
    assert reply.ok, reply
    lines = reply.result["devices"][AGENT]["answer"]["lines"]
    assert len(lines) <= 20 and any("ignoring replayed pause command" in line for line in lines), lines
    assert '"paused": false' in state.read_text()


def test_hostile_board_answers_are_dropped_and_counted(lab):
    server, _, hostile, _, broker = lab
    command_topic, reply_topic = TOPICS.device(HOSTILE, "command"), TOPICS.device(HOSTILE, "reply")
    answers = []
    worker = threading.Thread(target=lambda: answers.append(
        _op(broker, "pause", {"devices": HOSTILE, "wait_s": 8.0}, timeout_s=15.0)))
    worker.start()
    wait_until(lambda: hostile.on(command_topic), 10, "the relayed pause at the hostile board")
    command = Decoder({}).decode(NullVerifier().open(command_topic, hostile.on(command_topic)[0]))
    assert isinstance(command, Command) and command.kind == "pause" and command.run_id == server.core.run_id

    def reply(**kw):
        fields = dict(device_id=HOSTILE, kind="pause", seq=command.seq, ok=True,
                      result={"paused": True, "was_paused": False}, run_id=command.run_id)
        fields.update(kw)
        return encode(DeviceReply(**fields))

    before = server.counters()
    hostile.publish(reply_topic, reply(device_id="dev-other"))                       # wrong device
    hostile.publish(reply_topic, reply(seq=command.seq + 1))                          # never sent
    hostile.publish(reply_topic, reply(result={"lines": ["x" * 100] * 1000}))         # oversized
    assert len(reply(result={"lines": ["x" * 100] * 1000})) > MAX_REPLY_BYTES
    hostile.publish(reply_topic, reply(result={"paused": "yes"}))                     # wrong shape
    hostile.publish(reply_topic, reply(kind="logs"))                                  # another kind
    hostile.publish(reply_topic, encode(make_hello(HOSTILE)))                         # not a reply
    hostile.publish(reply_topic, b"\x00garbage")                                      # not a frame
    hostile.publish(reply_topic, reply())                                             # the answer
    worker.join(20)
    assert answers and answers[0].ok, answers
    assert answers[0].result["devices"] == {HOSTILE: {"state": "answered", "answer": {
        "paused": True, "was_paused": False}}}
    hostile.publish(reply_topic, reply())                                             # again
    # One more command the board lets time out, then answers.
    late = _op(broker, "resume", {"devices": HOSTILE, "wait_s": 1.0})
    assert not late.ok and late.result["devices"][HOSTILE]["state"] == "timed_out", late
    assert "1 of 1 board(s) did not answer: dev-h timed out" in late.error
    second = Decoder({}).decode(NullVerifier().open(command_topic, hostile.on(command_topic)[-1]))
    hostile.publish(reply_topic, reply(kind="resume", seq=second.seq))
    expected = {"control_reply_wrong_device": 1, "control_reply_unsolicited": 2,
                "control_reply_oversized": 1, "control_reply_malformed": 2,
                "control_reply_wrong_kind": 1, "control_reply_duplicate": 1, "control_reply_late": 1,
                "control_replies_accepted": 1}
    wait_until(lambda: {k: server.counters()[k] - before[k] for k in expected} == expected, 10,
               "every hostile answer counted: %s" % expected)
    assert server.healthy() and server.counters()["worker_errors"] == 0
