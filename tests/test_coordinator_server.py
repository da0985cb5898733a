"""CoordinatorServer over the in-memory transport: updates -> retained models, bad frames counted,
coalesced publishing, restart, last wills, evaluation and metrics lines."""
import json
import threading
import time

import numpy as np
import pytest

from polling import wait_for

from factories import UNBOUNDED_ADMISSION, make_hello, make_update
from streamfl.coordinator.admission import AdmissionConfig
from streamfl.coordinator.config import CoordinatorConfig, FedAvgConfig
from streamfl.coordinator.evaluation import Evaluator, load_eval_data
from streamfl.coordinator.metrics import MetricsWriter
from streamfl.coordinator.server import CoordinatorServer
from streamfl.errors import ConfigError
from streamfl.models import ModelSpec, build_model, model_to_arrays
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import CoordinatorStatus, GlobalModel, Hello, Offline, Telemetry
from streamfl.protocol.topics import Topics
from streamfl.protocol.transport.memory import MemoryBroker, MemoryTransport
from streamfl.sensors.datasets import save_npz

SPEC = ModelSpec(name="mlp", in_channels=2, window_len=4, num_classes=3, hidden=4)
FLEET = "t"
TOPICS = Topics(FLEET)


def _tensor_spec():
    from streamfl.models import tensor_spec
    return tensor_spec(SPEC)


class Device:
    """A fake agent: publishes frames on its own topics and records what it receives."""

    def __init__(self, broker, device_id="dev1"):
        self.device_id = device_id
        self.transport = MemoryTransport(broker, device_id)
        self.decoder = Decoder({SPEC.arch_id: _tensor_spec()})
        self.models = []
        self.status = []
        self._greeted = False
        self._lock = threading.Lock()
        self.transport.on_message = self._on_message
        self.transport.set_will(TOPICS.device(device_id, "status"), encode(Offline(device_id)))
        self.transport.subscribe(TOPICS.model)
        self.transport.subscribe(TOPICS.coordinator_status)
        self.transport.connect()
        assert self.transport.wait_connected(5)

    def _on_message(self, topic, payload):
        msg = self.decoder.try_decode(payload, source=topic)
        with self._lock:
            if isinstance(msg, GlobalModel):
                self.models.append(msg)
            elif isinstance(msg, CoordinatorStatus):
                self.status.append(msg)

    def latest_version(self):
        with self._lock:
            return self.models[-1].version if self.models else None

    def hello(self):
        self._greeted = True
        self.publish("status", Hello(device_id=self.device_id, board="fake", software_version="0",
                                     arch_id=SPEC.arch_id, buffer_capacity=16))

    def publish(self, kind, msg_or_frame):
        if kind == "update" and not self._greeted:  # like an agent: Hello on connect, then updates
            self.hello()
        frame = msg_or_frame if isinstance(msg_or_frame, bytes) else encode(msg_or_frame)
        return self.transport.publish(TOPICS.device(self.device_id, kind), frame, qos=1)

    def update(self, base_version=0, value=0.5, uid=None, **overrides):
        return make_update(SPEC, value, device_id=self.device_id, base_version=base_version,
                           update_id=uid, **overrides)


def make_server(broker, tmp_path, **kw):
    kw.setdefault("model", SPEC)
    kw.setdefault("fleet", FLEET)
    kw.setdefault("persist_interval_s", 0.0)
    kw.setdefault("admission", AdmissionConfig(**UNBOUNDED_ADMISSION))
    config = CoordinatorConfig(**kw)
    transport = MemoryTransport(broker, "coordinator-%s" % FLEET)
    server = CoordinatorServer(config, transport, tmp_path / "state", tmp_path / "run")
    server.start()
    assert transport.wait_connected(5)
    return server


