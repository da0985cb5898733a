"""The agent daemon over the in-memory broker: updates reach a (fake) coordinator, broker loss fills
the outbox and reconnect flushes it in order, bad frames never reach the core, clean shutdown."""
import threading

import numpy as np
import pytest

from polling import wait_until

from streamfl.agent.config import AgentConfig
from streamfl.agent.daemon import AgentDaemon
from streamfl.agent.state import StateDir
from streamfl.config import build
from streamfl.models import ModelSpec, build_model, model_to_arrays, save_checkpoint, tensor_spec
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import Command, GlobalModel, Hello, Offline, Telemetry, Update
from streamfl.protocol.topics import Topics
from streamfl.protocol.transport.memory import MemoryBroker, MemoryTransport
from streamfl.sensors import make_source

SPEC = ModelSpec(name="mlp", hidden=16)  # 6 channels, 50 samples, 6 classes: the sensor defaults
FLEET = "test"
DEV = "dev-1"


class FakeCoordinator:
    """A test-side MQTT client: publishes the retained global model and collects device frames."""

    def __init__(self, broker):
        self.topics = Topics(FLEET)
        self.decoder = Decoder({SPEC.arch_id: tensor_spec(SPEC)})
        self.updates, self.status, self.telemetry = [], [], []
        self.lock = threading.Lock()
        self.t = MemoryTransport(broker, "coordinator")
        self.t.on_message = self.on_message
        self.t.subscribe(self.topics.all_devices("update"))
        self.t.subscribe(self.topics.all_devices("status"))
        self.t.subscribe(self.topics.all_devices("telemetry"), qos=0)
        self.t.connect()

    def on_message(self, topic, payload):
        msg = self.decoder.decode(payload)
        with self.lock:
            {Update: self.updates, Hello: self.status, Offline: self.status,
             Telemetry: self.telemetry}[type(msg)].append(msg)

    def publish_model(self, version, seed=1, **hparams):
        gm = GlobalModel(version=version, arch_id=SPEC.arch_id, hparams=hparams,
                         tensors=model_to_arrays(build_model(SPEC, seed=seed)))
        self.t.publish(self.topics.model, encode(gm), qos=1, retain=True)
        return gm

    def command(self, kind, **params):
        self.t.publish(self.topics.device(DEV, "command"), encode(Command(kind, params)), qos=1)


def make_config(**over):
    values = dict(fleet=FLEET, device_id=DEV, model=SPEC, min_buffer=16, buffer_capacity=256,
                  round_interval_s=0.1, local_steps=3, batch_size=8, telemetry_interval_s=0.1,
                  sensor={"windows_per_s": 400.0, "schedule": "all"})
    values.update(over)
    return build(AgentConfig, values, "test")


