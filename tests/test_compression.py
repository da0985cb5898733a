"""Compressed updates and models end to end: the coordinator makes an ``int8_delta`` update whole
from its history, rejects one whose base is gone with a counted reason, publishes int8 models,
and over a real broker aggregates an agent's int8-delta updates; the settings and their
deprecated spellings."""
import json
import threading

import numpy as np
import pytest

from factories import SPEC, UNBOUNDED_ADMISSION, greet, make_update
from polling import wait_until
from streamfl.agent.config import AgentConfig
from streamfl.config import build
from streamfl.coordinator.admission import AdmissionConfig
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.core import CoordinatorCore
from streamfl.coordinator.deltas import DELTA_BASE
from streamfl.errors import ConfigError
from streamfl.models import tensor_spec
from streamfl.protocol import quantize as q8
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import DeltaUpdate, GlobalModel
from streamfl.protocol.topics import Topics


def _core(**kw):
    config = CoordinatorConfig(model=SPEC, admission=AdmissionConfig(**UNBOUNDED_ADMISSION),
                               alpha=0.5, staleness="constant", **kw)
    return greet(CoordinatorCore(config), "d1")


def _through_codec(update, base):
    return Decoder({SPEC.arch_id: tensor_spec(SPEC)}).decode(encode(update, encoding="int8_delta", base=base))


def test_a_delta_update_is_added_to_its_base_from_the_history():
    core = _core()
    base = {k: v.copy() for k, v in core.model.items()}
    trained = make_update(value=None, seed=3, base_version=0, update_id="u1")
    delta = _through_codec(trained, base)
    assert isinstance(delta, DeltaUpdate)
    record = core.on_message(delta, now=1.0).update
    assert record.outcome == "aggregated" and core.version == 1
    for k in base:  # FedAsync with alpha 0.5: half the base, half base + delta (within the int8 bound)
        want = 0.5 * base[k] + 0.5 * trained.tensors[k]
        bound = 0.5 * q8.error_bound(trained.tensors[k] - base[k]) + 1e-6
        assert (np.abs(core.model[k] - want) <= bound).all()


def test_a_delta_whose_base_left_the_history_is_rejected_and_counted():
    core = _core(history_size=2)
    base0 = {k: v.copy() for k, v in core.model.items()}
    for k in range(3):
        core.on_message(make_update(update_id="full%d" % k, base_version=k), now=1.0 + k)
    assert 0 not in core.history.versions()
    stale = _through_codec(make_update(value=None, seed=4, base_version=0, update_id="late"), base0)
    before = {k: v.copy() for k, v in core.model.items()}
    record = core.on_message(stale, now=9.0).update
    assert record.outcome == "rejected" and record.fields["reason"] == DELTA_BASE
    assert core.counters["rejected"] == 1 and core.version == 3
    assert all(np.array_equal(before[k], core.model[k]) for k in before)


def test_settings_their_values_and_the_deprecated_float16_flags(caplog):
    assert AgentConfig(update_encoding="int8_delta").update_encoding == "int8_delta"
    assert AgentConfig(float16_updates=True).update_encoding == "float16"
    assert "deprecated" in caplog.text
    with pytest.raises(ConfigError, match="update_encoding must be one of float32, float16, int8_delta"):
        build(AgentConfig, {"update_encoding": "int8"}, "agent.yaml")
    with pytest.raises(ConfigError, match="disagree"):
        build(AgentConfig, {"update_encoding": "int8_delta", "float16_updates": True}, "agent.yaml")
    assert CoordinatorConfig(float16=True).model_encoding == "float16"
    with pytest.raises(ConfigError, match="model_encoding must be one of float32, float16, int8"):
        build(CoordinatorConfig, {"model_encoding": "int8_delta"}, "coordinator.yaml")
    with pytest.raises(ConfigError, match="disagree"):
        build(CoordinatorConfig, {"model_encoding": "int8", "float16": True}, "coordinator.yaml")


