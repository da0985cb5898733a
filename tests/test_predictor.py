"""The predictor alone: its rate limit, a full queue dropping the oldest window without blocking
ingest, a model swapped on a new version while windows keep coming, global against local, and
every line in schema 1 with the probabilities a reference forward pass gives."""
import json
import threading
import time

import numpy as np
import pytest
import torch

from lifecycle import started_by
from polling import wait_until
from streamfl.agent.config import load_agent_config
from streamfl.agent.predict_config import PredictConfig
from streamfl.agent.predictor import NullPredictor, Predictor, class_names_for, make_predictor
from streamfl.config import build
from streamfl.errors import ConfigError, ProtocolError
from streamfl.models import ModelSpec, arrays_to_model, build_model, model_to_arrays
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import Telemetry
from streamfl.sensors.config import SensorConfig
from streamfl.sensors.synthetic import synthetic_dataset
from streamfl.sensors.window import UNLABELLED, Window

SPEC = ModelSpec(name="mlp", hidden=16)  # 6 channels, 50 samples, 6 classes
NAMES = ("walk", "run", "sit", "stand", "up", "down")
KEYS = {"schema", "device_id", "seq", "time_s", "window_t_s", "class", "name", "confidence",
        "top_k", "label", "model"}
X, Y, _ = synthetic_dataset(60, users=2, seed=3, cfg=SensorConfig())


def weights(seed):
    return model_to_arrays(build_model(SPEC, seed=seed))


def reference_probs(tensors, x):
    """Softmax of an independently built model with ``tensors`` on window ``x``."""
    model = build_model(SPEC, seed=99)
    arrays_to_model(model, tensors)
    model.eval()
    with torch.no_grad():
        return torch.softmax(model(torch.from_numpy(x[None])), dim=1)[0].numpy()


class Clock:
    """A hand-moved monotonic clock for the rate limit."""

    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class Lines:
    """A publish callback collecting decoded predictions."""

    def __init__(self):
        self.lines, self.lock = [], threading.Lock()

    def __call__(self, payload):
        assert isinstance(payload, bytes) and not payload.endswith(b"\n")
        with self.lock:
            self.lines.append(json.loads(payload.decode("utf-8")))

    def snapshot(self):
        with self.lock:
            return list(self.lines)


def make(sink, clock=time.monotonic, **over):
    cfg = build(PredictConfig, dict(dict(enabled=True, socket_path=None, max_per_s=1000.0,
                                         queue_size=64, class_names=list(NAMES)), **over))
    return Predictor(cfg, SPEC, "pi-07", publish=[sink], clock=clock, wall_clock=lambda: 1.7e9)


@pytest.fixture
def started():
    yield from started_by(make)


def window(i, label=None):
    return Window(X[i % len(X)], int(Y[i % len(Y)]) if label is None else label, t_s=float(i))


def test_every_line_is_schema_1_with_the_reference_model_probabilities(started):
    sink = Lines()
    p = started(sink, top_k=4)
    tensors = weights(1)
    assert p.set_model(7, tensors, "global", run_id="run-a")
    for i in range(5):
        assert p.offer(window(i, label=UNLABELLED if i == 4 else None))
    assert p.wait_idle(10)
    lines = sink.snapshot()
    assert [d["seq"] for d in lines] == [0, 1, 2, 3, 4]
    for i, d in enumerate(lines):
        assert set(d) == KEYS and d["schema"] == 1 and d["device_id"] == "pi-07"
        assert d["time_s"] == 1.7e9 and d["window_t_s"] == float(i)
        assert d["model"] == {"kind": "global", "version": 7, "round": None, "run_id": "run-a"}
        probs = reference_probs(tensors, X[i])
        order = np.argsort(-probs)[:4]
        assert [t["class"] for t in d["top_k"]] == [int(k) for k in order]
        assert [t["name"] for t in d["top_k"]] == [NAMES[k] for k in order]
        np.testing.assert_allclose([t["p"] for t in d["top_k"]], probs[order], atol=1e-5)
        assert d["class"] == int(order[0]) and d["name"] == NAMES[order[0]]
        assert d["confidence"] == pytest.approx(float(probs.max()), abs=1e-5)
        assert d["label"] == (None if i == 4 else int(Y[i]))
    assert p.stats()["predicted"] == 5 and p.stats()["confidence"] == pytest.approx(lines[-1]["confidence"], abs=1e-5)