class Running:
    """A daemon running in a thread, stopped and joined at exit."""

    def __init__(self, broker, state_dir, source=None, agent_dvfs=None, **over):
        self.config = make_config(**over)
        self.transport = MemoryTransport(broker, DEV)
        self.source = source or make_source(self.config.sensor, DEV)
        self.daemon = AgentDaemon(self.config, self.transport, self.source, state_dir,
                                  dvfs=agent_dvfs)
        self.thread = threading.Thread(target=self.daemon.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        wait_until(lambda: self.transport.connected, what="agent connected")
        return self.daemon

    def __exit__(self, *exc):
        self.daemon.stop()
        self.thread.join(30)
        assert not self.thread.is_alive()


@pytest.fixture
def broker():
    return MemoryBroker()


def test_updates_reach_the_coordinator(broker, tmp_path):
    coord = FakeCoordinator(broker)
    coord.publish_model(3, lr=0.05)
    with Running(broker, tmp_path / "state") as daemon:
        wait_until(lambda: len(coord.updates) >= 2, what="two updates")
        wait_until(lambda: coord.telemetry, what="telemetry")
        assert daemon.core.hparams["lr"] == 0.05
    first, second = coord.updates[:2]
    assert first.device_id == DEV and first.arch_id == SPEC.arch_id
    assert first.base_version == 3 and first.num_samples == 3 * 8
    assert [first.round_index, second.round_index] == [0, 1]
    assert set(first.tensors) == set(tensor_spec(SPEC))
    assert isinstance(coord.status[0], Hello) and coord.status[0].device_id == DEV
    assert coord.telemetry[0].buffer_capacity == 256
    # Clean shutdown: retained Offline("shutdown") replaces the Hello, and a checkpoint is written.
    assert isinstance(coord.status[-1], Offline) and coord.status[-1].reason == "shutdown"
    retained = coord.decoder.decode(broker.retained[coord.topics.device(DEV, "status")])
    assert isinstance(retained, Offline) and retained.reason == "shutdown"
    found = StateDir(tmp_path / "state").load_checkpoint(SPEC.arch_id)
    assert found is not None
    assert found[1]["round_index"] == daemon.core.rounds >= 2
    assert found[1]["global_version"] == 3 and found[1]["device_id"] == DEV
    assert daemon.counters["updates_sent"] == daemon.counters["rounds"] == daemon.core.rounds


def test_broker_away_updates_go_to_outbox_and_flush_in_order(broker, tmp_path):
    coord = FakeCoordinator(broker)
    coord.publish_model(1)
    with Running(broker, tmp_path / "state", round_interval_s=0.05) as daemon:
        wait_until(lambda: len(coord.updates) >= 1, what="first update")
        broker.drop(DEV)
        lost = coord.decoder.decode(broker.retained[coord.topics.device(DEV, "status")])
        assert isinstance(lost, Offline) and lost.reason == "lost"  # the last will
        sent_before = daemon.counters["updates_sent"]
        wait_until(lambda: daemon.counters["updates_queued"] >= 3, what="queued updates")
        assert list((tmp_path / "state" / "outbox").glob("*.frame"))
        daemon.transport.connect()  # the network is back; the memory transport connects at once
        assert daemon.counters["outbox_len"] == 0  # flushed by on_connect, not by a later round
        wait_until(lambda: len(coord.updates) >= sent_before + 3, what="flushed updates")
        wait_until(lambda: daemon.counters["outbox_len"] == 0, what="empty outbox")
    rounds = [u.round_index for u in coord.updates]
    assert rounds == sorted(rounds) and len(set(rounds)) == len(rounds)
    assert rounds == list(range(len(rounds)))  # nothing lost, nothing reordered
    assert isinstance(coord.status[-1], Offline)
    hellos = [m for m in coord.status if isinstance(m, Hello)]
    assert len(hellos) == 2  # announced again on reconnect


def test_bad_frames_are_rejected_and_commands_applied(broker, tmp_path):
    coord = FakeCoordinator(broker)
    with Running(broker, tmp_path / "state", round_interval_s=30.0) as daemon:
        topics = coord.topics
        coord.t.publish(topics.device(DEV, "command"), b"garbage", qos=1)
        other = ModelSpec(name="mlp", hidden=32)
        wrong = GlobalModel(version=9, arch_id=other.arch_id,
                            tensors=model_to_arrays(build_model(other)))
        coord.t.publish(topics.model, encode(wrong), qos=1, retain=True)
        assert daemon.counters["rejected_frames"] == 2
        assert daemon.core.global_model is None
        coord.publish_model(2)
        wait_until(lambda: len(coord.updates) == 1, what="first update")
        coord.command("override", local_steps=2)
        coord.command("train")  # starts a round now despite round_interval_s = 30
        wait_until(lambda: len(coord.updates) == 2, what="update after train command")
        assert coord.updates[1].num_samples == 2 * 8
        assert daemon.counters["commands_received"] == 2


class EndingSource:
    """A sensor source that yields a few windows and then fails, like an unplugged IMU."""

    def __init__(self, inner, n):
        self.inner, self.n = inner, n

    def windows(self):
        from streamfl.errors import SensorError
        for i, w in enumerate(self.inner.windows()):
            if i == self.n:
                raise SensorError("IMU unplugged")
            yield w

    def close(self):
        self.inner.close()


def test_training_continues_after_the_sensor_fails(broker, tmp_path, caplog):
    coord = FakeCoordinator(broker)
    coord.publish_model(1)
    source = EndingSource(make_source(make_config().sensor, DEV), 20)
    with Running(broker, tmp_path / "state", source=source) as daemon:
        wait_until(lambda: len(coord.updates) >= 3, what="updates after sensor failure")
        assert daemon.counters["windows"] == 20
    assert "IMU unplugged" in caplog.text


def test_resume_from_checkpoint_and_ignore_other_arch(broker, tmp_path):
    state = tmp_path / "state"
    coord = FakeCoordinator(broker)
    coord.publish_model(5)
    with Running(broker, state):
        wait_until(lambda: len(coord.updates) >= 2, what="updates")
    rounds_before = StateDir(state).load_checkpoint(SPEC.arch_id)[1]["round_index"]
    coord.updates.clear()
    with Running(broker, state) as daemon:
        assert daemon.core.rounds == rounds_before and daemon.core.base_version == 5
        wait_until(lambda: coord.updates, what="update after restart")
    assert coord.updates[0].round_index == rounds_before
    assert coord.updates[0].base_version == 5
    # A checkpoint of another architecture is ignored.
    other = ModelSpec(name="mlp", hidden=8)
    save_checkpoint(StateDir(state).checkpoint_path, model_to_arrays(build_model(other)),
                    {"arch_id": other.arch_id, "global_version": 1, "round_index": 7})
    daemon = AgentDaemon(make_config(), MemoryTransport(broker, "x"), make_source(make_config().sensor, DEV),
                         state)
    assert daemon.core.rounds == 0


def test_unwritable_state_dir_is_a_clear_storage_error(tmp_path):
    from streamfl.errors import StorageError
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StorageError, match="state directory .* not writable"):
        StateDir(blocker / "state").prepare()


