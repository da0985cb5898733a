"""A board's downlink is bounded by its own rounds, over a real mosquitto: the agent holds the model
topic subscribed only while it wants a model (agent/model_feed.py), so it receives about one model
per round it starts, and one model after being away for any number of versions, never a backlog.

The coordinator side is a plain paho client that publishes signed-like frames the way the real
coordinator does (each version retained, QoS 1), far faster than the agent's rounds.
"""
import threading
import time

import pytest

from netproxy import CuttableProxy
from polling import wait_until
from test_agent_daemon import DEV, FLEET, SPEC, make_config

from streamfl.agent.daemon import AgentDaemon
from streamfl.models import build_model, model_to_arrays
from streamfl.protocol.codec import encode
from streamfl.protocol.messages import GlobalModel
from streamfl.protocol.topics import Topics
from streamfl.protocol.transport.base import MqttSettings
from streamfl.protocol.transport.paho import PahoTransport
from streamfl.sensors import make_source

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FAST = dict(keepalive_s=5, reconnect_min_s=0.1, reconnect_max_s=0.3)


class Publisher:
    """Publishes global model versions retained at QoS 1, as the coordinator's publisher does."""

    def __init__(self, broker):
        self.t = PahoTransport(MqttSettings(host=broker.host, port=broker.port,
                                            client_id="coordinator", **FAST),
                               max_queued_messages=1000)
        self.t.connect()
        assert self.t.wait_connected(10)
        self.topic = Topics(FLEET).model
        self.tensors = model_to_arrays(build_model(SPEC, seed=1))
        self.version = 0

    def publish(self, n=1):
        """Publish ``n`` new versions; return once the broker has acknowledged them all."""
        for _ in range(n):
            self.version += 1
            frame = encode(GlobalModel(version=self.version, arch_id=SPEC.arch_id, run_id="r1",
                                       tensors=self.tensors))
            acked = self.t.publish_tracked(self.topic, frame, qos=1, retain=True)
            assert acked is not None
        wait_until(acked, what="the broker acknowledged the versions")  # PUBACKs come in order

    def close(self):
        self.t.close()


class Board:
    """A real AgentDaemon on paho through a cuttable link to the broker."""

    def __init__(self, broker, state_dir, **over):
        self.proxy = CuttableProxy(broker.host, broker.port)
        self.config = make_config(**over)
        self.transport = PahoTransport(MqttSettings(host="127.0.0.1", port=self.proxy.port,
                                                    client_id=DEV, persistent_session=True, **FAST))
        self.daemon = AgentDaemon(self.config, self.transport, make_source(self.config.sensor, DEV),
                                  state_dir)
        self.thread = threading.Thread(target=self.daemon.run, daemon=True)
        self.thread.start()
        wait_until(lambda: self.transport.connected, what="agent connected")

    @property
    def models(self):
        return self.daemon.counters["models_received"]

    @property
    def rounds(self):
        return self.daemon.counters["rounds"]

    def close(self):
        self.daemon.stop()
        self.thread.join(30)
        self.proxy.close()
        assert not self.thread.is_alive()


@pytest.fixture
def publisher(mqtt_broker):
    pub = Publisher(mqtt_broker)
    yield pub
    pub.close()


def test_an_online_board_gets_one_model_per_round_it_starts(mqtt_broker, publisher, tmp_path):
    publisher.publish()
    board = Board(mqtt_broker, tmp_path / "state", round_interval_s=0.2)
    try:
        wait_until(lambda: board.rounds >= 2, what="two rounds")
        # Versions come far faster than rounds: 20 a second for three seconds.
        for _ in range(60):
            publisher.publish()
            time.sleep(0.05)
        rounds, models = board.rounds, board.models
        assert rounds >= 4, rounds
        # One model per round started (the round in progress may have fetched one), one at start.
        assert models <= rounds + 2, (models, rounds, board.daemon.counters)
        assert board.daemon.core.global_model.version > 1          # it does follow the new ones
        fetched = board.daemon.counters["model_fetches"] + board.daemon.counters["model_fetches_skipped"]
        assert fetched >= rounds - 1, board.daemon.counters
    finally:
        board.close()


def test_a_board_away_for_many_versions_gets_one_model_when_it_comes_back(mqtt_broker, publisher,
                                                                           tmp_path):
    # No model yet: the board holds the subscription (a standing want), the worst case for a
    # backlog, since the broker's persistent session still has the filter while the board is away.
    board = Board(mqtt_broker, tmp_path / "state", round_interval_s=60.0)
    try:
        wait_until(lambda: board.daemon.feed.subscribed, what="subscribed while wanting a model")
        board.proxy.cut()
        wait_until(lambda: not board.transport.connected, what="the board is away")
        publisher.publish(200)                          # versions 1..200 while it is away
        board.proxy.restore()
        wait_until(lambda: board.models >= 1, what="a model after coming back")
        time.sleep(1.0)                                 # a backlog would arrive now
        assert board.models == 1, board.daemon.counters
        assert board.daemon.core.global_model.version == 200         # the newest, retained one
        assert not board.daemon.feed.subscribed          # it has one: no more versions come
        publisher.publish(20)
        time.sleep(0.5)
        assert board.models == 1, board.daemon.counters
    finally:
        board.close()


def test_a_fetch_that_loses_the_broker_starts_the_round_from_the_model_held(mqtt_broker, publisher,
                                                                            tmp_path):
    publisher.publish()
    board = Board(mqtt_broker, tmp_path / "state", round_interval_s=0.2, model_fetch_timeout_s=600.0)
    try:
        wait_until(lambda: board.rounds >= 2, what="two rounds")
        # The retained model goes (an empty retained message clears it), so the next fetch waits:
        # no model can come until the coordinator publishes one.
        acked = publisher.t.publish_tracked(publisher.topic, b"", qos=1, retain=True)
        wait_until(acked, what="the retained model cleared")
        rounds = board.rounds
        wait_until(lambda: board.daemon.feed.subscribed and board.rounds == rounds,
                   what="a fetch waiting for a model")
        time.sleep(0.5)
        assert board.rounds == rounds  # waiting, as it should while the broker is there
        board.proxy.cut()
        # The fetch ends with the connection, not after its 600 s: the board trains on, into
        # its outbox.
        wait_until(lambda: board.rounds >= rounds + 2, timeout_s=15,
                   what="rounds from the model held after the broker went away")
        assert board.daemon.counters["model_fetches_cut"] >= 1, board.daemon.counters
        assert board.daemon.counters["model_fetch_timeouts"] == 0, board.daemon.counters
    finally:
        board.close()