def test_windows_beyond_the_rate_are_skipped_and_counted(started):
    sink, clock = Lines(), Clock()
    p = started(sink, clock=clock, max_per_s=5.0)
    p.set_model(1, weights(1), "global")
    taken = [p.offer(window(i)) for i in range(20)]          # a burst: one second's worth passes
    assert taken == [True] * 5 + [False] * 15
    clock.t += 0.4                                           # 0.4 s earns 2 windows
    assert [p.offer(window(20 + i)) for i in range(5)] == [True, True, False, False, False]
    clock.t += 10.0                                          # idle time refills one second's worth only
    assert sum(p.offer(window(30 + i)) for i in range(20)) == 5
    assert p.wait_idle(10)
    stats = p.stats()
    assert (stats["offered"], stats["skipped_rate"], stats["predicted"]) == (45, 33, 12)
    assert [d["window_t_s"] for d in sink.snapshot()][:7] == [0, 1, 2, 3, 4, 20, 21]


def test_a_full_queue_drops_the_oldest_and_ingest_never_waits():
    """The prediction thread is held inside a publish; windows keep being offered: each offer
    returns at once, the queue keeps the newest ``queue_size`` windows, the rest are counted."""
    release, inside = threading.Event(), threading.Event()
    sink = Lines()

    def blocked(payload):
        inside.set()
        release.wait(20)
        sink(payload)

    cfg = build(PredictConfig, dict(enabled=True, socket_path=None, max_per_s=10000.0, queue_size=4))
    p = Predictor(cfg, SPEC, "pi-07", publish=[blocked])
    p.start()
    try:
        p.set_model(1, weights(1), "global")
        p.offer(window(0))
        wait_until(inside.is_set, 10, "the prediction thread to block in its output")
        t0 = time.perf_counter()
        for i in range(1, 201):
            assert p.offer(window(i))
        spent_s = time.perf_counter() - t0
        assert spent_s < 0.5, "200 offers took %.3f s while the predictor was stuck" % spent_s
        stats = p.stats()
        assert stats["dropped"] == 196 and stats["queued"] == 4
        assert p.telemetry(time.monotonic())["predictions_dropped"] == 196
        release.set()
        assert p.wait_idle(10)
        assert [d["window_t_s"] for d in sink.snapshot()] == [0, 197, 198, 199, 200]
    finally:
        release.set()
        p.stop()


def test_a_new_version_is_swapped_in_while_windows_keep_coming(started):
    sink = Lines()
    p = started(sink)
    w1, w2 = weights(1), weights(2)
    p.set_model(1, w1, "global", run_id="r")
    stop = threading.Event()

    def feed():
        i = 0
        while not stop.is_set():
            p.offer(window(i))
            i += 1
            time.sleep(0.002)

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        wait_until(lambda: len(sink.snapshot()) >= 20, 10, "predictions from v1")
        p.set_model(2, w2, "global", run_id="r")
        wait_until(lambda: sum(d["model"]["version"] == 2 for d in sink.snapshot()) >= 20, 10,
                   "predictions from v2")
    finally:
        stop.set()
        feeder.join()
    assert p.wait_idle(10)
    lines = sink.snapshot()
    versions = [d["model"]["version"] for d in lines]
    first_v2 = versions.index(2)
    assert set(versions[:first_v2]) == {1} and set(versions[first_v2:]) == {2}  # one switch, no mix
    assert [d["seq"] for d in lines] == list(range(len(lines)))                  # no gap, no restart
    for d in (lines[first_v2 - 1], lines[first_v2], lines[-1]):
        tensors = w1 if d["model"]["version"] == 1 else w2
        x = X[int(d["window_t_s"]) % len(X)]
        assert d["confidence"] == pytest.approx(float(reference_probs(tensors, x).max()), abs=1e-5)
    assert p.stats()["models"] == 2 and p.stats()["model_errors"] == 0


