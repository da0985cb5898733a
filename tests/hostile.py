"""What the hostile suites share: an easy task, a paho client that speaks for a device, a real
coordinator on the test's broker, and the honest devices the tests drive round by round.

The honest devices are ``AgentCore``s (no daemon): a test trains one round, publishes the update on
the device's topic and waits for what the coordinator made of it, so an attacked and a clean run
see the same sequence of versions. An attacker is a ``Client`` that said Hello and then publishes
whatever frames it likes on its own device topics.
"""
import threading

import numpy as np

from polling import wait_until
from streamfl.agent.config import AgentConfig
from streamfl.agent.core import AgentCore
from streamfl.config import build
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.server import CoordinatorServer
from streamfl.models import ModelSpec, tensor_spec
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import GlobalModel
from streamfl.protocol.topics import Topics
from streamfl.protocol.transport.base import MqttSettings
from streamfl.protocol.transport.paho import PahoTransport
from streamfl.sensors.datasets import save_npz
from streamfl.sensors.window import Window

SPEC = ModelSpec(name="mlp", in_channels=3, window_len=8, num_classes=3, hidden=16)
FLEET = "hostile"
TOPICS = Topics(FLEET)
FAST = {"reconnect_min_s": 0.2, "reconnect_max_s": 1.0}


def windows(n, seed):
    """Class c lifts channel c: easy to learn, so a poisoned model shows as a drop to chance."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = rng.standard_normal((n, 8, 3)).astype(np.float32) * 0.5
    x[np.arange(n), :, y] += 1.5
    return x, y.astype(np.int64)


class Client:
    """A paho client of the test: publishes on its device topics, keeps the newest global model."""

    def __init__(self, broker, client_id, spec=SPEC):
        self.client_id = client_id
        self.decoder = Decoder({spec.arch_id: tensor_spec(spec)})
        self.model = None
        self.cond = threading.Condition()
        self.t = PahoTransport(MqttSettings(host=broker.host, port=broker.port, client_id=client_id, **FAST))
        self.t.on_message = self._on_message
        self.t.subscribe(TOPICS.model, qos=1)
        self.t.connect()
        wait_until(lambda: self.t.connected, what="%s connected" % client_id)

    def _on_message(self, topic, payload):
        msg = self.decoder.try_decode(payload[payload.find(b"SFL"):], source=topic)
        if isinstance(msg, GlobalModel):
            with self.cond:
                if self.model is None or msg.version > self.model.version or msg.run_id != self.model.run_id:
                    self.model = msg

    def version(self):
        with self.cond:
            return self.model.version if self.model is not None else None

    def send(self, kind, msg, device_id=None):
        topic = TOPICS.device(device_id or self.client_id, kind)
        assert self.t.publish(topic, msg if isinstance(msg, bytes) else encode(msg), qos=1)

    def close(self):
        self.t.close()


def coordinator(broker, tmp_path, name, **over):
    """A started ``CoordinatorServer`` of ``FLEET`` with state in ``state-<name>`` and its run folder
    (metrics.jsonl) in ``run-<name>``, evaluating on held-out windows; ``over``: config keys."""
    x, y = windows(300, seed=99)
    eval_path = save_npz(tmp_path / "eval.npz", x, y, np.zeros(len(y), np.int64), ["a", "b", "c"])
    values = dict(fleet=FLEET, model=SPEC, alpha=0.6, staleness="constant", persist_interval_s=0.0,
                  eval_path=str(eval_path), eval_every_versions=1000,
                  mqtt=dict(host=broker.host, port=broker.port, **FAST),
                  # The test's devices train as fast as the CPU goes, faster than boards do.
                  admission=dict(max_updates_per_s=None))
    values.update(over)
    config = build(CoordinatorConfig, values, "test")
    transport = PahoTransport(config.mqtt.settings("coordinator-%s" % name, {}))
    server = CoordinatorServer(config, transport, tmp_path / ("state-" + name), tmp_path / ("run-" + name))
    server.start()
    return server


def honest_agent(i, windows_n=200):
    """Device ``pi-<i>``: an ``AgentCore`` (every plug-in dormant until a global model wakes it) whose
    buffer holds ``windows_n`` windows of the task, drawn from seed ``i``."""
    cfg = build(AgentConfig, dict(device_id="pi-%d" % i, model=SPEC, min_buffer=8, local_steps=10,
                                  batch_size=16, lr=0.1, sensor={"channels": 3, "window_len": 8,
                                                                 "num_classes": 3}), "test")
    agent = AgentCore(cfg, clock=lambda: 0.0, seed=i)
    x, y = windows(windows_n, seed=i)
    for xi, yi in zip(x, y):
        agent.add_window(Window(xi, int(yi)))
    return agent