def test_full_disk_never_stops_the_agent(broker, tmp_path):
    import errno

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    coord = FakeCoordinator(broker)
    coord.publish_model(1)
    config = make_config(round_interval_s=0.05)
    transport = MemoryTransport(broker, DEV)
    daemon = AgentDaemon(config, transport, make_source(config.sensor, DEV), tmp_path / "state",
                         outbox_writer=full)
    thread = threading.Thread(target=daemon.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: coord.updates, what="first update")
        broker.drop(DEV)
        wait_until(lambda: daemon.counters["updates_queued"] >= 2, what="queued in memory")
        assert daemon.counters["outbox_write_errors"] >= 2
        n = len(coord.updates)
        transport.connect()
        wait_until(lambda: len(coord.updates) >= n + 2, what="flush from memory")
    finally:
        daemon.stop()
        thread.join(30)
    assert np.all(np.diff([u.round_index for u in coord.updates]) == 1)


def test_sd_notify_ready_watchdog_and_stopping(broker, tmp_path):
    import socket as socketlib

    from streamfl.notify import SystemdNotifier
    sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify.sock"))
    sock.settimeout(10.0)
    notifier = SystemdNotifier(str(tmp_path / "notify.sock"), watchdog_usec=200000)
    config = make_config()
    daemon = AgentDaemon(config, MemoryTransport(broker, DEV), make_source(config.sensor, DEV),
                         tmp_path / "state", notifier=notifier)
    thread = threading.Thread(target=daemon.run, daemon=True)
    thread.start()
    try:
        got = []
        while not any(m == b"WATCHDOG=1" for m in got):
            got.append(sock.recv(256))
        assert got[0].startswith(b"READY=1")
    finally:
        daemon.stop()
        thread.join(30)
    rest = []
    sock.settimeout(0.5)
    try:
        while True:
            rest.append(sock.recv(256))
    except socketlib.timeout:
        pass
    sock.close()
    assert b"STOPPING=1" in rest


