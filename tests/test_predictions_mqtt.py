"""Predictions over a real mosquitto: the shipped ACL lets a device write only its own prediction
topic and the ``dashboard`` account read them, and a real agent process trains while a paho client
on its prediction topic and a client of its socket both get predictions naming their model."""
import json
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from polling import wait_until
from streamfl.protocol.codec import Decoder
from streamfl.protocol.messages import Telemetry
from streamfl.protocol.topics import Topics
from test_broker_acl import A, B, DASHBOARD, QUIET_S, _coordinator, broker, clients  # noqa: F401

KEYS = {"schema", "device_id", "seq", "time_s", "window_t_s", "class", "name", "confidence",
        "top_k", "label", "model"}
NAMES = ["walk", "run", "sit", "stand", "up", "down"]


@pytest.mark.integration
@pytest.mark.timeout(120)
@pytest.mark.skipif(not (shutil.which("mosquitto") and shutil.which("mosquitto_passwd")
                         and shutil.which("openssl")),
                    reason="needs mosquitto, mosquitto_passwd and openssl")
def test_devices_write_only_their_own_predictions_and_the_dashboard_only_reads_them(broker, clients):
    topics = Topics("predict")
    coordinator, model = _coordinator(broker, clients, topics)
    b = clients(broker, B, ["streamfl/v1/#"])
    wait_until(lambda: model in b.on(topics.model), 10, "device B's subscription (the model)")
    dash = clients(broker, DASHBOARD, ["streamfl/v1/#"])
    a = clients(broker, A)
    mine, theirs = topics.device(A, "prediction"), topics.device(B, "prediction")
    a.publish(theirs, b'{"forged": 1}')
    dash.publish(mine, b'{"forged": 2}')
    dash.publish(topics.device(A, "telemetry"), b'{"forged": 3}')
    own = b'{"schema": 1}'
    a.publish(mine, own)                                     # the positive control, sent last
    wait_until(lambda: own in dash.on(mine), 10, "A's prediction at the dashboard")
    wait_until(lambda: own in coordinator.on(mine), 10, "A's prediction at the coordinator")
    time.sleep(QUIET_S)
    assert dash.topics() == {mine}                          # predictions only, not the model
    assert coordinator.on(mine) == [own] and coordinator.on(theirs) == []
    assert coordinator.on(topics.device(A, "telemetry")) == []
    assert not [t for t in b.topics() if t.endswith("/prediction")]  # devices read no predictions


class PredictionWatcher:
    """A plain paho client on one device's prediction and telemetry topics."""

    def __init__(self, host, port, topics, device):
        self.prediction, self.telemetry_topic = (topics.device(device, "prediction"),
                                                 topics.device(device, "telemetry"))
        self.predictions, self.telemetry, self.lock = [], [], threading.Lock()
        self.decoder = Decoder({})
        subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="prediction-watcher",
                                  protocol=mqtt.MQTTv311)
        self.client.on_connect = lambda c, *a: c.subscribe([(self.prediction, 0), (self.telemetry_topic, 0)])
        self.client.on_subscribe = lambda *a: subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect(host, port, 30)
        self.client.loop_start()
        assert subscribed.wait(10)

    def _on_message(self, client, userdata, message):
        with self.lock:
            if message.topic == self.prediction:
                assert not message.retain
                self.predictions.append(json.loads(message.payload.decode("utf-8")))
            else:
                self.telemetry.append(self.decoder.decode(message.payload))

    def snapshot(self):
        with self.lock:
            return list(self.predictions), list(self.telemetry)

    def close(self):
        self.client.disconnect()
        self.client.loop_stop()


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_training_agent_publishes_predictions_on_mqtt_and_its_socket(fleet, mqtt_broker):
    sock_dir = Path(tempfile.mkdtemp(prefix="sfl-"))
    path = sock_dir / "p.sock"
    run = fleet()
    device = run.device_id(0)
    watcher = PredictionWatcher(mqtt_broker.host, mqtt_broker.port, run.topics, device)
    lines, reader = [], None
    try:
        run.start_coordinator()
        agent = run.start_agent(0, telemetry_interval_s=1.0, predict={
            "enabled": True, "max_per_s": 10.0, "socket_path": str(path), "class_names": NAMES})
        run.wait_for(path.exists, 30, "the agent's prediction socket")
        reader = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        reader.connect(str(path))

        def read():
            for line in reader.makefile("r", encoding="utf-8"):
                lines.append(json.loads(line))
        threading.Thread(target=read, daemon=True).start()

        def versions(records):
            return {r["model"]["version"] for r in records}
        run.wait_for(lambda: len(versions(lines)) >= 2 and len(versions(watcher.snapshot()[0])) >= 2
                     and len([u for u in run.updates() if u.get("device") == device]) >= 3,
                     60, "predictions of two model versions on both outputs, and three rounds")
        mqtt_lines, telemetry = watcher.snapshot()
        for record in lines + mqtt_lines:
            assert set(record) == KEYS and record["schema"] == 1 and record["device_id"] == device
            assert record["model"]["kind"] == "global" and record["model"]["run_id"]
            assert record["name"] == NAMES[record["class"]] and 0 < record["confidence"] <= 1
        seqs = [r["seq"] for r in lines]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))      # the socket misses none
        assert max(versions(mqtt_lines)) >= 1
        run.wait_for(lambda: any(t.predictions_per_s for t in watcher.snapshot()[1]), 10,
                     "telemetry with a prediction rate")
        tel = [t for t in watcher.snapshot()[1] if t.predictions_per_s][-1]
        assert isinstance(tel, Telemetry) and 0 < tel.predictions_per_s <= 12.0
        assert 0 < tel.prediction_confidence <= 1 and tel.predictions_dropped >= 0
        assert agent.terminate() == 0
        assert not path.exists()                                       # removed at stop
    finally:
        watcher.close()
        if reader is not None:
            reader.close()
        shutil.rmtree(str(sock_dir), ignore_errors=True)
