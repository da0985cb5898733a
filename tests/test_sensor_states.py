"""Latent states through the sensor sources: the MQTT codec (JSON, SFW1/SFW2) and replay."""
import importlib.util
import json
import struct

import numpy as np
import pytest

from streamfl.errors import SensorError
from streamfl.sensors import (MqttSensorSource, ReplaySource, SensorConfig, Window, decode_window,
                              encode_window_binary, encode_window_json, save_npz)
from streamfl.sensors.datasets import load_npz
from streamfl.sensors.encoding import MAGIC, MAGIC_STATE, MAX_STATE
from streamfl.sensors.window import UNKNOWN_STATE, UNLABELLED

ENCODERS = [encode_window_json, encode_window_binary]


def window(state=UNKNOWN_STATE, label=2, shape=(5, 3), seed=0):
    x = np.random.default_rng(seed).normal(size=shape).astype(np.float32)
    return Window(x, label, 12.5, state)


# ---- codec -----------------------------------------------------------------------------------

@pytest.mark.parametrize("encode", ENCODERS)
@pytest.mark.parametrize("state", [UNKNOWN_STATE, 0, 3, MAX_STATE])
@pytest.mark.parametrize("label", [1, UNLABELLED])
def test_round_trip_keeps_the_state(encode, state, label):
    w = window(state, label)
    out = decode_window(encode(w), expected_shape=(5, 3), num_classes=4)
    np.testing.assert_array_equal(out.x, w.x)
    assert (out.label, out.t_s, out.state) == (label, 12.5, state)


def test_unknown_state_encodes_exactly_as_before_states():
    w = window()
    x = np.ascontiguousarray(w.x, dtype="<f4")
    assert encode_window_binary(w) == MAGIC + struct.pack("<HHid", 5, 3, 2, 12.5) + x.tobytes()
    assert encode_window_json(w) == json.dumps(
        {"x": w.x.tolist(), "label": 2, "t_s": 12.5}, separators=(",", ":")).encode()


def test_sfw2_layout_and_json_key():
    w = window(7, shape=(2, 3))
    payload = encode_window_binary(w)
    assert payload[:4] == MAGIC_STATE and len(payload) == 4 + 2 + 2 + 4 + 4 + 8 + 2 * 3 * 4
    assert struct.unpack("<HHiid", payload[4:24]) == (2, 3, 2, 7, 12.5)
    np.testing.assert_array_equal(np.frombuffer(payload[24:], "<f4").reshape(2, 3), w.x)
    assert json.loads(encode_window_json(w))["state"] == 7


def test_sfw1_frames_decode_with_an_unknown_state():
    payload = MAGIC + struct.pack("<HHid", 1, 2, 0, 3.0) + struct.pack("<2f", 1.0, 2.0)
    w = decode_window(payload)
    assert w.state == UNKNOWN_STATE and w.x.tolist() == [[1.0, 2.0]] and w.t_s == 3.0


@pytest.mark.parametrize("doc", [b'{"x": [[1]]}', b'{"x": [[1]], "state": null}'])
def test_json_without_a_state_is_unknown(doc):
    assert decode_window(doc).state == UNKNOWN_STATE


def test_json_state_as_a_person_would_write_it():
    assert decode_window(b'{"x": [[1, 2]], "label": 0, "state": 4}').state == 4


@pytest.mark.parametrize("state,match", [
    (b"-1", "state -1 outside"),
    (b"-7", "state -7 outside"),
    (str(MAX_STATE + 1).encode(), "outside 0..%d" % MAX_STATE),
    (b"1" + b"0" * 40, "outside 0..%d" % MAX_STATE),
    (b"true", "'state' must be an integer"),
    (b"false", "'state' must be an integer"),
    (b"1.0", "'state' must be an integer"),
    (b"2.5", "'state' must be an integer"),
    (b'"3"', "'state' must be an integer"),
    (b"[3]", "'state' must be an integer"),
    (b'{"id": 3}', "'state' must be an integer"),
    (b"NaN", "'state' must be an integer"),
])
def test_hostile_json_states_are_refused(state, match):
    with pytest.raises(SensorError, match=match):
        decode_window(b'{"x": [[1]], "state": ' + state + b"}")


def sfw2(state, t=1, c=1, label=0, data=b"\x00\x00\x80\x3f"):
    return MAGIC_STATE + struct.pack("<HHiid", t, c, label, state, 0.0) + data


@pytest.mark.parametrize("payload,match", [
    (sfw2(-1), "state -1 outside"),  # unknown is SFW1, never an SFW2 frame
    (sfw2(-(2 ** 31)), "outside 0..%d" % MAX_STATE),
    (sfw2(MAX_STATE + 1), "outside 0..%d" % MAX_STATE),
    (sfw2(2 ** 31 - 1), "outside 0..%d" % MAX_STATE),
    (MAGIC_STATE + struct.pack("<HHid", 1, 1, 0, 0.0), "shorter than its 24-byte header"),
    (sfw2(1, t=2, c=2, data=b"\x00" * 12), "needs 40 bytes, got 36"),
    (sfw2(1, data=struct.pack("<f", float("nan"))), "non-finite"),
    (sfw2(1, t=0, data=b""), "T, C >= 1"),
    (sfw2(1, label=-2), "label -2"),
])
def test_hostile_sfw2_frames_are_refused(payload, match):
    with pytest.raises(SensorError, match=match):
        decode_window(payload)