@pytest.mark.integration
@pytest.mark.timeout(120)
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_cli_against_mosquitto_trains_and_stops_cleanly_on_signal(mqtt_broker, tmp_path, signame):
    """``python -m streamfl.agent`` with PahoTransport: Hello, updates, SIGTERM/SIGINT -> exit 0,
    retained Offline("shutdown"), checkpoint on disk."""
    import signal
    import subprocess
    import sys

    from streamfl.protocol.transport.base import MqttSettings
    from streamfl.protocol.transport.paho import PahoTransport

    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        "fleet: %s\ndevice_id: cli-1\nmodel: {name: mlp, hidden: 16}\nmin_buffer: 16\n"
        "round_interval_s: 0.2\nlocal_steps: 2\nbatch_size: 8\ntelemetry_interval_s: 0.5\n"
        "sensor: {windows_per_s: 200.0, schedule: all}\nmqtt: {reconnect_min_s: 0.1, "
        "reconnect_max_s: 1.0}\n" % FLEET)
    topics = Topics(FLEET)
    decoder = Decoder({SPEC.arch_id: tensor_spec(SPEC)})
    got = []
    coord = PahoTransport(MqttSettings(host=mqtt_broker.host, port=mqtt_broker.port,
                                       client_id="coordinator", persistent_session=False))
    coord.on_message = lambda topic, payload: got.append(decoder.decode(payload))
    coord.subscribe(topics.all_devices("update"))
    coord.subscribe(topics.all_devices("status"))
    coord.connect()
    assert coord.wait_connected(10)
    gm = GlobalModel(version=4, arch_id=SPEC.arch_id, tensors=model_to_arrays(build_model(SPEC)))
    coord.publish(topics.model, encode(gm), qos=1, retain=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamfl.agent", "--config", str(cfg), "--broker", mqtt_broker.host,
         "--port", str(mqtt_broker.port), "--state-dir", str(tmp_path / "state")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: sum(isinstance(m, Update) for m in got) >= 2, 60, "updates over MQTT")
        assert any(isinstance(m, Hello) and m.device_id == "cli-1" for m in got)
        proc.send_signal(getattr(signal, signame))
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out.decode(errors="replace")[-3000:]
    wait_until(lambda: isinstance(got[-1], Offline), 10, "offline status")
    assert got[-1].reason == "shutdown"
    updates = [m for m in got if isinstance(m, Update)]
    assert updates[0].base_version == 4 and updates[0].device_id == "cli-1"
    assert (tmp_path / "state" / "checkpoint.safetensors").exists()
    coord.close()


def test_mqtt_sensor_source_shares_the_transport(broker, tmp_path):
    """Windows published on the device's sensor topic reach the buffer through the daemon's
    transport (the daemon forwards topics it does not own to the source's handler)."""
    from streamfl.sensors import SensorConfig, encode_window_binary, synthetic_dataset

    coord = FakeCoordinator(broker)
    coord.publish_model(1)
    config = make_config(sensor={"kind": "mqtt"})
    transport = MemoryTransport(broker, DEV)
    source = make_source(config.sensor, DEV, transport=transport, fleet=FLEET)
    daemon = AgentDaemon(config, transport, source, tmp_path / "state")
    thread = threading.Thread(target=daemon.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: transport.connected, what="agent connected")
        X, Y, _ = synthetic_dataset(40, users=[0], seed=0, cfg=SensorConfig())
        from streamfl.sensors.window import Window
        for x, y in zip(X, Y):
            coord.t.publish(coord.topics.device(DEV, "sensor"), encode_window_binary(Window(x, y)))
        wait_until(lambda: daemon.counters["windows"] == 40, what="windows from MQTT")
        wait_until(lambda: coord.updates, what="update trained on MQTT windows")
        assert daemon.counters["unexpected_messages"] == 0
    finally:
        daemon.stop()
        thread.join(30)
