"""Window wire encodings (JSON and SFW1 binary) and the MQTT sensor source that consumes them."""
import importlib.util
import itertools
import json
import struct
import threading
import time

import numpy as np
import pytest

from streamfl.errors import SensorError
from streamfl.sensors import (MqttSensorSource, SensorConfig, Window, decode_window,
                              encode_window_binary, encode_window_json, make_source)
from streamfl.sensors.encoding import MAGIC, MAX_PAYLOAD_BYTES
from streamfl.sensors.window import UNLABELLED


def window(label=2, t_s=12.5, shape=(50, 6), seed=0):
    x = np.random.default_rng(seed).normal(size=shape).astype(np.float32)
    return Window(x, label, t_s)


@pytest.mark.parametrize("encode", [encode_window_json, encode_window_binary])
@pytest.mark.parametrize("label", [0, 5, UNLABELLED])
def test_round_trip_is_exact(encode, label):
    w = window(label=label)
    out = decode_window(encode(w), expected_shape=(50, 6), num_classes=6)
    np.testing.assert_array_equal(out.x, w.x)
    assert out.x.dtype == np.float32
    assert out.label == label and out.t_s == 12.5


def test_binary_layout_is_as_documented():
    w = window(label=3, t_s=1.5, shape=(2, 3))
    payload = encode_window_binary(w)
    assert payload[:4] == MAGIC and len(payload) == 4 + 2 + 2 + 4 + 8 + 2 * 3 * 4
    assert struct.unpack("<HHid", payload[4:20]) == (2, 3, 3, 1.5)
    np.testing.assert_array_equal(np.frombuffer(payload[20:], "<f4").reshape(2, 3), w.x)
    assert len(encode_window_binary(window())) == 1220


def test_json_as_a_person_would_write_it():
    doc = b'  {"x": [[1, 2.5], [3, 4]], "label": null, "extra": "ignored"}'
    w = decode_window(doc, default_t_s=7.0)
    assert w.x.tolist() == [[1.0, 2.5], [3.0, 4.0]]
    assert w.label == UNLABELLED and w.t_s == 7.0
    assert json.loads(encode_window_json(w))["label"] is None


@pytest.mark.parametrize("payload,match", [
    (b"", "unknown window encoding"),
    (b"hello", "unknown window encoding"),
    (b"[1, 2]", "unknown window encoding"),
    (b"{not json", "not valid JSON"),
    (b"\xff{", "unknown window encoding"),
    (b'{"label": 1}', "key 'x'"),
    (b'{"x": []}', "non-empty list"),
    (b'{"x": [1, 2]}', "non-empty list of rows"),
    (b'{"x": [[1, 2], [3]]}', "differ in length"),
    (b'{"x": [[1, "a"]]}', "non-number"),
    (b'{"x": [[1, true]]}', "non-number"),
    (b'{"x": [[1, NaN]]}', "non-finite"),
    (b'{"x": [[1, Infinity]]}', "non-finite"),
    (b'{"x": [[1e39]]}', "float32 range"),
    (b'{"x": [[1' + b'0' * 400 + b']]}', "numeric matrix"),
    (b'{"x": [[]]}', "T, C >= 1"),
    (b'{"x": [[1]], "label": 1.5}', "'label'"),
    (b'{"x": [[1]], "label": true}', "'label'"),
    (b'{"x": [[1]], "label": -2}', "label -2"),
    (b'{"x": [[1]], "t_s": "now"}', "'t_s'"),
    (b'{"x": [[1]], "t_s": NaN}', "t_s is not finite"),
    (MAGIC + b"\x01", "shorter than"),
    (MAGIC + struct.pack("<HHid", 2, 2, 0, 0.0) + b"\x00" * 12, "needs 36 bytes, got 32"),
    (MAGIC + struct.pack("<HHid", 1, 1, 0, 0.0) + struct.pack("<f", float("inf")), "non-finite"),
    (MAGIC + struct.pack("<HHid", 1, 1, 0, float("nan")) + struct.pack("<f", 1.0), "t_s"),
    (MAGIC + struct.pack("<HHid", 0, 3, 0, 0.0), "T, C >= 1"),
])
def test_malformed_payloads_are_rejected(payload, match):
    with pytest.raises(SensorError, match=match):
        decode_window(payload)


def test_shape_label_and_size_limits():
    for encode in (encode_window_json, encode_window_binary):
        with pytest.raises(SensorError, match="expected"):
            decode_window(encode(window(shape=(49, 6))), expected_shape=(50, 6))
        with pytest.raises(SensorError, match="label 6"):
            decode_window(encode(window(label=6)), num_classes=6)
    with pytest.raises(SensorError, match="exceeds"):
        decode_window(b"{" + b" " * MAX_PAYLOAD_BYTES + b"}")
    with pytest.raises(SensorError, match="bytes"):
        decode_window("{}")


# ---- MqttSensorSource ------------------------------------------------------------------------

