"""Blockwise int8 on the wire: the error bound, the frame sizes, and hostile int8 frames refused
with a clear reason before any value reaches a sum."""
import json

import numpy as np
import pytest

from streamfl.errors import ProtocolError
from streamfl.models import ModelSpec, build_model, model_to_arrays, tensor_spec
from streamfl.protocol import quantize as q8
from streamfl.protocol.codec import (
    _PREFIX, BLOCK_KEY, FORMAT_VERSION, MAGIC, SCALES, Decoder, encode, encode_update,
)
from streamfl.protocol.messages import PROTOCOL_VERSION, DeltaUpdate, GlobalModel, Update
from streamfl.protocol.tensorblock import block_header, pad8

SPEC = ModelSpec(name="cnn1d", in_channels=3, window_len=50, num_classes=6, hidden=32)
MODEL = model_to_arrays(build_model(SPEC, dropout=0.0, seed=0))


def _decoder():
    return Decoder({SPEC.arch_id: tensor_spec(SPEC)})


def _update(tensors, base_version=3):
    return Update(device_id="d1", update_id="u1", base_version=base_version, arch_id=SPEC.arch_id,
                  tensors=tensors, num_samples=10, class_counts={0: 3}, loss=1.0, seconds_per_sample=0.01)


def _trained(scale=0.01, seed=1):
    rng = np.random.default_rng(seed)
    return {k: (v + scale * rng.standard_normal(v.shape)).astype(np.float32) for k, v in MODEL.items()}


@pytest.mark.parametrize("block", [8, 64, 100, 4096])
@pytest.mark.parametrize("size", [0, 1, 63, 64, 65, 1000])
def test_round_trip_within_half_a_step_of_each_block(block, size):
    rng = np.random.default_rng(size)
    x = (rng.standard_normal(size) * np.exp(rng.uniform(-6, 6, size))).astype(np.float32)
    if size > 10:
        x[3] = 0.0
        x[-5:] = 0.0  # a zero tail: its block (when whole) has scale 0
    codes, scales = q8.quantize(x, block)
    assert codes.dtype == np.int8 and codes.size == size and scales.size == q8.num_blocks(size, block)
    assert codes.min(initial=0) >= -127 and codes.max(initial=0) <= 127
    y = q8.dequantize(codes, scales, x.shape, block)
    assert y.dtype == np.float32 and y.shape == x.shape
    assert (np.abs(y - x) <= q8.error_bound(x, block)).all()


def test_quantize_refuses_non_finite_and_bad_blocks():
    with pytest.raises(ValueError, match="NaN or Inf"):
        q8.quantize(np.array([1.0, np.nan], np.float32))
    for block in (0, 7, q8.MAX_BLOCK + 1, 64.0, True):
        with pytest.raises(ValueError, match="block size"):
            q8.quantize(np.ones(4, np.float32), block)
    with pytest.raises(ValueError, match="needs 4 codes and 1 scales"):
        q8.dequantize(np.zeros(3, np.int8), np.ones(1, np.float32), (4,), 64)


def test_int8_model_frame_is_over_3x_smaller_and_within_the_bound():
    gm = GlobalModel(version=3, arch_id=SPEC.arch_id, tensors=MODEL, hparams={"lr": 0.1})
    full, small = encode(gm), encode(gm, encoding="int8")
    assert len(full) / len(small) > 3.0
    got = _decoder().decode(small)
    assert type(got) is GlobalModel and got.hparams == {"lr": 0.1}
    for k, v in MODEL.items():
        assert (np.abs(got.tensors[k] - v) <= q8.error_bound(v)).all()


def test_int8_delta_update_is_the_change_from_its_base():
    trained = _trained()
    base = GlobalModel(version=3, arch_id=SPEC.arch_id, tensors=MODEL)
    frame = encode_update(_update(trained), "int8_delta", None, base)
    got = _decoder().decode(frame)
    assert isinstance(got, DeltaUpdate) and got.base_version == 3
    for k, v in trained.items():
        delta = v - MODEL[k]
        assert (np.abs(got.tensors[k] - delta) <= q8.error_bound(delta)).all()
    assert len(encode(_update(trained))) / len(frame) > 3.0


def test_without_its_base_an_int8_delta_update_goes_as_float16():
    newer = GlobalModel(version=4, arch_id=SPEC.arch_id, tensors=MODEL)  # replaced mid-round
    frame = encode_update(_update(_trained()), "int8_delta", None, newer)
    got = _decoder().decode(frame)
    assert type(got) is Update and b'"dtype":"float16"' in frame[:4096]
    delta = DeltaUpdate(**vars(got))
    with pytest.raises(ProtocolError, match="cannot encode DeltaUpdate"):
        encode(delta)  # a delta never goes on as if it were the model
    with pytest.raises(ProtocolError, match="base model"):
        encode(_update(MODEL), encoding="int8_delta")
    with pytest.raises(ProtocolError, match="unknown tensor encoding"):
        encode(_update(MODEL), encoding="int4")


