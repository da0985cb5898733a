"""No version number ever names two models: the coordinator is SIGKILLed mid-aggregation, again and again.

A feeder streams updates as fast as the coordinator takes them while a watcher records every
published global model (version -> hash of its tensors). The coordinator process is killed with
SIGKILL at random moments (aggregating, saving or publishing) and restarted on the same state
folder. Since a version is published only once it is durable, every restart resumes at or after
the newest published version, and no version is ever published with two different models.
"""
import hashlib
import random
import signal
import subprocess
import sys
import threading
import time

import numpy as np

from factories import make_hello, make_update
from polling import wait_until
from streamfl.models import ModelSpec, tensor_spec
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import GlobalModel
from streamfl.protocol.topics import Topics
from streamfl.protocol.transport.base import MqttSettings
from streamfl.protocol.transport.paho import PahoTransport

SPEC = ModelSpec(name="mlp", in_channels=3, window_len=8, num_classes=3, hidden=16)
FLEET = "crash"
TOPICS = Topics(FLEET)
KILLS = 8


def digest(gm):
    h = hashlib.sha256()
    for name in sorted(gm.tensors):
        h.update(name.encode())
        h.update(np.ascontiguousarray(gm.tensors[name], np.float32).tobytes())
    return h.hexdigest()


class Watcher:
    """Records every global model published, and feeds updates based on the newest one."""

    def __init__(self, broker):
        self.decoder = Decoder({SPEC.arch_id: tensor_spec(SPEC)})
        self.seen = {}            # version -> set of digests
        self.run_ids = set()
        self.latest = None
        self.lock = threading.Lock()
        self.t = PahoTransport(MqttSettings(host=broker.host, port=broker.port, client_id="feeder",
                                            reconnect_min_s=0.1, reconnect_max_s=0.5))
        self.t.on_message = self._on_message
        self.t.subscribe(TOPICS.model, qos=1)
        self.t.connect()
        wait_until(lambda: self.t.connected, what="watcher connected")
        self.t.publish(TOPICS.device("feeder", "status"), encode(make_hello("feeder", SPEC)), qos=1,
                       retain=True)
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._feed, daemon=True)
        self._thread.start()

    def _on_message(self, topic, payload):
        gm = self.decoder.try_decode(payload, source=topic)
        if isinstance(gm, GlobalModel):
            with self.lock:
                self.seen.setdefault(gm.version, set()).add(digest(gm))
                self.run_ids.add(gm.run_id)
                if self.latest is None or gm.version >= self.latest.version:
                    self.latest = gm

    def newest(self):
        with self.lock:
            return max(self.seen) if self.seen else None

    def _feed(self):
        rng = np.random.default_rng(0)
        while not self._stop.is_set():
            with self.lock:
                base = self.latest
            if base is None or not self.t.connected:
                time.sleep(0.02)
                continue
            tensors = {k: v + np.float32(1e-3) * rng.standard_normal(v.shape).astype(np.float32)
                       for k, v in base.tensors.items()}
            self.t.publish(TOPICS.device("feeder", "update"),
                           encode(make_update(SPEC, device_id="feeder", base_version=base.version,
                                              tensors=tensors)), qos=1)
            self.sent += 1
            time.sleep(0.004)

    def close(self):
        self._stop.set()
        self._thread.join(5)
        self.t.close()


def test_sigkill_during_aggregation_never_reuses_a_version(mqtt_broker, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model: {name: mlp, in_channels: 3, window_len: 8, num_classes: 3, hidden: 16}\n"
                      "persist_interval_s: 0.02\nmqtt: {reconnect_min_s: 0.1, reconnect_max_s: 0.5}\n")
    argv = [sys.executable, "-m", "streamfl.coordinator", "--config", str(config), "--broker",
            mqtt_broker.host, "--port", str(mqtt_broker.port), "--fleet", FLEET, "--state-dir",
            str(tmp_path / "state"), "--run-dir", str(tmp_path / "run"), "--log-level", "WARNING"]
    watcher = Watcher(mqtt_broker)
    rand = random.Random(0)
    restarts_at = []
    proc = None
    try:
        for kill in range(KILLS + 1):
            before = watcher.newest()
            with open(tmp_path / ("coordinator-%d.log" % kill), "w") as log_file:
                proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT)
            # Wait until this incarnation has published something new, then let it work a while.
            wait_until(lambda: watcher.newest() is not None and watcher.newest() > (before or 0) + 2,
                       timeout_s=60, what="coordinator %d making versions (exit %s)" % (kill, proc.poll()))
            restarts_at.append(before)
            if kill == KILLS:
                break
            time.sleep(rand.uniform(0.05, 0.6))
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
    finally:
        watcher.close()
        if proc is not None and proc.poll() is None:
            proc.terminate()
            # A clean stop first handles every update already taken, and the feeder floods the
            # queue: on a loaded 2-core machine that took over 30 s once (the full suite in CI).
            proc.wait(120)
    reused = {v: d for v, d in watcher.seen.items() if len(d) > 1}
    assert not reused, "versions naming two models: %s" % sorted(reused)
    assert len(watcher.run_ids) == 1                       # one state folder, one run identity
    assert watcher.newest() > 3 * KILLS and watcher.sent > 0, restarts_at