HAVE_MEMORY = importlib.util.find_spec("streamfl.protocol.transport.memory") is not None
HAVE_PAHO = importlib.util.find_spec("streamfl.protocol.transport.paho") is not None
TOPIC = "streamfl/v1/f1/device/dev-1/sensor"
SMALL = SensorConfig(kind="mqtt", window_len=4, channels=3, num_classes=3, queue_len=3)


def small(i, label=1):
    return Window(np.full((4, 3), float(i), np.float32), label, float(i))


def memory_pair():
    from streamfl.protocol.transport.memory import MemoryBroker, MemoryTransport

    broker = MemoryBroker()
    device = MemoryTransport(broker, "dev-1")
    publisher = MemoryTransport(broker, "phone")
    device.connect()
    publisher.connect()
    return device, publisher


@pytest.mark.skipif(not HAVE_MEMORY, reason="streamfl.protocol.transport.memory not written yet")
def test_mqtt_source_decodes_queues_and_counts():
    device, publisher = memory_pair()
    other = []
    device.on_message = lambda topic, payload: other.append(topic)
    device.subscribe("streamfl/v1/f1/model", qos=1)
    src = MqttSensorSource(device, TOPIC, SMALL)
    publisher.publish(TOPIC, encode_window_json(small(1)), qos=1)
    publisher.publish(TOPIC, encode_window_binary(small(2, UNLABELLED)), qos=1)
    publisher.publish(TOPIC, b"garbage", qos=1)
    publisher.publish(TOPIC, encode_window_binary(window()), qos=1)  # 50 x 6: wrong shape
    publisher.publish("streamfl/v1/f1/model", b"not for the sensor", qos=1)
    assert src.received == 2 and src.rejected == 2 and src.queued == 2
    assert "expected (4, 3)" in src.last_rejection
    assert other == ["streamfl/v1/f1/model"]  # the previous handler still gets other topics
    it = src.windows()
    got = [next(it), next(it)]
    assert [int(w.x[0, 0]) for w in got] == [1, 2]
    assert [w.label for w in got] == [1, UNLABELLED]
    src.close()
    assert list(it) == []


@pytest.mark.skipif(not HAVE_MEMORY, reason="streamfl.protocol.transport.memory not written yet")
def test_mqtt_source_drops_the_oldest_when_full():
    device, publisher = memory_pair()
    src = MqttSensorSource(device, TOPIC, SMALL)
    for i in range(7):
        publisher.publish(TOPIC, encode_window_binary(small(i)), qos=1)
    assert src.dropped == 4 and src.queued == 3
    assert [int(w.x[0, 0]) for w in itertools.islice(src.windows(), 3)] == [4, 5, 6]


@pytest.mark.skipif(not HAVE_MEMORY, reason="streamfl.protocol.transport.memory not written yet")
def test_mqtt_source_blocks_until_a_window_or_close():
    device, publisher = memory_pair()
    src = make_source(SMALL, "dev-1", transport=device, fleet="f1")
    assert src.topic == TOPIC
    got = []
    th = threading.Thread(target=lambda: got.extend(src.windows()))
    th.start()
    time.sleep(0.1)
    publisher.publish(TOPIC, encode_window_json(small(9)), qos=1)
    deadline = time.monotonic() + 2
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    t0 = time.monotonic()
    src.close()
    th.join(2.0)
    assert not th.is_alive() and time.monotonic() - t0 < 1.0
    assert [int(w.x[0, 0]) for w in got] == [9]


def test_factory_needs_a_transport_and_a_topic():
    with pytest.raises(SensorError, match="transport"):
        make_source(SensorConfig(kind="mqtt"), "dev-1")

    class Dummy:  # never reached: the factory refuses before touching it
        on_message = None

    with pytest.raises(SensorError, match="fleet"):
        make_source(SensorConfig(kind="mqtt"), "dev-1", transport=Dummy())


@pytest.mark.skipif(not HAVE_PAHO, reason="streamfl.protocol.transport.paho not written yet")
def test_mqtt_source_over_a_real_broker(mqtt_broker):
    from streamfl.protocol.transport.base import MqttSettings
    from streamfl.protocol.transport.paho import PahoTransport

    def client(cid):
        t = PahoTransport(MqttSettings(host=mqtt_broker.host, port=mqtt_broker.port, client_id=cid,
                                       persistent_session=False))
        t.connect()
        assert t.wait_connected(10.0)
        return t

    device, publisher = client("dev-1"), client("phone")
    try:
        src = MqttSensorSource(device, TOPIC, SMALL)
        time.sleep(0.3)  # let the subscription reach the broker
        publisher.publish(TOPIC, encode_window_binary(small(3)), qos=1)
        publisher.publish(TOPIC, b"{bad", qos=1)
        publisher.publish(TOPIC, encode_window_json(small(4)), qos=1)
        got = []
        th = threading.Thread(target=lambda: got.extend(itertools.islice(src.windows(), 2)))
        th.start()
        th.join(10.0)
        src.close()
        assert [int(w.x[0, 0]) for w in got] == [3, 4]
        assert src.rejected == 1
    finally:
        device.close()
        publisher.close()
