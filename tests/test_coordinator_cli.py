"""``streamfl-coordinator --embedded-broker`` as a real process: a plain MQTT client gets its model."""
import os
import signal
import subprocess
import sys
import threading
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from streamfl.models import ModelSpec, tensor_spec
from streamfl.protocol.codec import Decoder
from streamfl.protocol.messages import CoordinatorStatus, GlobalModel
from streamfl.protocol.topics import Topics
from streamfl.sim.brokers import free_port

pytest.importorskip("amqtt")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FLEET = "cli-test"
HOST = "127.0.0.1"


class Watcher:
    """A paho 2.x client on the model and coordinator-status topics, decoding with the real Decoder."""

    def __init__(self, spec: ModelSpec):
        self.topics = Topics(FLEET)
        self.decoder = Decoder({spec.arch_id: tensor_spec(spec)})
        self.received = {}
        self.got = threading.Condition()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="cli-test-watcher",
                                  clean_session=True, protocol=mqtt.MQTTv311)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message

    def _on_connect(self, client, userdata, flags, reason_code, properties):
        client.subscribe([(self.topics.model, 1), (self.topics.coordinator_status, 1)])

    def _on_message(self, client, userdata, message):
        msg = self.decoder.try_decode(message.payload, source=message.topic)
        with self.got:
            self.received[message.topic] = (msg, message.retain)
            self.got.notify_all()

    def close(self):
        self.client.disconnect()
        self.client.loop_stop()


def _log_tail(path, chars=3000):
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def _check_alive(proc, log_path, what):
    if proc.poll() is not None:
        raise AssertionError("coordinator exited with %s while waiting for %s\n%s" % (
            proc.returncode, what, _log_tail(log_path)))


def test_embedded_broker_serves_the_retained_model_and_sigterm_exits_0(tmp_path):
    port = free_port(HOST)
    spec = ModelSpec()  # the coordinator's default model
    state_dir, run_dir, log_path = tmp_path / "state", tmp_path / "run", tmp_path / "coordinator.log"
    argv = [sys.executable, "-m", "streamfl.coordinator", "--embedded-broker", "--broker", HOST,
            "--port", str(port), "--fleet", FLEET, "--state-dir", str(state_dir), "--run-dir",
            str(run_dir), "--log-level", "INFO"]
    watcher = Watcher(spec)
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, cwd=str(tmp_path),
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        deadline = time.monotonic() + 60
        while True:  # until the embedded broker accepts an MQTT connection
            _check_alive(proc, log_path, "the embedded broker")
            try:
                watcher.client.connect(HOST, port, 30)
                break
            except OSError:
                if time.monotonic() >= deadline:
                    raise AssertionError("no broker on port %d after 60 s\n%s" % (port, _log_tail(log_path)))
                time.sleep(0.2)
        watcher.client.loop_start()

        topics = Topics(FLEET)
        deadline = time.monotonic() + 30
        with watcher.got:
            while not {topics.model, topics.coordinator_status} <= set(watcher.received):
                _check_alive(proc, log_path, "the retained model")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("no retained model within 30 s (got %s)\n%s" % (
                        sorted(watcher.received), _log_tail(log_path)))
                watcher.got.wait(min(left, 0.5))
        model, _ = watcher.received[topics.model]
        assert isinstance(model, GlobalModel), (watcher.decoder.rejected, _log_tail(log_path))
        assert model.arch_id == spec.arch_id and model.version == 0
        assert sorted(model.tensors) == sorted(tensor_spec(spec))
        status, _ = watcher.received[topics.coordinator_status]
        assert isinstance(status, CoordinatorStatus) and status.online
        assert watcher.decoder.rejected == {}
        watcher.close()

        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            raise AssertionError("coordinator did not stop within 30 s of SIGTERM\n%s" % _log_tail(log_path))
        assert code == 0, _log_tail(log_path)
        assert any(state_dir.iterdir()), "nothing persisted in the state dir"
    finally:
        watcher.client.loop_stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
