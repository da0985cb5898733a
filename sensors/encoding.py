"""Wire encodings of one window on a device's ``sensor`` topic, so any process can feed an agent.

Two forms; ``decode_window`` tells them apart by the first bytes.

JSON (easy from any language or ``mosquitto_pub``), UTF-8::

    {"x": [[a0, a1, ...], ...], "label": 3, "t_s": 12.5, "state": 1}

``x`` is T rows of C numbers; ``label`` is a class id, or ``null``/absent for unlabelled;
``t_s`` (seconds, optional) is the time of the last sample; ``state`` (optional) is the window's
latent-state id (SFedPO's "at work", "at home", ...), an integer 0..``MAX_STATE``, or
``null``/absent when the source does not know it (``UNKNOWN_STATE``). Other keys are ignored, so
decoders older than ``state`` accept windows that carry it; the encoder still writes ``state``
only when it is known, so a window without one encodes exactly as before.

Binary (compact: a 50 x 6 window is 1220 bytes instead of ~3 kB), little-endian, in two versions::

    b"SFW1" | uint16 T | uint16 C | int32 label (-1 = unlabelled) | float64 t_s | T*C float32
    b"SFW2" | uint16 T | uint16 C | int32 label (-1 = unlabelled) | int32 state | float64 t_s
            | T*C float32

with the data row-major ([T, C]). The encoder writes ``SFW1`` for a window of unknown state (byte
for byte what it wrote before states existed) and ``SFW2`` for one with a state, which must then be
0..``MAX_STATE``; the decoder takes both. Payloads that are malformed, non-finite, of the wrong
shape, carry a label outside the configured classes or a state outside 0..``MAX_STATE`` raise
``SensorError``.
"""
import json
import math
import struct
from typing import Optional, Tuple

import numpy as np

from streamfl.errors import SensorError
from streamfl.sensors.window import UNKNOWN_STATE, UNLABELLED, Window

#: Magic of the binary form without a state (``MAGIC_STATE``: with one).
MAGIC = b"SFW1"
MAGIC_STATE = b"SFW2"
_HEADER = struct.Struct("<4sHHid")
_HEADER_STATE = struct.Struct("<4sHHiid")
#: Largest latent-state id on the wire: a fleet names a handful of states (SFedPO's are places and
#: activities), so a bigger id is a corrupt or hostile payload; 16 bits leave room for any real set.
MAX_STATE = 65535
#: Refuse payloads above this size before parsing (a 50 x 6 JSON window is about 3-6 kB).
MAX_PAYLOAD_BYTES = 1 << 20


def _check_state(state: int) -> int:
    """A known state on the wire is 0..MAX_STATE (unknown is said by leaving it out)."""
    if isinstance(state, bool) or not isinstance(state, int):
        raise SensorError("window 'state' must be an integer or null, got %r" % (state,))
    if state < 0 or state > MAX_STATE:
        raise SensorError("window state %d outside 0..%d" % (state, MAX_STATE))
    return state


def _known_state(window: Window) -> Optional[int]:
    """The window's state to encode, None when unknown; refuses one no decoder would take."""
    state = int(window.state)
    return None if state == UNKNOWN_STATE else _check_state(state)


def encode_window_json(window: Window) -> bytes:
    """The JSON form; float32 values survive the round trip exactly (shortest repr of each)."""
    label = None if window.label == UNLABELLED else int(window.label)
    doc = {"x": np.asarray(window.x, dtype=np.float32).tolist(), "label": label,
           "t_s": float(window.t_s)}
    state = _known_state(window)
    if state is not None:  # left out when unknown: the same bytes as before states existed
        doc["state"] = state
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


def encode_window_binary(window: Window) -> bytes:
    """``SFW1`` when the state is unknown (unchanged bytes for old decoders), else ``SFW2``."""
    x = np.ascontiguousarray(window.x, dtype="<f4")
    t, c = x.shape
    if t > 0xFFFF or c > 0xFFFF:
        raise SensorError("window %d x %d is too large for the binary form" % (t, c))
    state = _known_state(window)
    if state is None:
        header = _HEADER.pack(MAGIC, t, c, int(window.label), float(window.t_s))
    else:
        header = _HEADER_STATE.pack(MAGIC_STATE, t, c, int(window.label), state,
                                    float(window.t_s))
    return header + x.tobytes()