@pytest.mark.parametrize("encode", ENCODERS)
def test_sfw2_keeps_the_shape_and_label_limits(encode):
    with pytest.raises(SensorError, match="expected"):
        decode_window(encode(window(1, shape=(4, 3))), expected_shape=(5, 3))
    with pytest.raises(SensorError, match="label 4"):
        decode_window(encode(window(1, label=4)), num_classes=4)


@pytest.mark.parametrize("encode", ENCODERS)
def test_encoder_refuses_a_state_no_decoder_takes(encode):
    with pytest.raises(SensorError, match="outside 0..%d" % MAX_STATE):
        encode(window(MAX_STATE + 1))


HAVE_MEMORY = importlib.util.find_spec("streamfl.protocol.transport.memory") is not None


@pytest.mark.skipif(not HAVE_MEMORY, reason="streamfl.protocol.transport.memory not written yet")
def test_mqtt_source_passes_the_state_through():
    from streamfl.protocol.transport.memory import MemoryBroker, MemoryTransport

    broker = MemoryBroker()
    device, publisher = MemoryTransport(broker, "dev-1"), MemoryTransport(broker, "phone")
    device.connect()
    publisher.connect()
    topic = "streamfl/v1/f1/device/dev-1/sensor"
    cfg = SensorConfig(kind="mqtt", window_len=5, channels=3, num_classes=4, queue_len=8)
    src = MqttSensorSource(device, topic, cfg)
    for w in (window(2), window(), window(5)):
        publisher.publish(topic, encode_window_binary(w), qos=1)
    publisher.publish(topic, encode_window_json(window(6)), qos=1)
    it = src.windows()
    assert [next(it).state for _ in range(4)] == [2, UNKNOWN_STATE, 5, 6]
    src.close()


# ---- replay ----------------------------------------------------------------------------------

N = 8


def arrays():
    """N windows [4, 3]; window i holds i, label i % 3, subject 10 + i % 2."""
    X = np.repeat(np.arange(N, dtype=np.float32)[:, None, None], 4, axis=1).repeat(3, axis=2)
    return X, np.arange(N, dtype=np.int64) % 3, 10 + np.arange(N, dtype=np.int64) % 2


def with_states(path, states):
    """A dataset file as ``save_npz`` writes it, plus a ``state`` key."""
    X, y, subject = arrays()
    np.savez(str(path), X=X, y=y, subject=subject, classes=np.asarray(["a", "b", "c"]),
             state=np.asarray(states))
    return path


STATES = [0, 1, 1, -1, 2, 0, 3, 2]


def test_replay_carries_the_files_states(tmp_path):
    path = with_states(tmp_path / "s.npz", np.asarray(STATES, dtype=np.int64))
    assert load_npz(path).X.shape == (N, 4, 3)  # the dataset reader ignores the extra key
    ws = list(ReplaySource(path).windows())
    assert [int(w.x[0, 0]) for w in ws] == list(range(N))
    assert [w.state for w in ws] == STATES


def test_replay_states_follow_subject_filter_and_shuffle(tmp_path):
    path = with_states(tmp_path / "s.npz", np.asarray(STATES, dtype=np.int32))
    ws = list(ReplaySource(path, subject=11, shuffle=True, seed=3).windows())
    assert sorted(int(w.x[0, 0]) for w in ws) == [1, 3, 5, 7]
    assert all(w.state == STATES[int(w.x[0, 0])] for w in ws)


def test_replay_without_states_gives_unknown(tmp_path):
    path = save_npz(tmp_path / "d.npz", *arrays(), ["a", "b", "c"])
    assert [w.state for w in ReplaySource(path).windows()] == [UNKNOWN_STATE] * N
    assert [w.state for w in ReplaySource(load_npz(path)).windows()] == [UNKNOWN_STATE] * N


def test_replay_of_an_in_memory_dataset_takes_states(tmp_path):
    data = load_npz(save_npz(tmp_path / "d.npz", *arrays(), ["a", "b", "c"]))
    assert [w.state for w in ReplaySource(data, states=STATES).windows()] == STATES
    with pytest.raises(SensorError, match="must be integer"):
        ReplaySource(data, states=STATES[:-1])


@pytest.mark.parametrize("states,match", [
    (np.asarray(STATES[:-1], dtype=np.int64), r"must be integer \[N\] = \[8\]"),
    (np.asarray([STATES], dtype=np.int64), r"must be integer \[N\] = \[8\]"),
    (np.asarray(STATES, dtype=np.float64), "must be integer"),
    (np.asarray(STATES, dtype=bool), "must be integer"),
    (np.asarray([0] * 7 + [-2], dtype=np.int64), r"outside -1\.\.%d \(min -2" % MAX_STATE),
    (np.asarray([0] * 7 + [MAX_STATE + 1], dtype=np.int64), "outside -1..%d" % MAX_STATE),
])
def test_a_bad_states_array_is_refused_naming_the_file(tmp_path, states, match):
    path = with_states(tmp_path / "bad-states.npz", states)
    with pytest.raises(SensorError, match=match) as err:
        ReplaySource(path)
    assert "bad-states.npz" in str(err.value) and "'state'" in str(err.value)


def test_an_object_states_array_is_refused_without_unpickling(tmp_path):
    X, y, subject = arrays()
    path = tmp_path / "pickled.npz"
    np.savez(str(path), X=X, y=y, subject=subject, classes=np.asarray(["a", "b", "c"]),
             state=np.asarray([0] * (N - 1) + [None], dtype=object))
    with pytest.raises(SensorError, match="pickled.npz.*without pickle"):
        ReplaySource(path)