def read_metrics(tmp_path):
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_update_leads_to_new_retained_global_model(tmp_path):
    broker = MemoryBroker()
    server = make_server(broker, tmp_path, alpha=0.5, staleness="constant")
    try:
        dev = Device(broker)
        assert wait_for(lambda: dev.latest_version() == 0)
        assert dev.status and dev.status[-1].online
        initial = dev.models[-1].tensors
        dev.hello()
        dev.publish("update", dev.update(base_version=0, value=1.0))
        assert wait_for(lambda: dev.latest_version() == 1)
        got = dev.models[-1]
        assert got.hparams["lr"] == 0.01 and got.arch_id == SPEC.arch_id
        for k, v in got.tensors.items():
            np.testing.assert_allclose(v, 0.5 * initial[k] + 0.5, rtol=1e-6)
        late = Device(broker, "dev2")                      # a late joiner gets the retained model
        assert wait_for(lambda: late.latest_version() == 1)
        assert server.core.online() == ["dev1"]
    finally:
        server.stop()
    counters = server.counters()
    assert counters["aggregated"] == 1 and counters["publishes"] >= 2
    assert json.loads((tmp_path / "state" / "state.json").read_text())["version"] == 1
    assert wait_for(lambda: dev.status[-1].online is False)
    events = read_metrics(tmp_path)
    updates = [e for e in events if e["event"] == "update"]
    assert updates == [dict(updates[0], device="dev1", base_version=0, version=1, staleness=0,
                            aggregated=True, num_samples=8, loss=0.25)]


def test_bad_frames_rejected_and_counted_while_valid_update_aggregates(tmp_path):
    broker = MemoryBroker()
    server = make_server(broker, tmp_path)
    try:
        dev = Device(broker)
        dev.publish("update", b"definitely not a frame")
        nan = dev.update()
        next(iter(nan.tensors.values()))[0] = np.nan
        dev.publish("update", encode(nan))
        other = ModelSpec(name="mlp", in_channels=2, window_len=4, num_classes=5, hidden=4)
        wrong = dev.update(arch_id=other.arch_id,
                           tensors=model_to_arrays(build_model(other)))
        dev.publish("update", encode(wrong))
        dev.publish("update", make_update(SPEC, device_id="impostor"))                              # topic mismatch
        dev.publish("update", Telemetry(device_id="dev1", time_s=0.0, buffer_fill=0,
                                        buffer_capacity=1))                          # wrong kind
        dev.transport.publish(TOPICS.prefix + "/device/dev1/sensor", b"x")           # not subscribed
        dev.publish("update", dev.update(base_version=0))
        assert wait_for(lambda: dev.latest_version() == 1)
        c = server.counters()
        assert c["rejected_malformed"] == 1 and c["rejected_arch_mismatch"] == 1
        # The NaN update decodes (the server's decoder leaves an update's NaN/Inf check to
        # admission's pass over it) and admission rejects it: it never reaches the model.
        assert c["rejected_non_finite"] == 0 and c["frames_rejected"] == 2
        assert c["admission_rejected_magnitude"] == 1 and c["rejected"] == 1
        assert c["topic_mismatch"] == 1 and c["wrong_kind"] == 1
        assert c["updates_received"] == 2 and c["aggregated"] == 1 and c["worker_errors"] == 0
        assert all(np.isfinite(v).all() for v in server.core.model.values())
    finally:
        server.stop()


def test_publishing_coalesces_fast_aggregations(tmp_path):
    broker = MemoryBroker()
    server = make_server(broker, tmp_path, publish_min_interval_s=0.2)
    try:
        dev = Device(broker)
        assert wait_for(lambda: dev.latest_version() == 0)
        for i in range(40):
            dev.publish("update", dev.update(base_version=0, uid="u%d" % i))
        assert wait_for(lambda: server.core.version == 40)
        assert wait_for(lambda: server.published_version == 40)
        assert wait_for(lambda: dev.latest_version() == 40)
    finally:
        server.stop()
    c = server.counters()
    assert c["publishes"] < 20 and c["coalesced"] >= 20
    versions = [m.version for m in dev.models]
    assert versions == sorted(versions) and versions[-1] == 40
    assert c["publishes"] + c["coalesced"] >= 40