def test_the_publisher_sends_the_model_in_its_encoding(tmp_path):
    from streamfl.coordinator.persistence import Persister, StateStore
    from streamfl.coordinator.publisher import DurablePublisher
    from streamfl.protocol.signing import make_signer
    from streamfl.protocol.transport.memory import MemoryBroker, MemoryTransport

    broker = MemoryBroker()
    sent, seen = MemoryTransport(broker, "coordinator"), MemoryTransport(broker, "watcher")
    frames = []
    seen.on_message = lambda topic, payload: frames.append(bytes(payload))
    sent.connect()
    seen.connect()
    seen.subscribe("model", qos=1)
    core = _core()
    publisher = DurablePublisher(sent, "model", Persister(StateStore(tmp_path / "state")), make_signer(None),
                                 lambda *a: None, model_encoding="int8")
    publisher.start()
    try:
        publisher.offer(core.global_model(), core.state())
        wait_until(lambda: frames, 10, "the published model")
    finally:
        publisher.stop()
    gm = Decoder({SPEC.arch_id: tensor_spec(SPEC)}).decode(frames[-1])
    assert isinstance(gm, GlobalModel) and b'"dtype":"int8"' in frames[-1][:4096]
    for k, v in core.model.items():
        assert (np.abs(gm.tensors[k] - v) <= q8.error_bound(v)).all()


@pytest.mark.timeout(120)
def test_int8_delta_updates_and_int8_models_over_mqtt(mqtt_broker, tmp_path):
    """A real agent daemon and coordinator server in this process, over paho and mosquitto: the
    agent's int8-delta updates are aggregated, and it trains from the coordinator's int8 models."""
    from streamfl.agent.daemon import AgentDaemon
    from streamfl.coordinator.server import CoordinatorServer
    from streamfl.models import ModelSpec
    from streamfl.protocol.transport.base import MqttSettings
    from streamfl.protocol.transport.paho import PahoTransport
    from streamfl.sensors import make_source

    spec = ModelSpec(name="mlp", in_channels=6, window_len=50, num_classes=6, hidden=8)

    def settings(client_id):
        return MqttSettings(host=mqtt_broker.host, port=mqtt_broker.port, client_id=client_id,
                            reconnect_min_s=0.2, reconnect_max_s=1.0)

    config = build(CoordinatorConfig, {"fleet": "q8", "model": spec, "persist_interval_s": 0.2,
                                       "model_encoding": "int8"}, "test")
    server = CoordinatorServer(config, PahoTransport(settings("coordinator")), tmp_path / "coord", tmp_path / "run")
    agent_config = build(AgentConfig, {
        "fleet": "q8", "device_id": "board-1", "model": spec, "min_buffer": 16, "round_interval_s": 0.1,
        "local_steps": 2, "batch_size": 8, "telemetry_interval_s": 0.0, "update_encoding": "int8_delta",
        "sensor": {"windows_per_s": 400.0, "schedule": "all"}}, "test")
    frames = []
    watcher = PahoTransport(settings("watcher"))
    watcher.on_message = lambda topic, payload: frames.append(bytes(payload))
    watcher.connect()
    watcher.subscribe(Topics("q8").device("board-1", "update"), qos=1)
    watcher.subscribe(Topics("q8").model, qos=1)
    assert watcher.wait_connected(10)
    daemon = AgentDaemon(agent_config, PahoTransport(settings("board-1")),
                         make_source(agent_config.sensor, "board-1"), tmp_path / "agent")
    server.start()
    agent = threading.Thread(target=daemon.run, daemon=True)
    agent.start()
    try:
        wait_until(lambda: server.core.counters["aggregated"] >= 3, 60, "three aggregated updates")
        wait_until(lambda: len(frames) >= 3, 10, "the watcher's copies of the updates")
        # the board trains from an int8 model it decoded (three quick rounds can all start from
        # v0 before v1 comes: a CI run saw that)
        wait_until(lambda: daemon.core.base_version >= 1, 30, "a round from a decoded int8 model")
    finally:
        daemon.stop()
        agent.join(30)
        server.stop()
        watcher.close()
    dtypes = [json.loads(f[8:8 + int.from_bytes(f[4:8], "big")].decode())["dtype"] for f in frames]
    assert dtypes.count("int8_delta") >= 2, dtypes  # the first may go as float16 (model replaced)
    assert "int8" in dtypes and set(dtypes) <= {"int8", "int8_delta", "float16"}, dtypes
    assert daemon.core.base_version >= 1 and daemon.counters["rejected_frames"] == 0
    assert server.core.counters["rejected"] == 0 and server.decoder.accepted >= 3
