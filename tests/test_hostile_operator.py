"""A hostile client floods the coordinator's command topic with ``new-session``.

Measured before the operator gate: one ``new-session`` frame replayed once a second by any client
of a broker without an ACL made 30 sessions in 30 s, and 60 of 60 honest updates were withheld
(every session begins with an auxiliary round whose updates, and the updates still trained from
the model before each switch, stay out of the strategy).

Here, over real mosquitto, a real ``CoordinatorServer`` (FedAsync, the ``sessions`` plug-in with
``session-init``, so each boundary runs an auxiliary round from the pilot) and two honest devices
(one paho client that follows the retained model and sends each device's update every
``ROUND_S``, trained from the newest version it has seen) face an attacker on the same broker:

- with an operator key pinned, the operator's signed command is obeyed once; its frame replayed
  every 0.2 s, unsigned commands and commands signed by another key change nothing (not a session,
  not an update withheld), also after the coordinator restarted on its state folder, and the
  operator is still obeyed afterwards;
- without a key, the same frame replayed is obeyed once; an attacker who stamps every frame anew
  is held to ``max_per_minute`` commands and one session per ``min_session_s`` of the fleet
  training its own model, which bounds the share of honest updates withheld; the same flood
  against a coordinator without those two limits withholds nearly all of them (the control that
  shows the measure can fail).
"""
import threading
import time

import pytest

from factories import SPEC, UNBOUNDED_ADMISSION, make_hello, make_update
from polling import wait_until
from streamfl.config import build
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.server import CoordinatorServer
from streamfl.models import tensor_spec
from streamfl.operator import operator_payload, send_operator_command
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import Command, GlobalModel
from streamfl.protocol.signing import generate_key_pair
from streamfl.protocol.topics import Topics
from streamfl.protocol.transport.base import MqttSettings
from streamfl.protocol.transport.paho import PahoTransport

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FLEET = "hostile-ops"
TOPICS = Topics(FLEET)
DEVICES = ("dev-a", "dev-b")
#: Each honest device sends an update this often, trained from the newest model it has seen.
ROUND_S = 0.3
#: The attacker publishes a command this often.
FLOOD_EVERY_S = 0.2
#: The sessions plug-in: an auxiliary round closes when both devices answered (or after 1 s).
SESSIONS = {"init": "session-init", "pilot_sessions": 1, "aux_wait_s": 1.0, "settle_s": 0.5,
            "silence_s": 0.0}
ADMISSION = dict(UNBOUNDED_ADMISSION, max_updates_per_s=50.0)


def _settings(broker, client_id: str, persistent: bool = False) -> MqttSettings:
    return MqttSettings(host=broker.host, port=broker.port, client_id=client_id,
                        persistent_session=persistent, reconnect_min_s=0.2, reconnect_max_s=1.0)


class HonestFleet:
    """Two devices behind one paho client: retained Hellos, then each device's update every
    ``ROUND_S`` from the newest global version seen (as an agent trains from the model it has)."""

    def __init__(self, broker):
        self.decoder = Decoder({SPEC.arch_id: tensor_spec(SPEC)})
        self.version = 0
        self.sent = 0
        self.transport = PahoTransport(_settings(broker, "honest-devices"))
        self.transport.on_message = self._on_message
        self.transport.subscribe(TOPICS.model, qos=1)
        self.transport.connect()
        wait_until(lambda: self.transport.connected, 10, "the devices' client to connect")
        for device_id in DEVICES:
            probe = self.transport.publish_tracked(TOPICS.device(device_id, "status"),
                                                   encode(make_hello(device_id)), qos=1, retain=True)
            wait_until(probe, 10, "the broker's acknowledgement of %s's Hello" % device_id)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._train, name="honest-devices", daemon=True)
        self._thread.start()

    def _on_message(self, topic: str, payload: bytes) -> None:
        msg = self.decoder.try_decode(payload, source=topic)
        if isinstance(msg, GlobalModel):
            self.version = max(self.version, msg.version)

    def _train(self) -> None:
        while not self._stop.wait(ROUND_S):
            for i, device_id in enumerate(DEVICES):
                update = make_update(SPEC, 0.1 * (i + 1), device_id=device_id, base_version=self.version)
                self.transport.publish(TOPICS.device(device_id, "update"), encode(update), qos=1)
                self.sent += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.transport.close()