def test_restart_continues_at_same_version_and_model(tmp_path):
    broker = MemoryBroker()
    server = make_server(broker, tmp_path, persist_interval_s=60.0)
    dev = Device(broker)
    assert wait_for(lambda: dev.latest_version() == 0)      # the retained v0 has arrived
    for i in range(3):
        dev.publish("update", dev.update(base_version=i, uid="u%d" % i, value=float(i)))
    assert wait_for(lambda: server.core.version == 3)
    assert dev.latest_version() == 0                      # saved at most every 60 s, so unpublished
    model = {k: v.copy() for k, v in server.core.model.items()}
    server.stop()                                           # a clean stop saves anyway
    assert json.loads((tmp_path / "state" / "state.json").read_text())["version"] == 3
    assert dev.latest_version() == 0                        # and the next start publishes it

    again = make_server(broker, tmp_path)
    try:
        listener = Device(broker, "dev3")
        assert wait_for(lambda: listener.latest_version() == 3)
        assert wait_for(lambda: listener.status and listener.status[-1].online)
        assert listener.status[-1].version == 3
        for k, v in listener.models[-1].tensors.items():
            np.testing.assert_array_equal(v, model[k])
        dev.publish("update", dev.update(base_version=2, uid="u2"))    # resent: duplicate
        dev.publish("update", dev.update(base_version=3, uid="u3"))
        assert wait_for(lambda: again.core.version == 4)
        assert again.counters()["duplicates"] == 1
    finally:
        again.stop()


def test_last_wills_of_devices_and_coordinator(tmp_path):
    broker = MemoryBroker()
    server = make_server(broker, tmp_path)
    try:
        dev = Device(broker)
        watcher = Device(broker, "watcher")
        dev.hello()
        assert wait_for(lambda: server.core.online() == ["dev1"])
        broker.drop("dev1")                                  # network loss: the broker sends the will
        assert wait_for(lambda: server.core.online() == [])
        broker.drop("coordinator-%s" % FLEET)
        assert wait_for(lambda: watcher.status and watcher.status[-1].online is False)
    finally:
        server.stop()


def test_fedavg_deadline_driven_by_ticks(tmp_path):
    broker = MemoryBroker()
    server = make_server(broker, tmp_path, strategy="fedavg", fedavg=FedAvgConfig(deadline_s=0.3))
    try:
        dev = Device(broker)
        other = Device(broker, "dev2")
        dev.hello()
        other.hello()                                        # dev2 never reports
        assert wait_for(lambda: len(server.core.online()) == 2)
        dev.publish("update", dev.update(base_version=0, value=2.0))
        assert wait_for(lambda: dev.latest_version() == 1, timeout_s=5.0)
        for v in dev.models[-1].tensors.values():
            np.testing.assert_allclose(v, 2.0)
    finally:
        server.stop()


def make_eval_npz(tmp_path, n=30):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, SPEC.window_len, SPEC.in_channels)).astype(np.float32)
    y = rng.integers(0, SPEC.num_classes, n).astype(np.int64)
    return save_npz(tmp_path / "eval.npz", x, y, np.zeros(n, dtype=np.int64), ["a", "b", "c"])


def test_evaluation_lines_every_n_versions(tmp_path):
    broker = MemoryBroker()
    path = make_eval_npz(tmp_path)
    server = make_server(broker, tmp_path, eval_path=str(path), eval_every_versions=2)
    try:
        dev = Device(broker)
        dev.hello()
        for i in range(4):
            dev.publish("update", dev.update(base_version=i, uid="u%d" % i))
        assert wait_for(lambda: server.core.version == 4)
    finally:
        server.stop()
    evals = [e for e in read_metrics(tmp_path) if e["event"] == "eval"]
    assert [e["version"] for e in evals] == [0, 2, 4]
    for e in evals:
        assert 0.0 <= e["accuracy"] <= 1.0 and e["loss"] > 0
        assert abs(e["wall_s"] - time.time()) < 60      # Unix time, so runs across restarts line up
    assert evals[0]["devices_online"] == 0 and evals[-1]["devices_online"] == 1
    assert evals[-1]["updates"] == 4


def test_evaluator_matches_direct_computation(tmp_path):
    x, y = load_eval_data(make_eval_npz(tmp_path, n=50), SPEC)
    model = build_model(SPEC, seed=3)
    tensors = model_to_arrays(model)
    accuracy, loss = Evaluator(SPEC, x, y, batch_size=7).evaluate(tensors)
    import torch
    with torch.no_grad():
        logits = model.eval()(torch.from_numpy(x))
    assert accuracy == pytest.approx(float((logits.argmax(1).numpy() == y).mean()))
    assert loss == pytest.approx(float(torch.nn.functional.cross_entropy(logits, torch.from_numpy(y))),
                                 rel=1e-5)


