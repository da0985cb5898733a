"""Hostile frames over a real broker: a poisoned or scaled update leaves accuracy where an honest run
has it; with a pinned key, forged models and commands are refused and a reset coordinator followed.

Everything here goes through mosquitto with the real server, transports and agent code; the honest
devices are ``AgentCore``s the test drives round by round (each waits for the model its previous
update produced), so the attacked and the clean run see the same sequence of versions.
"""
import threading

import numpy as np

from factories import make_global_model, make_hello, make_update
from hostile import FAST, FLEET, SPEC, TOPICS, Client, coordinator, honest_agent
from polling import updates_handled, wait_for, wait_until
from streamfl.agent.config import AgentConfig
from streamfl.agent.daemon import AgentDaemon
from streamfl.config import build
from streamfl.models import ModelSpec
from streamfl.protocol.codec import encode
from streamfl.protocol.messages import Command
from streamfl.protocol.signing import Ed25519Signer, generate_key_pair
from streamfl.protocol.transport.paho import PahoTransport
from streamfl.sensors import make_source


def run_fleet(broker, tmp_path, name, attack):
    """Three honest devices take turns for 12 rounds; ``attack`` also sends the poison. Accuracy."""
    server = coordinator(broker, tmp_path, name)
    devices = []
    try:
        agents = []
        for i in range(3):
            agents.append(honest_agent(i))
            devices.append(Client(broker, "%s-pi-%d" % (name, i)))
        mallory = Client(broker, "%s-mallory" % name)
        ghost = Client(broker, "%s-ghost" % name)
        devices += [mallory, ghost]
        for agent, dev in zip(agents, devices):
            dev.send("status", make_hello(agent.device_id, SPEC), agent.device_id)
        mallory.send("status", make_hello("mallory", SPEC), "mallory")    # registered, then hostile
        wait_until(lambda: len(server.core.online()) == 4, what="devices registered")
        assert wait_for(lambda: devices[0].version() == 0, timeout_s=10)
        for rnd in range(12):
            for k, (agent, dev) in enumerate(zip(agents, devices)):
                version = server.core.version
                assert wait_for(lambda: dev.version() == version, timeout_s=10), (dev.version(), version)
                agent.on_global_model(dev.model)
                dev.send("update", agent.train_round(), agent.device_id)
                assert wait_for(lambda: server.core.version == version + 1, timeout_s=10)
                if attack and rnd in (2, 6) and k == 0:
                    base = dev.model
                    done = updates_handled(server.core)
                    mallory.send("update", make_update(SPEC, 1e30, device_id="mallory",
                                                       base_version=base.version), "mallory")
                    scaled = {n: t * np.float32(1000) for n, t in base.tensors.items()}
                    mallory.send("update", make_update(SPEC, device_id="mallory", tensors=scaled,
                                                       base_version=base.version), "mallory")
                    ghost.send("update", make_update(SPEC, 1e30, device_id="ghost"), "ghost")
                    assert wait_for(lambda: updates_handled(server.core) == done + 3)
        accuracy, _ = server.evaluator.evaluate(server.core.model)
        return accuracy, server.counters()
    finally:
        for dev in devices:
            dev.close()
        server.stop()


def test_poisoned_and_scaled_updates_leave_accuracy_where_an_honest_run_has_it(mqtt_broker, tmp_path):
    clean, _ = run_fleet(mqtt_broker, tmp_path, "clean", attack=False)
    attacked, counters = run_fleet(mqtt_broker, tmp_path, "attacked", attack=True)
    assert clean > 0.9, clean                                   # the fleet learns the task at all
    assert abs(attacked - clean) <= 0.02, (clean, attacked)
    assert counters["admission_rejected_magnitude"] == 2        # 1e30 from mallory, twice
    assert counters["admission_rejected_norm"] == 2             # x1000 from mallory, twice
    assert counters["admission_rejected_unknown_device"] == 2   # ghost never said Hello


# ---- signed models and commands --------------------------------------------------------------

AGENT_SPEC = ModelSpec(name="mlp", hidden=16)   # the sensor defaults: 6 channels, 50 samples


