"""Faults against a real mosquitto: an agent cut off the network keeps training into its on-disk
outbox and flushes it on return; malformed, oversized, NaN and wrong-architecture frames are
rejected and counted by the coordinator and by an agent while training goes on."""
import threading
import time
from pathlib import Path

import numpy as np
import paho.mqtt.client as mqtt
import pytest
import yaml
from paho.mqtt.enums import CallbackAPIVersion

from factories import make_update
from fleet import ModelWatcher
from netproxy import CuttableProxy
from streamfl.models import build_model, model_to_arrays
from streamfl.protocol.codec import encode
from streamfl.protocol.messages import Command, GlobalModel, Hello, Offline

MIB = 1024 * 1024


def _frames(outbox: Path):
    return sorted(outbox.glob("*.frame")) if outbox.is_dir() else []


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_agent_cut_off_queues_updates_on_disk_and_flushes_them_after(fleet, mqtt_broker):
    run = fleet()
    proxy = CuttableProxy(mqtt_broker.host, mqtt_broker.port)
    cut_dev = run.device_id(1)
    status_topic = run.topics.device(cut_dev, "status")
    watcher = ModelWatcher(mqtt_broker.host, mqtt_broker.port, run.fleet, run.spec,
                           extra_topics=(status_topic,))
    try:
        run.start_coordinator()
        run.start_agent(0)
        agent = run.start_agent(1, port=proxy.port)        # its only way to the broker is the proxy
        outbox = run.agent_state(1) / "outbox"
        run.wait_for(lambda: sum(u["device"] == cut_dev for u in run.updates()) >= 2, 120,
                     "two updates from %s through the proxy" % cut_dev)

        cut_at = time.monotonic()
        mark_cut = len(run.metrics())
        proxy.cut()
        # The broker sees the socket die without DISCONNECT: it publishes the agent's last will,
        # and the coordinator counts the device offline.
        run.wait_for(lambda: [m for t, m in watcher.on_topic(status_topic)
                              if t >= cut_at and isinstance(m, Offline) and m.reason == "lost"],
                     20, "the last will of %s" % cut_dev)
        run.wait_for(lambda: any(e["devices_online"] == 1 for e in run.evals(mark_cut)), 30,
                     "the coordinator to count one device online")
        # Offline, the agent keeps training; every update waits on disk.
        queued = len(run.wait_for(lambda: len(_frames(outbox)) >= 4 and _frames(outbox), 60,
                                  "4 updates in %s" % outbox))
        assert agent.alive, run.diagnostics()
        version_at_restore = run.version()
        mark = len(run.metrics())
        restored_at = time.monotonic()
        proxy.restore()

        run.wait_for(lambda: not _frames(outbox), 60, "the outbox to empty")

        def queued_updates():
            """Updates of the cut device, received after the restore, trained before it."""
            got = [u for u in run.updates(mark) if u["device"] == cut_dev
                   and u["base_version"] < version_at_restore]
            return got if len(got) >= queued else None
        late = run.wait_for(queued_updates, 30, "the %d queued updates of %s at the coordinator"
                            % (queued, cut_dev))
        # Trained offline from an old model: stale on arrival, yet aggregated (FedAsync weighting).
        assert all(u["staleness"] > 0 and u["outcome"] == "aggregated" for u in late), late
        # Back online: a new Hello, and fresh updates trained from models published after restore.
        run.wait_for(lambda: [m for t, m in watcher.on_topic(status_topic)
                              if t >= restored_at and isinstance(m, Hello)], 20,
                     "a Hello from %s after the restore" % cut_dev)
        run.wait_for(lambda: [u for u in run.updates(mark) if u["device"] == cut_dev
                              and u["base_version"] > version_at_restore], 60,
                     "a fresh update from %s" % cut_dev)
        assert agent.alive, run.diagnostics()
        assert "outbox: sent" in agent.log_text(), agent.tail()
    finally:
        run.stop_all()              # while the proxy still forwards, so the agent exits cleanly
        watcher.close()
        proxy.close()