class Attacker:
    """A plain client that publishes the given payloads on the command topic in turn, every
    ``FLOOD_EVERY_S`` (a payload may be a function of the time: an attacker stamping anew)."""

    def __init__(self, broker):
        self.transport = PahoTransport(_settings(broker, "attacker"))
        self.transport.connect()
        wait_until(lambda: self.transport.connected, 10, "the attacker to connect")
        self.sent = 0

    def flood(self, payloads, duration_s: float) -> None:
        deadline = time.monotonic() + duration_s
        i = 0
        while time.monotonic() < deadline:
            payload = payloads[i % len(payloads)]
            payload = payload() if callable(payload) else payload
            assert self.transport.publish(TOPICS.coordinator_command, payload, qos=1)
            self.sent += 1
            i += 1
            time.sleep(FLOOD_EVERY_S)

    def close(self) -> None:
        self.transport.close()


def _config(sessions=None, operator=None) -> CoordinatorConfig:
    return build(CoordinatorConfig, {
        "fleet": FLEET, "model": SPEC, "strategy": "fedasync", "persist_interval_s": 0.0,
        "admission": ADMISSION, "plugins": {"sessions": dict(SESSIONS, **(sessions or {}))},
        "operator": operator or {}}, "test")


def _server(broker, tmp_path, config) -> CoordinatorServer:
    server = CoordinatorServer(config, PahoTransport(_settings(broker, "coordinator-" + FLEET, True)),
                               tmp_path / "state", tmp_path / "run")
    server.start()
    return server


def _sessions(server):
    return next(p for p in server.core.plugins if p.name == "sessions")


def _wait_training(server, sessions_number: int, versions: int = 4) -> None:
    """Until session ``sessions_number`` trains its own model and aggregated ``versions`` past its
    switch: every update from then on was trained from the session's own model."""
    plugin = _sessions(server)
    wait_until(lambda: plugin.session == sessions_number and plugin.aux_round == 0
               and server.core.version >= plugin.fence_version + versions, 30,
               "session %d training its own model" % sessions_number)


def _outcomes(server) -> dict:
    c = server.core.counters
    return {"received": c["updates_received"], "aggregated": c["aggregated"], "withheld": c["withheld"]}


def _since(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before}


@pytest.fixture
def honest(mqtt_broker):
    fleet = HonestFleet(mqtt_broker)
    try:
        yield fleet
    finally:
        fleet.close()


@pytest.fixture
def attacker(mqtt_broker):
    client = Attacker(mqtt_broker)
    try:
        yield client
    finally:
        client.close()


def test_with_an_operator_key_replayed_unsigned_and_foreign_commands_change_nothing(
        mqtt_broker, tmp_path, honest, attacker):
    key_file, _, public = generate_key_pair(tmp_path / "keys", "operator")
    other_key, _, _ = generate_key_pair(tmp_path / "keys", "intruder")
    config = _config(sessions={"min_session_s": 1.0}, operator={"public_keys": [public]})
    server = _server(mqtt_broker, tmp_path, config)
    try:
        plugin = _sessions(server)
        wait_until(lambda: plugin.session == 0 and server.core.version >= 3, 30, "session 0 training")
        # The operator's signed command is obeyed; the attacker captured its frame on the wire.
        captured = operator_payload(FLEET, "new-session", {}, signing_key_file=str(key_file))
        assert attacker.transport.publish(TOPICS.coordinator_command, captured, qos=1)
        _wait_training(server, 1)
        assert server.counters()["operator_accepted"] == 1
        boundaries = server.core.counters["switches"]

        def unsigned():
            return encode(Command("new-session", seq=int(time.time() * 1e6)))

        def foreign():
            return operator_payload(FLEET, "new-session", {}, signing_key_file=str(other_key))

        before = _outcomes(server)
        attacker.flood([captured, unsigned, foreign], duration_s=4.0)
        wait_until(lambda: server.counters()["operator_replayed"] + server.counters()["operator_unsigned"]
                   + server.counters()["operator_bad_signature"] >= attacker.sent - 1, 10,
                   "every attack frame counted")
        time.sleep(2 * ROUND_S)
        during = _since(before, _outcomes(server))
        counters = server.counters()
        assert counters["operator_accepted"] == 1
        assert counters["operator_replayed"] >= 5 and counters["operator_unsigned"] >= 5
        assert counters["operator_bad_signature"] >= 5
        assert plugin.session == 1 and not plugin._operator_pending
        assert server.core.counters["switches"] == boundaries
        assert during["received"] >= 20 and during["withheld"] == 0, during
        assert during["aggregated"] == during["received"], during
    finally:
        server.stop()

    # A restart on the same state folder does not reopen the replay.
    server = _server(mqtt_broker, tmp_path, config)
    try:
        plugin = _sessions(server)
        wait_until(lambda: plugin.session == 1 and set(server.core.online()) == set(DEVICES), 20,
                   "the restarted coordinator with both devices")
        assert attacker.transport.publish(TOPICS.coordinator_command, captured, qos=1)
        wait_until(lambda: server.counters()["operator_replayed"] == 1, 10, "the replay dropped")
        assert server.counters()["operator_accepted"] == 0 and plugin.session == 1
        # The operator is still obeyed (the attackers used up no rate): a fresh signed command.
        wait_until(lambda: plugin._old_enough(server.clock()), 10, "session 1 to be min_session_s old")
        send_operator_command(_settings(mqtt_broker, "operator"), FLEET, "new-session", {},
                              timeout_s=10, signing_key_file=str(key_file))
        wait_until(lambda: plugin.session == 2, 10, "the operator's second new session")
        assert server.counters()["operator_accepted"] == 1
    finally:
        server.stop()