def _check(x: np.ndarray, label: int, t_s: float, expected_shape: Optional[Tuple[int, int]],
           num_classes: Optional[int], state: int = UNKNOWN_STATE) -> Window:
    """The checks both forms share (the state is checked where it is read), then the window."""
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise SensorError("window data must be [T, C] with T, C >= 1, got shape %s" % (x.shape,))
    if expected_shape is not None and tuple(x.shape) != tuple(expected_shape):
        raise SensorError("window shape %s, expected %s" % (tuple(x.shape), tuple(expected_shape)))
    if not np.isfinite(x).all():
        raise SensorError("window holds non-finite values")
    if not math.isfinite(t_s):
        raise SensorError("window t_s is not finite")
    if label < UNLABELLED or (num_classes is not None and label >= num_classes):
        raise SensorError("window label %d outside -1..%s" % (
            label, num_classes - 1 if num_classes is not None else "K-1"))
    return Window(x.astype(np.float32, copy=False), label, t_s, state)


def _unpack_header(payload: bytes) -> Tuple[struct.Struct, int, int, int, int, float]:
    """(header, T, C, label, state, t_s) of an SFW1 or SFW2 frame; SFW1 has no state."""
    header = _HEADER_STATE if payload.startswith(MAGIC_STATE) else _HEADER
    if len(payload) < header.size:
        raise SensorError("binary window shorter than its %d-byte header" % header.size)
    if header is _HEADER:
        _, t, c, label, t_s = header.unpack_from(payload)
        return header, t, c, label, UNKNOWN_STATE, t_s
    _, t, c, label, state, t_s = header.unpack_from(payload)
    return header, t, c, label, _check_state(state), t_s  # SFW2 never says "unknown": that is SFW1


def _decode_binary(payload: bytes, default_t_s, expected_shape, num_classes) -> Window:
    header, t, c, label, state, t_s = _unpack_header(payload)
    want = header.size + 4 * t * c
    if len(payload) != want:
        raise SensorError("binary window of %d x %d needs %d bytes, got %d" % (
            t, c, want, len(payload)))
    x = np.frombuffer(payload, dtype="<f4", offset=header.size).reshape(t, c).astype(np.float32)
    return _check(x, label, t_s, expected_shape, num_classes, state)


def _decode_json(payload: bytes, default_t_s, expected_shape, num_classes) -> Window:
    try:
        doc = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SensorError("window is not valid JSON: %s" % exc) from None
    if not isinstance(doc, dict) or "x" not in doc:
        raise SensorError("JSON window must be an object with key 'x'")
    rows = doc["x"]
    if not isinstance(rows, list) or not rows or not all(isinstance(r, list) for r in rows):
        raise SensorError("JSON window 'x' must be a non-empty list of rows")
    width = len(rows[0])
    if any(len(r) != width for r in rows):
        raise SensorError("JSON window 'x' rows differ in length")
    for r in rows:
        for v in r:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise SensorError("JSON window 'x' holds a non-number: %r" % (v,))
    try:
        x = np.array(rows, dtype=np.float64).reshape(len(rows), width)
    except (OverflowError, ValueError) as exc:
        raise SensorError("JSON window 'x' is not a numeric matrix: %s" % exc) from None
    if np.abs(x[np.isfinite(x)]).max(initial=0.0) > np.finfo(np.float32).max:
        raise SensorError("window holds values beyond float32 range")
    label = doc.get("label")
    if label is None:
        label = UNLABELLED
    elif isinstance(label, bool) or not isinstance(label, int):
        raise SensorError("JSON window 'label' must be an integer or null, got %r" % (label,))
    t_s = doc.get("t_s", default_t_s)
    if isinstance(t_s, bool) or not isinstance(t_s, (int, float)):
        raise SensorError("JSON window 't_s' must be a number, got %r" % (t_s,))
    state = doc.get("state")
    state = UNKNOWN_STATE if state is None else _check_state(state)
    return _check(x.astype(np.float32), label, float(t_s), expected_shape, num_classes, state)


def decode_window(payload: bytes, default_t_s: float = 0.0,
                  expected_shape: Optional[Tuple[int, int]] = None,
                  num_classes: Optional[int] = None) -> Window:
    """Decode either form (detected by the ``SFW1``/``SFW2`` magic or a leading ``{``).

    ``default_t_s`` stands in for a JSON window without ``t_s`` (e.g. the arrival time);
    ``expected_shape`` (T, C) and ``num_classes`` reject windows the model cannot take.
    """
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise SensorError("window payload must be bytes, got %s" % type(payload).__name__)
    payload = bytes(payload)
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise SensorError("window payload of %d bytes exceeds %d" % (len(payload), MAX_PAYLOAD_BYTES))
    if payload.startswith(MAGIC) or payload.startswith(MAGIC_STATE):
        return _decode_binary(payload, default_t_s, expected_shape, num_classes)
    if payload.lstrip()[:1] == b"{":
        return _decode_json(payload, default_t_s, expected_shape, num_classes)
    raise SensorError("unknown window encoding (neither %r/%r binary nor a JSON object)" % (
        MAGIC, MAGIC_STATE))