def test_eval_data_of_wrong_shape_is_a_config_error(tmp_path):
    path = make_eval_npz(tmp_path)
    with pytest.raises(ConfigError, match="channels"):
        load_eval_data(path, ModelSpec(name="mlp", in_channels=3, window_len=4, num_classes=3))
    with pytest.raises(ConfigError):
        load_eval_data(tmp_path / "missing.npz", SPEC)


def test_metrics_writer_survives_a_full_disk():
    writer = MetricsWriter("/dev/full")
    assert writer.write({"event": "eval", "version": 0}) is False
    assert writer.write({"event": "eval", "version": 1}) is False
    assert writer.errors == 2
    writer.close()


def test_metrics_writer_appends_lines(tmp_path):
    writer = MetricsWriter.in_run_dir(tmp_path / "run")
    writer.write({"event": "update", "loss": np.float32(0.5)})
    writer.write({"event": "eval", "version": 3})
    writer.close()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["update", "eval"]


def test_cli_against_real_broker_aggregates_and_stops_cleanly_on_sigterm(tmp_path, mqtt_broker):
    import signal
    import subprocess
    import sys

    from streamfl.protocol.transport.base import MqttSettings
    from streamfl.protocol.transport.paho import PahoTransport

    import os
    import socket

    config = tmp_path / "c.yaml"
    config.write_text("model: {name: mlp, in_channels: 2, window_len: 4, num_classes: 3, hidden: 4}\n")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)   # stands in for systemd
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(10)
    env = dict(os.environ, NOTIFY_SOCKET=str(tmp_path / "notify"), WATCHDOG_USEC="200000")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamfl.coordinator", "--config", str(config), "--broker",
         mqtt_broker.host, "--port", str(mqtt_broker.port), "--fleet", FLEET, "--state-dir",
         str(tmp_path / "state"), "--run-dir", str(tmp_path / "run"), "--log-level", "DEBUG"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    device = PahoTransport(MqttSettings(host=mqtt_broker.host, port=mqtt_broker.port, client_id="dev1"))
    decoder = Decoder({SPEC.arch_id: _tensor_spec()})
    received = []
    device.on_message = lambda topic, payload: received.append(decoder.try_decode(payload, topic))
    device.subscribe(TOPICS.model)
    device.subscribe(TOPICS.coordinator_status)
    device.connect()
    try:
        def versions(kind):
            return [m.version for m in received if isinstance(m, kind) and getattr(m, "online", True)]
        assert wait_for(lambda: 0 in versions(GlobalModel), timeout_s=30), proc.poll()
        base = next(m for m in received if isinstance(m, GlobalModel))
        device.publish(TOPICS.device("dev1", "status"), encode(make_hello("dev1", SPEC)), qos=1)
        update = make_update(SPEC, device_id="dev1",
                             tensors={k: v + np.float32(0.01) for k, v in base.tensors.items()})
        device.publish(TOPICS.device("dev1", "update"), encode(update), qos=1)
        assert wait_for(lambda: 1 in versions(GlobalModel), timeout_s=15)
        notes = [notify.recv(256).decode() for _ in range(3)]
        assert notes[0].startswith("READY=1") and "WATCHDOG=1" in notes[1:]
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert wait_for(lambda: any(isinstance(m, CoordinatorStatus) and not m.online and m.version == 1
                                    for m in received), timeout_s=5), out
    finally:
        device.close()
        notify.close()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert json.loads((tmp_path / "state" / "state.json").read_text())["version"] == 1
    assert "coordinator stopped at version 1" in out


def test_without_eval_data_progress_is_logged(tmp_path, caplog):
    broker = MemoryBroker()
    server = make_server(broker, tmp_path, progress_interval_s=0.2)
    try:
        dev = Device(broker)
        dev.publish("update", dev.update(base_version=0))
        assert wait_for(lambda: "versions/s" in caplog.text and "1 device(s) online" in caplog.text)
    finally:
        server.stop()