# ---- hostile frames ----------------------------------------------------------------------------

def _frame(tensors, encoding="int8_delta", block="64", msg=None, metadata=None):
    """A frame with this tensor block, built by hand (a hostile sender need not use ``encode``)."""
    msg = msg or _update(MODEL)
    body = {k: v for k, v in vars(msg).items() if k != "tensors"}
    body["class_counts"] = {str(k): v for k, v in body.get("class_counts", {}).items()}
    header = {"type": "update" if isinstance(msg, Update) else "global_model", "v": PROTOCOL_VERSION,
              "body": body, "dtype": encoding}
    hb = pad8(json.dumps(header, separators=(",", ":")).encode(), _PREFIX.size)
    meta = metadata if metadata is not None else ({BLOCK_KEY: block} if block is not None else None)
    st = block_header([(n, a.dtype, a.shape) for n, a in tensors], meta)
    return _PREFIX.pack(MAGIC, FORMAT_VERSION, len(hb)) + hb + st + b"".join(a.tobytes() for _, a in tensors)


def _parts(block=64):
    scales, codes = [], []
    for name, arr in MODEL.items():
        q, s = q8.quantize(arr, block)
        scales.append(s)
        codes.append((name, q.reshape(arr.shape)))
    return np.concatenate(scales).astype("<f4"), codes


def _reason(frame):
    with pytest.raises(ProtocolError) as info:
        _decoder().decode(frame)
    return info.value.reason, str(info.value)


def test_a_hand_built_frame_decodes():
    scales, codes = _parts()
    assert isinstance(_decoder().decode(_frame([(SCALES, scales)] + codes)), DeltaUpdate)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf, -1.0, q8.MAX_SCALE * 2, 3e38])
def test_bad_scales_are_refused_as_bounds(value):
    scales, codes = _parts()
    scales[5] = value
    reason, text = _reason(_frame([(SCALES, scales)] + codes))
    assert reason == "bounds" and "block scale" in text


def test_wrong_scale_count_is_refused():
    scales, codes = _parts()
    reason, text = _reason(_frame([(SCALES, scales[:-1])] + codes))
    assert reason == "schema" and "one per 64-element block" in text
    reason, _ = _reason(_frame([(SCALES, scales)] + codes, block="128"))  # same scales, other block
    assert reason == "schema"
    reason, _ = _reason(_frame(codes))  # no scales at all
    assert reason == "schema"


@pytest.mark.parametrize("block", [None, "7", "abc", "-64", str(q8.MAX_BLOCK + 1), "0064" * 3])
def test_block_size_must_be_named_and_in_range(block):
    scales, codes = _parts()
    reason, text = _reason(_frame([(SCALES, scales)] + codes, block=block))
    assert reason == "schema" and BLOCK_KEY in text


def test_int8_data_of_the_wrong_length_or_type_is_refused():
    scales, codes = _parts()
    name, arr = codes[0]
    short = [(name, arr.reshape(-1)[:-1])] + codes[1:]
    assert _reason(_frame([(SCALES, scales)] + short))[0] == "arch_mismatch"
    as_float = [(name, arr.astype("<f4"))] + codes[1:]
    reason, text = _reason(_frame([(SCALES, scales)] + as_float))
    assert reason == "schema" and "int8_delta frames send it as int8" in text
    # a block header that claims more bytes than the frame holds
    frame = _frame([(SCALES, scales)] + codes)
    assert _reason(frame[:-3])[0] == "malformed"


def test_the_code_minus_128_is_refused():
    scales, codes = _parts()
    name, arr = codes[1]
    bad = arr.copy().reshape(-1)
    bad[0] = -128
    reason, text = _reason(_frame([(SCALES, scales)] + [codes[0], (name, bad.reshape(arr.shape))] + codes[2:]))
    assert reason == "bounds" and "-128" in text


def test_a_delta_model_and_int8_in_a_float_frame_are_refused():
    scales, codes = _parts()
    gm = GlobalModel(version=1, arch_id=SPEC.arch_id, tensors=MODEL)
    assert _reason(_frame([(SCALES, scales)] + codes, msg=gm))[0] == "schema"
    assert _reason(_frame([(SCALES, scales)] + codes, encoding="float32", block=None))[0] in (
        "schema", "arch_mismatch")
    assert _reason(_frame([(SCALES, scales)] + codes, encoding="int4"))[0] == "schema"


def test_dequantized_values_stay_finite_at_the_largest_scale():
    scales, codes = _parts()
    scales[:] = q8.MAX_SCALE
    got = _decoder().decode(_frame([(SCALES, scales)] + codes))
    assert all(np.isfinite(t).all() and np.abs(t).max() <= q8.MAX_ABS_VALUE * 1.0001
               for t in got.tensors.values())