def test_global_takes_only_global_models(started):
    sink = Lines()
    p = started(sink, model="global")
    assert p.set_model(3, weights(1), "global", run_id="r")
    assert not p.set_model(3, weights(2), "local", round_index=5)
    p.offer(window(0))
    assert p.wait_idle(10)
    assert sink.snapshot()[-1]["model"] == {"kind": "global", "version": 3, "round": None, "run_id": "r"}


def test_local_follows_the_boards_own_model_once_it_has_one(started):
    sink = Lines()
    p = started(sink, model="local")
    p.offer(window(0))                                 # no model yet: not predicted, counted
    assert p.wait_idle(10) and p.stats()["no_model"] == 1 and sink.snapshot() == []
    assert p.set_model(3, weights(1), "global", run_id="r")     # until the first round: global
    p.offer(window(1))
    assert p.wait_idle(10)
    assert sink.snapshot()[-1]["model"]["kind"] == "global"
    local = weights(5)
    assert p.set_model(3, local, "local", round_index=0)
    assert not p.set_model(4, weights(2), "global", run_id="r")  # from now on only local ones
    p.offer(window(2))
    assert p.wait_idle(10)
    last = sink.snapshot()[-1]
    assert last["model"] == {"kind": "local", "version": 3, "round": 0, "run_id": ""}
    assert last["confidence"] == pytest.approx(float(reference_probs(local, X[2]).max()), abs=1e-5)


def test_unusable_tensors_keep_the_previous_model(started):
    sink = Lines()
    p = started(sink)
    p.set_model(1, weights(1), "global")
    assert p.wait_idle(10)                   # v1 built (a newer set_model before it would replace it)
    bad = {k: v[..., :1] for k, v in weights(2).items()}
    p.set_model(2, bad, "global")
    p.offer(window(0))
    assert p.wait_idle(10)
    assert sink.snapshot()[-1]["model"]["version"] == 1 and p.stats()["model_errors"] == 1
    with pytest.raises(ValueError, match="model kind"):
        p.set_model(3, weights(1), "best")


def test_a_failing_output_is_counted_and_the_others_still_get_every_line():
    sink = Lines()

    def broken(payload):
        raise OSError("broker gone")

    cfg = build(PredictConfig, dict(enabled=True, socket_path=None, max_per_s=1000.0))
    p = Predictor(cfg, SPEC, "pi-07", publish=[broken, sink])
    p.start()
    try:
        p.set_model(1, weights(1), "global")
        for i in range(3):
            p.offer(window(i))
        assert p.wait_idle(10)
    finally:
        p.stop()
    assert len(sink.snapshot()) == 3 and p.stats()["publish_errors"] == 3


def test_telemetry_fields_rate_over_the_interval_and_they_encode(started):
    sink, clock = Lines(), Clock()
    p = started(sink, clock=clock)
    assert p.telemetry(clock.t) == {"predictions_per_s": None, "prediction_confidence": None,
                                    "predictions_dropped": 0}  # no time has passed since start
    p.set_model(1, weights(1), "global")
    for i in range(6):
        p.offer(window(i))
    assert p.wait_idle(10)
    clock.t += 2.0
    fields = p.telemetry(clock.t)
    assert fields["predictions_per_s"] == pytest.approx(3.0)
    assert fields["prediction_confidence"] == pytest.approx(sink.snapshot()[-1]["confidence"], abs=1e-5)
    clock.t += 4.0
    assert p.telemetry(clock.t)["predictions_per_s"] == 0.0
    tel = Telemetry("pi-07", 1.0, 1, 2, **fields)
    assert Decoder({}).decode(encode(tel)) == tel
    for bad in ({"predictions_per_s": -1.0}, {"prediction_confidence": -0.5},
                {"predictions_dropped": -1}, {"predictions_per_s": "fast"}):
        with pytest.raises(ProtocolError) as caught:
            Decoder({}).decode(encode(Telemetry("pi-07", 1.0, 1, 2, **bad)))
        assert caught.value.reason == "schema"