class RawClient:
    """A plain paho client that publishes arbitrary bytes, as an attacker or a buggy device could."""

    def __init__(self, host, port, client_id="test-raw"):
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                                  protocol=mqtt.MQTTv311)
        self.client.connect(host, port, 30)
        self.client.loop_start()

    def send(self, topic: str, payload: bytes, retain: bool = False) -> None:
        info = self.client.publish(topic, payload, qos=1, retain=retain)
        info.wait_for_publish(10)
        assert info.is_published(), topic

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _update(spec, device_id, **changes):
    """A well-formed Update of ``spec`` (changed by ``changes``) that the codec encodes as is."""
    changes.setdefault("tensors", model_to_arrays(build_model(spec)))
    return make_update(spec, device_id=device_id, update_id="bad-%s" % time.monotonic_ns(), **changes)


def _wait(predicate, timeout_s, what, diagnostics=lambda: ""):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError("timed out after %.0f s waiting for %s\n%s" % (
                timeout_s, what, diagnostics()))
        time.sleep(0.1)


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_bad_frames_are_rejected_and_counted_while_training_goes_on(fleet, mqtt_broker, tmp_path):
    """Coordinator and one agent in-process (their counters are visible), one agent process."""
    from streamfl.agent.config import load_agent_config
    from streamfl.agent.daemon import AgentDaemon
    from streamfl.coordinator.config import load_config
    from streamfl.coordinator.server import CoordinatorServer
    from streamfl.protocol.transport.paho import PahoTransport
    from streamfl.sensors import make_source

    run = fleet()
    spec = run.spec
    over = {"mqtt": {"host": mqtt_broker.host, "port": mqtt_broker.port}}
    coord_yaml = tmp_path / "coordinator.yaml"
    coord_yaml.write_text(yaml.safe_dump(run.coordinator_config(max_frame_bytes=MIB)))
    ccfg = load_config(coord_yaml, over)
    server = CoordinatorServer(ccfg, PahoTransport(ccfg.mqtt.settings("coordinator-" + run.fleet)),
                               run.coordinator_state, run.run_dir)
    agent_yaml = tmp_path / "agent.yaml"
    agent_yaml.write_text(yaml.safe_dump(run.agent_config(1, max_frame_bytes=MIB)))
    acfg = load_agent_config(agent_yaml, over)
    transport = PahoTransport(acfg.mqtt_settings())
    daemon = AgentDaemon(acfg, transport, make_source(acfg.sensor, acfg.device_id),
                         run.agent_state(1))
    agent_thread = threading.Thread(target=daemon.run, name="test-agent", daemon=True)
    raw = None
    server.start()
    try:
        run.start_agent(0)
        agent_thread.start()

        def diag():
            return "coordinator %s\nagent %s\n%s" % (server.counters(), daemon.counters,
                                                     run.diagnostics())

        victim = run.device_id(0)
        # The frames below speak as the agent process: admission counts an update of a device that
        # has not said hello yet as unknown, so wait for its hello too (the version can reach 3 on
        # the in-process agent's updates alone).
        _wait(lambda: server.core.version >= 3 and daemon.counters["updates_sent"] >= 1
              and server.core.registry.greeted(victim), 120,
              "3 versions, an update from the in-process agent and the agent process's hello", diag)

        raw = RawClient(mqtt_broker.host, mqtt_broker.port)
        update_topic = run.topics.device(victim, "update")
        good = encode(_update(spec, victim))
        bad_version = bytearray(good)
        bad_version[3] = 99                                      # frame format byte
        wrong_shape = {k: np.zeros((3,) + a.shape, np.float32) if i == 0 else a
                       for i, (k, a) in enumerate(model_to_arrays(build_model(spec)).items())}
        nan_tensors = model_to_arrays(build_model(spec))
        first = next(iter(nan_tensors))
        nan_tensors[first] = nan_tensors[first].copy()
        nan_tensors[first].flat[0] = np.nan
        to_coordinator = [
            b"\x00\x01definitely not a frame",                             # malformed
            good + bytes(2 * MIB),                                         # oversize (limit 1 MiB)
            encode(_update(spec, victim, tensors=nan_tensors)),            # NaN: admission's
            encode(_update(spec, victim, arch_id="mlp-c6-w50-k6-h16")),    # arch_mismatch
            encode(_update(spec, victim, tensors=wrong_shape)),            # arch_mismatch (shape)
            bytes(bad_version),                                            # bad_version
        ]
        before = server.counters()
        for frame in to_coordinator:
            raw.send(update_topic, frame)
        # The NaN update decodes (the coordinator's decoder leaves an update's NaN/Inf check to
        # admission's own pass over it) and admission rejects it as beyond every magnitude.
        expected = {"rejected_malformed": 1, "rejected_oversize": 1, "rejected_non_finite": 0,
                    "admission_rejected_magnitude": 1, "rejected_arch_mismatch": 2,
                    "rejected_bad_version": 1}

        def counted():
            now = server.counters()
            return all(now[k] - before[k] == n for k, n in expected.items())
        _wait(counted, 60, "the coordinator to count %s" % expected, diag)

        # The agent: the same kinds of garbage on the shared model topic and on its command topic.
        # A NaN model claims a huge version: accepted, it would freeze the agent. A board hears
        # the model topic only while it asks for a model (agent/model_feed.py), so the attacker
        # overwrites the retained model with each piece of garbage, again and again, until a
        # board's fetch takes it (the coordinator's next version overwrites it back).
        huge = 10 ** 6
        gm_nan = GlobalModel(version=huge, arch_id=spec.arch_id, tensors=nan_tensors)
        gm_other = GlobalModel(version=huge, arch_id="mlp-c6-w50-k6-h16",
                               tensors=model_to_arrays(build_model(spec)))
        command_topic = run.topics.device(daemon.device_id, "command")
        to_model = [(b"garbage", "malformed"), (encode(gm_nan), "non_finite"),
                    (encode(gm_other), "arch_mismatch")]
        to_commands = [b"\xff" * 64,                                     # malformed
                       encode(Command("train")) + bytes(2 * MIB)]        # oversize
        rounds_before = daemon.counters["rounds"]
        for frame, reason in to_model:
            seen = daemon.decoder.rejected.get(reason, 0)

            def taken():
                raw.send(run.topics.model, frame, retain=True)
                return daemon.decoder.rejected.get(reason, 0) > seen
            _wait(taken, 60, "a fetch to take the %s model frame" % reason, diag)
        # The last garbage stays retained until the coordinator's next version: a fetch meanwhile
        # counts it again, so the model topic's counts are "at least once", the commands' exact.
        agent_before = dict(daemon.decoder.rejected)
        for frame in to_commands:
            raw.send(command_topic, frame)
        agent_expected = {"malformed": 1, "oversize": 1}

        def agent_counted():
            now = daemon.decoder.rejected
            return all(now[k] - agent_before.get(k, 0) == n for k, n in agent_expected.items())
        _wait(agent_counted, 60, "the agent to count %s" % agent_expected, diag)

        # Training goes on everywhere: new versions, and the in-process agent keeps taking them.
        version = server.core.version
        _wait(lambda: server.core.version >= version + 6, 60, "6 more versions", diag)
        _wait(lambda: daemon.counters["rounds"] >= rounds_before + 3
              and daemon.core.base_version > version, 60,
              "the agent to train from a model newer than v%d" % version, diag)
        assert daemon.core.global_model.version < huge
        assert server.healthy() and agent_thread.is_alive()
        counters = server.counters()
        assert counters["worker_errors"] == 0, counters
        # Nothing bad got past the decoder but the NaN update, which admission rejected.
        assert counters["rejected"] == 1 and counters["admission_rejected_magnitude"] == 1, counters
        assert all(np.isfinite(v).all() for v in server.core.model.values())
        assert daemon.counters["round_errors"] == 0, daemon.counters
        run.check_alive()
    finally:
        if raw is not None:
            raw.close()
        daemon.stop()
        if agent_thread.is_alive():
            agent_thread.join(30)
        run.stop_all()
        server.stop()
