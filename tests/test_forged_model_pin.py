"""Without signing keys, over a real broker: a forged retained model with an empty run identity and
version 10^12 holds a fresh board only until the real coordinator's next model, is refused by a
board that follows a named run, and leaves no trace in checkpoints or updates once the real
coordinator (or one restarted on an empty state folder) publishes. What README's "Trust" says
remains open without keys is exactly the first part: a fresh board trains on the forgery until then.

A real ``AgentDaemon`` (threads, paho, state folder) and real ``CoordinatorServer``s on mosquitto;
the attacker and the test's watch on the agent's updates are plain paho clients.
"""
import threading

from factories import make_global_model
from polling import wait_until
from streamfl.agent.config import AgentConfig
from streamfl.agent.daemon import AgentDaemon
from streamfl.agent.state import StateDir
from streamfl.config import build
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.server import CoordinatorServer
from streamfl.models import ModelSpec, tensor_spec
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import Update
from streamfl.protocol.topics import Topics
from streamfl.protocol.transport.base import MqttSettings
from streamfl.protocol.transport.paho import PahoTransport
from streamfl.sensors import make_source

SPEC = ModelSpec(name="mlp", hidden=16)   # the sensor defaults: 6 channels, 50 samples
FLEET = "pinned"
TOPICS = Topics(FLEET)
FAST = {"reconnect_min_s": 0.2, "reconnect_max_s": 1.0}
HUGE = 10 ** 12


class Watch:
    """A paho client of the test: the base version of every update the agent publishes, in order."""

    def __init__(self, broker, client_id, device_id):
        self.decoder = Decoder({SPEC.arch_id: tensor_spec(SPEC)})
        self.bases = []
        self.lock = threading.Lock()
        self.t = PahoTransport(MqttSettings(host=broker.host, port=broker.port, client_id=client_id, **FAST))
        self.t.on_message = self._on_message
        self.t.subscribe(TOPICS.device(device_id, "update"), qos=1)
        self.t.connect()
        wait_until(lambda: self.t.connected, what="%s connected" % client_id)

    def _on_message(self, topic, payload):
        msg = self.decoder.try_decode(payload, source=topic)
        if isinstance(msg, Update):
            with self.lock:
                self.bases.append(msg.base_version)

    def seen(self):
        with self.lock:
            return list(self.bases)

    def publish_forged(self):
        """The measured attack: unnamed, v10^12, driving the boards as hard as they allow."""
        forged = make_global_model(SPEC, HUGE, 0.0, run_id="",
                                   hparams={"lr": 1.0, "batch_size": 1024, "local_steps": 10000})
        assert self.t.publish(TOPICS.model, encode(forged), qos=1, retain=True)

    def close(self):
        self.t.close()


def coordinator(broker, tmp_path, name):
    config = build(CoordinatorConfig, dict(fleet=FLEET, model=SPEC, alpha=0.6, staleness="constant",
                                           persist_interval_s=0.0,
                                           mqtt=dict(host=broker.host, port=broker.port, **FAST)), "test")
    transport = PahoTransport(config.mqtt.settings("coordinator", {}))
    server = CoordinatorServer(config, transport, tmp_path / ("state-" + name), tmp_path / ("run-" + name))
    server.start()
    return server


def checkpointed(state):
    """(run_id, global_version) of the agent's checkpoint on disk, None before the first."""
    found = state.load_checkpoint(SPEC.arch_id)
    return None if found is None else (found[1].get("run_id"), found[1]["global_version"])


def test_a_forged_unnamed_model_pins_no_board_past_the_real_coordinators_next_model(
        mqtt_broker, tmp_path, caplog):
    cfg = build(AgentConfig, dict(
        fleet=FLEET, device_id="pi-01", model=SPEC, min_buffer=16, buffer_capacity=256,
        round_interval_s=0.2, local_steps=2, batch_size=8, telemetry_interval_s=0,
        sensor={"windows_per_s": 400.0, "schedule": "all"},
        mqtt=dict(host=mqtt_broker.host, port=mqtt_broker.port, **FAST)), "test")
    watch = Watch(mqtt_broker, "attacker", "pi-01")
    watch.publish_forged()                            # retained: waiting for every board
    state = StateDir(tmp_path / "agent")
    daemon = AgentDaemon(cfg, PahoTransport(cfg.mqtt_settings({})), make_source(cfg.sensor, "pi-01"),
                         state.path)
    thread = threading.Thread(target=daemon.run, daemon=True)
    servers = []
    thread.start()
    try:
        # What stays open without keys: a fresh board follows the forgery, within its own limits.
        wait_until(lambda: checkpointed(state) == ("", HUGE), what="a round from the forged model")
        assert daemon.core.hparams["lr"] == 0.5 and daemon.core.hparams["local_steps"] == 500
        wait_until(lambda: HUGE in watch.seen(), what="an update from the forged model")

        # The real coordinator's next model (its first: a fresh state folder) takes it back.
        servers.append(coordinator(mqtt_broker, tmp_path, "a"))
        run_a = servers[0].core.run_id
        wait_until(lambda: daemon.core.gate.run_id == run_a, what="the agent back on the real run")
        real = servers[0].config.hparams.as_dict()           # the real run's, not the forgery's
        assert daemon.core.hparams["lr"] == real["lr"] and daemon.core.hparams["local_steps"] == real["local_steps"]
        wait_until(lambda: servers[0].core.counters["aggregated"] >= 2, what="updates of the real run")
        wait_until(lambda: (checkpointed(state) or ("", HUGE))[0] == run_a,
                   what="a checkpoint of the real run")
        assert checkpointed(state)[1] <= servers[0].core.version

        # A board that follows the real run refuses the forgery outright. It hears the model topic
        # only when it fetches, and each real update makes the coordinator overwrite the retained
        # forgery: the attacker publishes it again until a fetch takes it.
        wait_until(lambda: watch.publish_forged() or daemon.counters["unnamed_models"] >= 1,
                   what="the forgery refused")
        reached = servers[0].core.counters["aggregated"]
        wait_until(lambda: servers[0].core.counters["aggregated"] >= reached + 2, what="more rounds")
        assert daemon.core.gate.run_id == run_a and daemon.core.global_model.version < HUGE

        # The coordinator restarted on an empty state folder while the forgery is retained again.
        servers[0].stop()
        watch.publish_forged()
        wait_until(lambda: daemon.counters["unnamed_models"] >= 2, what="the forgery refused again")
        servers.append(coordinator(mqtt_broker, tmp_path, "fresh"))
        run_b = servers[1].core.run_id
        assert run_b != run_a
        wait_until(lambda: daemon.core.gate.run_id == run_b, what="the agent on the new run")
        wait_until(lambda: servers[1].core.counters["aggregated"] >= 2, what="updates of the new run")
        wait_until(lambda: (checkpointed(state) or ("", HUGE))[0] == run_b,
                   what="a checkpoint of the new run")
        assert checkpointed(state)[1] <= servers[1].core.version
    finally:
        daemon.stop()
        thread.join(30)
        for server in servers:
            server.stop()
        watch.close()
    bases = watch.seen()
    first_real = next(i for i, b in enumerate(bases) if b < HUGE)
    assert first_real >= 1 and HUGE not in bases[first_real:], bases   # none after the real model
    assert daemon.core.gate.resyncs == 2 and daemon.counters["run_alternations"] == 0
    assert not [r for r in caplog.records if "have v%d" % HUGE in r.getMessage()]
    unnamed = [r for r in caplog.records if "without a run identity" in r.getMessage()]
    assert len(unnamed) == 1                          # said once, then counted