def test_class_names_come_from_the_config_a_dataset_or_the_index():
    cfg = PredictConfig(class_names=NAMES)
    assert class_names_for(cfg, 6, ("a",) * 6) == NAMES
    assert class_names_for(PredictConfig(), 6, list("abcdef")) == tuple("abcdef")
    assert class_names_for(PredictConfig(), 6, ("a", "b")) == tuple("class_%d" % k for k in range(6))
    with pytest.raises(ValueError, match="6 classes"):
        class_names_for(PredictConfig(class_names=("a", "b")), 6)


def test_config_errors_name_the_key(tmp_path):
    path = tmp_path / "agent.yaml"
    for text, needle in (("predict: {model: best}", "predict.model"),
                         ("predict: {max_per_s: 0}", "max_per_s"),
                         ("predict: {queue_size: 0}", "queue_size"),
                         ("predict: {class_names: [a, b]}", "predict.class_names has 2 names"),
                         ("predict: {class_names: [a, '', c, d, e, f]}", "class_names[1]"),
                         ("predict: {colour: red}", "colour")):
        path.write_text("model: {name: mlp, hidden: 16}\n" + text + "\n")
        with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
            load_agent_config(path)


def test_off_unless_configured(tmp_path):
    cfg = load_agent_config(None, {"model": {"name": "mlp", "hidden": 16}})
    p = make_predictor(cfg, tmp_path)
    assert isinstance(p, NullPredictor) and p.telemetry(1.0) == {} and not p.offer(window(0))
    assert Telemetry("d", 1.0, 1, 2) == Telemetry("d", 1.0, 1, 2, predictions_per_s=None,
                                                  prediction_confidence=None, predictions_dropped=0)
    on = load_agent_config(None, {"model": {"name": "mlp", "hidden": 16},
                                  "predict": {"enabled": True, "socket_path": None}})
    assert isinstance(make_predictor(on, tmp_path), Predictor)


def test_the_daemon_predicts_with_its_own_model_after_each_round_and_after_a_restart(tmp_path):
    """``model: local`` in a running daemon (in-memory broker): predictions name the round that
    made the model, and a restarted agent predicts with its checkpoint before any new round."""
    from streamfl.protocol.topics import Topics
    from streamfl.protocol.transport.memory import MemoryBroker, MemoryTransport
    from test_agent_daemon import DEV, FLEET, FakeCoordinator, Running

    broker = MemoryBroker()
    coord = FakeCoordinator(broker)
    coord.publish_model(3)
    sink = Lines()
    app = MemoryTransport(broker, "app")
    app.on_message = lambda topic, payload: sink(payload)
    app.subscribe(Topics(FLEET).device(DEV, "prediction"), qos=0)
    app.connect()
    predict = {"enabled": True, "model": "local", "socket_path": None, "max_per_s": 1000.0}
    with Running(broker, tmp_path / "state", predict=predict) as daemon:
        wait_until(lambda: any(d["model"]["kind"] == "local" and d["model"]["round"] >= 1
                               for d in sink.snapshot()), 20, "predictions of round 1's model")
        assert all(d["device_id"] == DEV for d in sink.snapshot())
    rounds = daemon.core.rounds
    local = [d["model"] for d in sink.snapshot() if d["model"]["kind"] == "local"]
    assert all(m["version"] == 3 and 0 <= m["round"] < rounds for m in local)
    del sink.lines[:]
    with Running(broker, tmp_path / "state", predict=predict, min_buffer=200) as daemon:
        wait_until(lambda: sink.snapshot(), 20, "a prediction after the restart")
        first = sink.snapshot()[0]
    assert first["seq"] == 0 and first["model"] == {"kind": "local", "version": 3,
                                                     "round": rounds - 1, "run_id": ""}