#: The limits under test without a key: at most this many commands obeyed a minute, and the fleet
#: trains its own model this long between two boundaries.
MAX_PER_MINUTE = 6
MIN_SESSION_S = 3.0
FLOOD_S = 12.0


def _flood_without_a_key(mqtt_broker, tmp_path, sessions, operator, attacker):
    """Session 0 trains; the attacker replays one stamped frame for a third of ``FLOOD_S``, then
    stamps every frame anew for the rest. Returns the server, the updates of the whole flood and
    of its second part, the sessions it made and the replays dropped."""
    server = _server(mqtt_broker, tmp_path, _config(sessions=sessions, operator=operator))
    try:
        plugin = _sessions(server)
        wait_until(lambda: plugin.session == 0 and server.core.version >= 3, 30, "session 0 training")
        before, started = _outcomes(server), plugin.session
        first = encode(Command("new-session", seq=int(time.time() * 1e6)))

        def fresh():  # what an attacker does once replays fail: stamp every frame anew
            return encode(Command("new-session", seq=int(time.time() * 1e6)))

        attacker.flood([first], duration_s=FLOOD_S / 3)  # the same frame, replayed
        replayed = server.counters()["operator_replayed"]
        middle = _outcomes(server)
        attacker.flood([fresh], duration_s=FLOOD_S * 2 / 3)
        time.sleep(2 * ROUND_S)
        after = _outcomes(server)
        return server, _since(before, after), _since(middle, after), plugin.session - started, replayed
    except BaseException:
        server.stop()
        raise


def _withheld_share(outcomes: dict) -> float:
    assert outcomes["received"] >= 30, outcomes
    return outcomes["withheld"] / float(outcomes["received"])


@pytest.mark.parametrize("max_per_minute", [MAX_PER_MINUTE, 3600], ids=["rate-limited", "min-session-alone"])
def test_without_a_key_the_rate_and_min_session_s_bound_the_updates_withheld(
        mqtt_broker, tmp_path, honest, attacker, max_per_minute):
    server, flood, fresh, sessions, replayed = _flood_without_a_key(
        mqtt_broker, tmp_path, {"min_session_s": MIN_SESSION_S}, {"max_per_minute": max_per_minute},
        attacker)
    try:
        counters = server.counters()
        # The replayed frame was obeyed once; the fresh ones are cut to the rate.
        assert replayed >= 10, counters
        if max_per_minute == MAX_PER_MINUTE:
            assert counters["operator_accepted"] <= MAX_PER_MINUTE
            assert counters["operator_rate_limited"] >= 20, counters
        else:  # the rate lets every fresh one through: min_session_s alone holds the bound
            assert counters["operator_accepted"] >= 30 and counters["operator_rate_limited"] == 0, counters
        # A boundary at most every MIN_SESSION_S of the fleet training its own model.
        assert 1 <= sessions <= int(FLOOD_S // MIN_SESSION_S) + 1, sessions
        # A boundary withholds the updates of its auxiliary round (both devices answer within a
        # round or two, aux_wait_s = 1 s at most) and those trained from the model before its
        # switch (a round): W <= aux_wait_s + 2 rounds + a tick (0.5 s) = 2.1 s, and each is
        # followed by at least MIN_SESSION_S of updates that count: at most 2.1 / 5.1 = 41 % withheld.
        w_s = SESSIONS["aux_wait_s"] + 2 * ROUND_S + 0.5
        bound = w_s / (w_s + MIN_SESSION_S)
        for outcomes in (flood, fresh):
            assert _withheld_share(outcomes) <= bound, (outcomes, bound, sessions)
            assert outcomes["aggregated"] >= (1 - bound) * outcomes["received"], outcomes
    finally:
        server.stop()


def test_without_those_limits_the_same_flood_withholds_nearly_every_update(
        mqtt_broker, tmp_path, honest, attacker):
    """The control: no minimum session and no useful rate; the bound above then fails."""
    server, _, fresh, sessions, _ = _flood_without_a_key(
        mqtt_broker, tmp_path, {"min_session_s": 0.0}, {"max_per_minute": 3600}, attacker)
    try:
        assert sessions >= 6, sessions
        assert _withheld_share(fresh) >= 0.7, fresh
    finally:
        server.stop()