def test_a_pinned_key_refuses_forgeries_and_follows_a_reset_coordinator(mqtt_broker, tmp_path):
    key_path, _, public = generate_key_pair(tmp_path / "keys")
    agent_cfg = build(AgentConfig, dict(
        fleet=FLEET, device_id="pi-01", model=AGENT_SPEC, min_buffer=16, buffer_capacity=256,
        round_interval_s=0.2, local_steps=2, batch_size=8, coordinator_public_key=public,
        sensor={"windows_per_s": 400.0, "schedule": "all"},
        mqtt=dict(host=mqtt_broker.host, port=mqtt_broker.port, **FAST)), "test")
    attacker = Client(mqtt_broker, "attacker", spec=AGENT_SPEC)
    forged = make_global_model(AGENT_SPEC, 10 ** 12, 0.0, run_id="forged",
                               hparams={"lr": 1.0, "batch_size": 1024, "local_steps": 10000})
    attacker.t.publish(TOPICS.model, encode(forged), qos=1, retain=True)    # waiting for every board
    transport = PahoTransport(agent_cfg.mqtt_settings({}))
    daemon = AgentDaemon(agent_cfg, transport, make_source(agent_cfg.sensor, "pi-01"), tmp_path / "agent")
    thread = threading.Thread(target=daemon.run, daemon=True)
    server = None
    thread.start()
    try:
        wait_until(lambda: daemon.counters["unsigned"] >= 1, what="the forged model refused")
        assert daemon.core.global_model is None
        server = coordinator(mqtt_broker, tmp_path, "a", model=AGENT_SPEC, eval_path=None,
                             signing_key_file=str(key_path))
        wait_until(lambda: daemon.counters["updates_sent"] >= 2, what="training on the signed model")
        assert daemon.core.gate.run_id == server.core.run_id and daemon.core.hparams["lr"] == 0.01
        topic = TOPICS.device("pi-01", "command")
        attacker.t.publish(topic, encode(Command("skip", {"rounds": 100000})), qos=1)
        wait_until(lambda: daemon.counters["unsigned"] >= 2, what="the forged command refused")
        foreign = Ed25519Signer.from_file(generate_key_pair(tmp_path / "other")[0])
        attacker.t.publish(topic, foreign.sign(topic, encode(Command("skip", {"rounds": 5}))), qos=1)
        wait_until(lambda: daemon.counters["bad_signature"] >= 1, what="another key's command refused")
        assert not daemon.core.skipping
        real = Ed25519Signer.from_file(key_path)       # what the coordinator's plug-ins would send
        stamped = Command("skip", {"rounds": 100000}, run_id=server.core.run_id, seq=1)
        attacker.t.publish(topic, real.sign(topic, encode(stamped)), qos=1)
        wait_until(lambda: daemon.core.skipping, what="the signed skip obeyed")
        assert daemon.core.orders.skip_rounds == agent_cfg.max_skip_rounds          # and bounded
        attacker.t.publish(topic, real.sign(topic, encode(stamped)), qos=1)    # replayed
        wait_until(lambda: daemon.counters["rejected_commands"] >= 1, what="the replay refused")
        attacker.t.publish(topic, real.sign(topic, encode(Command("train", run_id=server.core.run_id,
                                                                  seq=2))), qos=1)
        wait_until(lambda: not daemon.core.skipping, what="train obeyed")
        old_run, reached = server.core.run_id, server.core.version
        wait_until(lambda: daemon.core.global_model.version >= 1, what="a few versions")
        server.stop()
        server = coordinator(mqtt_broker, tmp_path, "fresh", model=AGENT_SPEC, eval_path=None,
                             signing_key_file=str(key_path))     # a new state folder: version 0
        assert server.core.run_id != old_run
        wait_until(lambda: daemon.core.gate.run_id == server.core.run_id, what="resync to the new run")
        assert daemon.core.gate.resyncs == 1 and reached >= 1
        wait_until(lambda: server.core.counters["aggregated"] >= 1, what="updates to the new run")
    finally:
        daemon.stop()
        thread.join(30)
        if server is not None:
            server.stop()
        attacker.close()
