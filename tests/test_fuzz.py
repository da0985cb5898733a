"""Property-based fuzzing of what parses outside input: the frame decoder, the
header schema and the config loaders raise only their typed errors, and decoding allocates no more
than the frame plus a bounded amount, whatever sizes the frame claims.

Settings are derandomized (CI runs the same examples every time) and sized to run in well under a
minute on two cores.
"""
import copy
import dataclasses
import json
import math
import struct
import tracemalloc
import typing
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from factories import SPEC, make_global_model, make_hello, make_tensors, make_update
from streamfl import config as config_loader
from streamfl.agent import plugins as agent_plugins
from streamfl.agent.config import AgentConfig, load_agent_config
from streamfl.coordinator import plugins as coordinator_plugins
from streamfl.coordinator.config import CoordinatorConfig, load_config
from streamfl.errors import ConfigError, ProtocolError
from streamfl.models import tensor_spec
from streamfl.protocol import codec
from streamfl.protocol.codec import REASONS, Decoder, encode
from streamfl.protocol.messages import (
    MESSAGE_TYPES, Command, CommandReply, CoordinatorStatus, DeviceReply, GlobalModel, Offline, Telemetry,
    Update,
)
from streamfl.methods.clp.payloads import ClpState, FisherTrace
from streamfl.methods.fedcurv.payloads import CurvatureDiagonal, CurvatureTerms
from streamfl.protocol.schema import check_body

FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SPECS = {SPEC.arch_id: tensor_spec(SPEC)}
#: The decoders under test cap each JSON text at this (every valid frame here has headers < 2 KiB).
MAX_HEADER_BYTES = 8 * 1024
#: Allowed allocation beyond the frame's own size. Decoding holds the copied header text and its
#: str (<= 2 x the text), the parsed JSON objects (up to ~40 x the text: ``{}`` is 2 bytes and a
#: 64-byte dict; capped at ``MAX_HEADER_BYTES`` per text), float32 copies of float16 tensors (the
#: frames here carry < 1 KiB of tensors) and a few KB of arrays, plans and exception text. 1 MiB
#: is far below what a claimed shape would cost (a single 2**20-element claim is 4 MiB), and
#: above 2 x 8 KiB x 40 = 640 KiB of JSON objects.
SLACK_BYTES = 2 ** 20


# ---- valid frames of every message type -------------------------------------------------------

def _messages():
    u, v, f = (make_tensors(SPEC, seed=s) for s in (1, 2, 3))
    f = {k: np.abs(a) for k, a in f.items()}  # a Fisher diagonal is >= 0
    u = {k: np.abs(a) for k, a in u.items()}  # and so is U, a sum of them (a declared bound)
    return [
        make_hello(dvfs_levels={"cpu": [0, 1, 2], "gpu": [3]}),
        Offline(device_id="d1", reason="lost"),
        CoordinatorStatus(online=True, version=7),
        make_global_model(version=7, hparams={"lr": 0.01, "batch_size": 32}),
        make_global_model(version=8, value=0.25, extras={
            "clp": ClpState(version=7, fisher_global=2.5, fisher_global_prev=None, in_clp=True,
                            segment=1, segment_start_version=3, regulating=True),
            "curvature": CurvatureTerms(lambda2=0.5, fisher_samples=20, U=u, V=v)}),
        make_update(),
        make_update(seed=4, round_index=3, energy_j=3.0, clock_levels={"cpu": 2}, extras={
            "fisher_trace": FisherTrace(12.5), "curvature_diagonal": CurvatureDiagonal(f)}),
        Command(kind="override", params={"lr": 0.001, "dvfs": {"cpu": 1}}),
        Telemetry(device_id="d1", time_s=12.5, buffer_fill=100, buffer_capacity=512, rounds=4,
                  power_w=5.5, clocks_khz={"cpu": 1500000}, temperatures_c={"soc": 51.0},
                  predictions_per_s=4.75, prediction_confidence=0.875, predictions_dropped=3),
        CommandReply(kind="status", seq=3, ok=False, handled_by=[], error="nobody", result={"a": [1]}),
        DeviceReply(device_id="d1", kind="set", seq=4, ok=False, error="unknown setting", run_id="r1"),
    ]


FRAMES = [encode(m, float16=f16) for m in _messages() for f16 in (False, True)]
TENSOR_FRAMES = [f for m, f in zip([m for m in _messages() for _ in (0, 1)], FRAMES)
                 if isinstance(m, (GlobalModel, Update))]


def split(frame):
    """(header JSON bytes, block header JSON bytes, tensor bytes) of a well-formed frame."""
    (header_len,) = struct.unpack_from(">I", frame, 4)
    block = 8 + header_len
    (st_len,) = struct.unpack_from("<Q", frame, block)
    return frame[8:block], frame[block + 8:block + 8 + st_len], frame[block + 8 + st_len:]


def assemble(header, st_json, data):
    return (struct.pack(">3sBI", codec.MAGIC, codec.FORMAT_VERSION, len(header)) + header
            + struct.pack("<Q", len(st_json)) + st_json + data)


# ---- mutations --------------------------------------------------------------------------------

_SPLICE = "\u0000splice\u0000"
_HUGE = [2 ** 31, 2 ** 32, 2 ** 53 + 1, 2 ** 62, 2 ** 63 - 1, 2 ** 63, 2 ** 64, 10 ** 30, 10 ** 400]


def _deep(depth, kind):
    if kind == "list":
        return "[" * depth + "]" * depth
    if kind == "dict":
        return '{"a":' * depth + "0" + "}" * depth
    return "[" * depth  # unterminated


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12) | st.sampled_from(_HUGE),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12)
#: JSON text spliced into a header in place of a value: plain values, numbers JSON spells but
#: Python cannot hold (as floats), deep nesting, and text that is not JSON at all.
edge_numbers = st.sampled_from(["9" * 400, "-" + "9" * 400, "1" * 5000, "1e999", "-1e999", "1e-400",
                                "-1", "-0", "18446744073709551616", "NaN", "-Infinity", "2.5e308"])
#: What a number field may receive: beyond float range, negative, zero, fractional, overflowing.
number_edges = st.sampled_from(["9" * 400, "-" + "9" * 400, "-1", "0", "0.5", "1e999"])
raw_json = st.one_of(
    edge_numbers,
    st.builds(_deep, st.integers(min_value=1, max_value=3000), st.sampled_from(["list", "dict", "open"])),
    json_values.map(json.dumps),
    st.integers(min_value=-2 ** 80, max_value=2 ** 80).map(str),
    st.sampled_from(['"\\ud800"', '"\\u0000"', "[]", "{}", '{"":0}', "", "}", '"', "[1,]", "0x10", "1_000"]),
)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from _paths(value, prefix + (i,))


def _get(obj, path):
    for p in path:
        obj = obj[p]
    return obj


def _splice(obj, path, raw, add_key=None):
    """JSON text of ``obj`` with the value at ``path`` (or a new key ``add_key`` in the dict there)
    replaced by the raw text ``raw``."""
    obj = copy.deepcopy(obj)
    if add_key is not None:
        target = obj
        for p in path:
            target = target[p]
        if not isinstance(target, dict):
            return raw.encode("utf-8", "surrogatepass")
        target[add_key] = _SPLICE
    elif not path:
        return raw.encode("utf-8", "surrogatepass")
    else:
        target = obj
        for p in path[:-1]:
            target = target[p]
        target[path[-1]] = _SPLICE
    text = json.dumps(obj, separators=(",", ":")).replace(json.dumps(_SPLICE), raw, 1)
    return text.encode("utf-8", "surrogatepass")


def splice_json(data, text, numbers_only=False):
    """Mutate one value (or add one key) of the JSON document ``text``; ``numbers_only``: put an
    edge number where a number is."""
    obj = json.loads(text)
    paths = list(_paths(obj))
    if numbers_only:
        numbers = [p for p in paths if type(_get(obj, p)) in (int, float)]
        path = data.draw(st.sampled_from(numbers or paths), label="number path")
        return _splice(obj, path, data.draw(number_edges, label="number"))
    path = data.draw(st.sampled_from(paths), label="path")
    add_key = data.draw(st.none() | st.text(max_size=8), label="add_key")
    return _splice(obj, path, data.draw(raw_json, label="raw"), add_key)


def bad_entry(data, st_json):
    """Rewrite one tensor's block entry: enormous or wrong shapes, overlapping or out-of-range offsets."""
    obj = json.loads(st_json)
    names = [k for k in obj if k != "__metadata__"]
    if not names:
        obj["__metadata__"] = {"pad": "x" * data.draw(st.integers(0, 4096))}
        return json.dumps(obj).encode()
    entry = obj[data.draw(st.sampled_from(names), label="tensor")]
    dims = st.one_of(st.integers(min_value=-2, max_value=2 ** 70), st.sampled_from(_HUGE + [0, 1]),
                     st.sampled_from(["x", 1.5, None, True, [4], {}]))
    which = data.draw(st.sampled_from(["shape", "offsets", "both", "dtype", "metadata"]), label="which")
    if which in ("shape", "both"):
        entry["shape"] = data.draw(st.lists(dims, max_size=6), label="shape")
    if which in ("offsets", "both"):
        ends = st.integers(min_value=-2 ** 64, max_value=2 ** 70) | st.sampled_from(_HUGE) \
            | st.integers(min_value=0, max_value=4096)
        entry["data_offsets"] = data.draw(st.lists(ends, min_size=0, max_size=3), label="offsets")
    if which == "both" and data.draw(st.booleans(), label="consistent"):
        # a size that matches the claimed shape, so only the block's coverage can reject it
        size = 1
        for d in entry["shape"]:
            size *= d if type(d) is int and d >= 0 else 1
        entry["data_offsets"] = [0, size * 4]
    if which == "dtype":
        entry["dtype"] = data.draw(st.sampled_from(["F64", "I8", "BF16", "f32", "", None, 4, ["F32"]]))
    if which == "metadata":
        obj["__metadata__"] = data.draw(json_values, label="metadata")
    return json.dumps(obj).encode()


def mutate_bytes(data, frame):
    """Byte-level damage: flips, truncation, insertion, deletion, rewritten length fields."""
    frame = bytearray(frame)
    ops = data.draw(st.lists(st.sampled_from(["flip", "truncate", "insert", "delete", "header_len",
                                              "st_len"]), min_size=1, max_size=4), label="ops")
    for op in ops:
        n = len(frame)
        if op == "flip" and n:
            i = data.draw(st.integers(0, n - 1))
            frame[i] ^= data.draw(st.integers(1, 255))
        elif op == "truncate":
            del frame[data.draw(st.integers(0, n)):]
        elif op == "insert":
            i = data.draw(st.integers(0, n))
            frame[i:i] = data.draw(st.binary(min_size=1, max_size=64))
        elif op == "delete" and n:
            i = data.draw(st.integers(0, n - 1))
            del frame[i:i + data.draw(st.integers(1, 64))]
        elif op == "header_len" and n >= 8:
            frame[4:8] = struct.pack(">I", data.draw(st.integers(0, 2 ** 32 - 1)))
        elif op == "st_len" and n >= 8:
            (header_len,) = struct.unpack_from(">I", frame, 4)
            if 8 + header_len + 8 <= n:
                frame[8 + header_len:16 + header_len] = struct.pack("<Q", data.draw(st.integers(0, 2 ** 64 - 1)))
    return bytes(frame)


def mutated_frame(data):
    frame = data.draw(st.sampled_from(FRAMES), label="frame")
    header, st_json, tensors = split(frame)
    how = data.draw(st.sampled_from(["bytes", "header", "number", "block", "entry", "data", "mixed"]),
                    label="how")
    if how in ("header", "mixed"):
        header = splice_json(data, header)
    if how == "number":
        header = splice_json(data, header, numbers_only=True)
    if how in ("block", "mixed"):
        st_json = splice_json(data, st_json)
    if how == "entry":
        st_json = bad_entry(data, st_json)
    if how == "data":
        cut = data.draw(st.integers(0, len(tensors)))
        tensors = tensors[:cut] + data.draw(st.binary(max_size=64))
    out = assemble(header, st_json, tensors)
    if how in ("bytes", "mixed"):
        out = mutate_bytes(data, out)
    return out


# ---- decoder ----------------------------------------------------------------------------------

def decoder(writable=False):
    dec = Decoder(SPECS, writable=writable, max_header_bytes=MAX_HEADER_BYTES)
    for frame in FRAMES:  # warm the plan cache and every lazily built module state
        dec.decode(frame)
    return dec


def check_decode(dec, frame):
    """decode raises only ProtocolError with a known reason, or gives a message that re-encodes;
    try_decode never raises and counts only known reasons."""
    try:
        msg = dec.decode(frame)
    except ProtocolError as exc:
        assert exc.reason in REASONS, exc
        assert dec.try_decode(frame) is None
    else:
        again = dec.decode(encode(msg))
        assert type(again) is type(msg)
        assert dec.try_decode(frame) is not None
    assert set(dec.rejected) <= set(REASONS)


def test_valid_frames_decode():
    dec = decoder()
    for frame in FRAMES:
        check_decode(dec, frame)
    assert dec.accepted == len(FRAMES) and not dec.rejected


@FUZZ
@given(st.binary(max_size=512) | st.binary(max_size=64).map(lambda b: b"SFL\x01" + b))
def test_arbitrary_bytes_raise_only_protocol_errors(frame):
    check_decode(decoder(), frame)


@FUZZ
@given(st.data(), st.booleans())
def test_mutated_frames_raise_only_protocol_errors(data, writable):
    check_decode(decoder(writable), mutated_frame(data))


# ---- allocation -------------------------------------------------------------------------------

def peak_bytes(dec, frame):
    """Peak bytes traced while decoding ``frame`` (numpy reports its buffers to tracemalloc)."""
    tracemalloc.start()
    try:
        dec.decode(frame)
    except ProtocolError:
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


@FUZZ
@given(st.data(), st.booleans())
def test_decoding_mutated_frames_allocates_at_most_the_frame(data, writable):
    dec = decoder(writable)
    frame = mutated_frame(data)
    assert peak_bytes(dec, frame) <= len(frame) + SLACK_BYTES


@FUZZ
@given(st.data(), st.sampled_from(TENSOR_FRAMES))
def test_claimed_shapes_allocate_nothing(data, frame):
    """A block header claiming enormous tensors, with offsets to match, costs nothing to reject."""
    header, st_json, tensors = split(frame)
    obj = json.loads(st_json)
    entry = obj[data.draw(st.sampled_from(sorted(obj)))]
    shape = data.draw(st.lists(st.sampled_from(_HUGE[:6]) | st.integers(1, 2 ** 40), min_size=1, max_size=4)
                      | st.sampled_from([["x", 2 ** 25], [[0], 2 ** 22], ["ab", 2 ** 24], [1.5, "x", 2 ** 24],
                                         [2 ** 62, 2 ** 62, 0]]))
    entry["shape"] = shape
    size = 1
    for d in shape:
        size *= d if type(d) is int else 1
    begin = data.draw(st.sampled_from([0, 4, len(tensors)]))
    entry["data_offsets"] = [begin, begin + size * 4]
    frame = assemble(header, json.dumps(obj).encode(), tensors)
    dec = decoder()
    assert peak_bytes(dec, frame) <= len(frame) + SLACK_BYTES
    with pytest.raises(ProtocolError):
        dec.decode(frame)


def test_large_valid_frames_allocate_at_most_the_frame():
    """float32 tensors are views of the frame (one copy when writable); float16 ones widen to
    float32, twice their bytes on the wire. Nothing else scales with the frame."""
    big = dataclasses.replace(SPEC, hidden=512)
    specs = {big.arch_id: tensor_spec(big)}
    gm = make_global_model(big, value=None, extras={"curvature": CurvatureTerms(
        lambda2=0.5, fisher_samples=20, U=make_tensors(big, seed=1, positive=True), V=make_tensors(big, seed=2))})
    for f16, writable, factor in ((False, False, 0), (False, True, 1), (True, False, 2)):
        frame = encode(gm, float16=f16)
        _, _, data = split(frame)
        dec = Decoder(specs, writable=writable, max_header_bytes=MAX_HEADER_BYTES)
        dec.decode(frame)
        assert len(data) > 4 * SLACK_BYTES // 8  # the tensors dominate the frame
        assert peak_bytes(dec, frame) <= factor * len(data) + SLACK_BYTES // 8


@pytest.mark.parametrize("text", ['{"a":' * 500 + "0" + "}" * 500,
                                  "[" + ",".join(["{}"] * 20000) + "]"])
def test_header_over_the_limit_is_refused_before_parsing(text):
    """Parsed JSON takes many times its text: a header past ``max_header_bytes`` is never parsed."""
    raw = text.encode()
    frame = assemble(raw, b"{}", b"")
    dec = Decoder(SPECS, max_header_bytes=len(raw) - 1)
    with pytest.raises(ProtocolError) as err:
        dec.decode(frame)
    assert err.value.reason == "oversize"
    assert peak_bytes(dec, frame) <= len(frame) + 16 * 1024
    header, st_json, data = split(FRAMES[0])
    with pytest.raises(ProtocolError) as err:
        Decoder(SPECS, max_header_bytes=len(st_json) - 1).decode(FRAMES[0])
    assert err.value.reason == "oversize"


def test_padded_block_headers_do_not_accumulate():
    """Frames that pad their block header (``__metadata__``) are decoded, but the decoder's plan
    cache keeps a bounded number of their bytes, not every one it saw."""
    header, st_json, data = split(FRAMES[0])
    obj = json.loads(st_json)
    dec = Decoder(SPECS)
    retained = []
    tracemalloc.start()
    try:
        for i in range(100):  # 20 MB in all; 64 cache entries of them would be 12.8 MB
            obj["__metadata__"] = {"pad": "%d" % i + "x" * 200000}
            assert dec.decode(assemble(header, json.dumps(obj).encode(), data)) is not None
            retained.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    assert max(retained) <= 8 * 2 ** 20


@pytest.mark.parametrize("depth, accepted", [(codec.DEFAULT_MAX_HEADER_DEPTH - 2, True),
                                             (codec.DEFAULT_MAX_HEADER_DEPTH - 1, False), (900, False)])
def test_deep_headers_are_refused_whatever_the_stack(depth, accepted):
    """Command params nested ``depth`` deep (the header and body add 2 levels): within
    the limit they decode, beyond it they are refused, never accepted or refused by stack depth."""
    header, st_json, data = split(encode(Command(kind="train")))
    obj = json.loads(header)
    frame = assemble(_splice(obj, ("body", "params"), '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)),
                     st_json, data)
    dec = decoder()
    if accepted:
        assert isinstance(dec.decode(frame), Command)
    else:
        with pytest.raises(ProtocolError) as err:
            dec.decode(frame)
        assert err.value.reason in ("schema", "malformed")


def test_unknown_extra_kinds_do_not_accumulate():
    """Each unknown extra kind is warned about once, but a sender choosing endless new kinds
    does not make the receiver remember them all."""
    frame = FRAMES[6]
    header, st_json, data = split(frame)
    obj = json.loads(header)
    dec = decoder()
    tracemalloc.start()
    try:
        for i in range(300):
            obj["body"]["extras"] = {"k%d-%s" % (i, "y" * 2000): {}}
            assert dec.decode(assemble(json.dumps(obj).encode(), st_json, data)) is not None
        retained = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert retained <= 64 * 1024


any_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.sampled_from(_HUGE + [-1, -2 ** 63]) | st.floats()
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=16)


# ---- typed extras ----------------------------------------------------------------------------

_EXTRAS = [m.extras[k] for m in _messages() if isinstance(m, (GlobalModel, Update)) for k in m.extras]


@st.composite
def extra_fields(draw):
    """A registered extra's fields with one or more values replaced (edge numbers, wrong types)."""
    extra = draw(st.sampled_from(_EXTRAS))
    fields = json.loads(json.dumps(extra.fields()))
    keys = sorted(fields) + ["unknown"]
    for key in draw(st.lists(st.sampled_from(keys), min_size=1, max_size=2, unique=True)):
        fields[key] = draw(st.sampled_from([10 ** 400, -(10 ** 400), -1, 0, 2 ** 64, True, None, "1"])
                           | any_json)
    return extra, fields


@FUZZ
@given(extra_fields())
def test_extras_parse_raises_only_protocol_errors(case):
    extra, fields = case
    try:
        parsed = type(extra).parse(fields, extra.groups())
    except ProtocolError as exc:
        assert exc.reason in REASONS, exc
    else:
        assert type(parsed) is type(extra)


# ---- header schema ----------------------------------------------------------------------------

_MESSAGE_CLASSES = list(MESSAGE_TYPES.values())


def _json_of(tp):
    """JSON values of annotation ``tp``, heavy on edges (huge ints where floats go, negatives)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        return st.none() | st.one_of([_json_of(a) for a in args if a is not type(None)])
    if tp is float:
        return st.sampled_from([10 ** 400, -(10 ** 400), 2 ** 1024]) | st.floats() | st.integers()
    if tp is int:
        return st.integers() | st.sampled_from(_HUGE + [-1, -2 ** 63]) | st.floats()
    if origin in (dict, typing.Dict):
        keys = st.integers(min_value=-10 ** 20, max_value=10 ** 20).map(str) if args[0] is int \
            else st.text(max_size=6)
        return st.dictionaries(keys | st.text(max_size=3), _json_of(args[1]), max_size=3)
    if origin in (list, typing.List):
        return st.lists(_json_of(args[0]), max_size=3)
    return any_json


@st.composite
def bodies(draw):
    """A body for a message class: mostly its own field names (so checks go deep), any values."""
    cls = draw(st.sampled_from(_MESSAGE_CLASSES))
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.name != "tensors"]
    body = json.loads(split(encode(_valid_of(cls)))[0])["body"]
    how = draw(st.sampled_from(["one", "one", "one", "some", "random", "any"]))
    if how == "one":  # the rest stays valid, so the check reaches this field
        name = draw(st.sampled_from(names))
        body[name] = draw(_json_of(hints[name]))
    elif how == "some":
        for name in draw(st.lists(st.sampled_from(names), max_size=4, unique=True)):
            body[name] = draw(_json_of(hints[name]) | any_json)
    elif how == "random":
        body = draw(st.dictionaries(st.sampled_from(names) | st.text(max_size=6), any_json, max_size=6))
    else:
        body = draw(any_json)
    return cls, body


def _valid_of(cls):
    return next(m for m in _messages() if type(m) is cls)


@FUZZ
@given(bodies())
def test_schema_raises_only_protocol_errors(case):
    cls, body = case
    try:
        out = check_body(cls, body)
    except ProtocolError as exc:
        assert exc.reason in REASONS, exc
        return
    kwargs = dict(out, tensors={}) if cls in (GlobalModel, Update) else out
    cls(**kwargs)  # the normalized body builds its message


# ---- config loaders ---------------------------------------------------------------------------

_NAMES = ["fedasync", "fedavg", "polynomial", "hinge", "constant", "lstm", "mlp", "cnn", "synthetic",
          "replay", "iio", "mqtt", "sysfs", "simulated", "none", "cap", "pin", "fixed", "clp-aware",
          "fifo", "reservoir", "rotating", "all", "absolute", "clp", "fedcurv", "sampling", "lab", ""]
hostile = st.one_of(
    st.none(), st.booleans(), st.integers(), st.sampled_from(_HUGE + [-1, -2 ** 63, 10 ** 4000]),
    st.floats(), st.text(max_size=10), st.sampled_from(_NAMES),
    st.lists(st.integers() | st.text(max_size=4), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers() | st.none(), max_size=3))


def _typed(tp, depth):
    """Values of annotation ``tp``, heavy on edges (NaN, inf, huge ints, empty strings)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        inner = [a for a in args if a is not type(None)]
        return st.none() | st.one_of([_typed(a, depth) for a in inner])
    if dataclasses.is_dataclass(tp):
        return config_dicts(tp, depth - 1) if depth > 0 else st.just({})
    if tp is float:
        return st.sampled_from([math.nan, math.inf, -math.inf, 10 ** 400, -1, 0]) | st.floats() \
            | st.integers(min_value=-10, max_value=10 ** 6)
    if tp is int:
        return st.integers(min_value=-2, max_value=2 ** 12) | st.sampled_from(_HUGE + [-2 ** 63])
    if tp is bool:
        return st.booleans()
    if tp in (str, Path):
        return st.sampled_from(_NAMES) | st.text(max_size=8)
    if origin in (dict, typing.Dict) or tp is dict:
        return st.dictionaries(st.sampled_from(_NAMES) | st.text(max_size=4), hostile, max_size=3)
    return hostile


def config_dicts(cls, depth=2):
    """A mapping for dataclass ``cls``: some of its keys (typed or hostile values), maybe a stranger."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    items = {name: st.one_of(_typed(hints[name], depth), hostile) for name in names}
    if "plugins" in names:
        registry = _registry(cls)
        items["plugins"] = st.dictionaries(
            st.sampled_from(sorted(registry)) | st.text(max_size=4),
            st.one_of([config_dicts(p.Config, 0) for p in registry.values()] + [hostile]), max_size=3)
    known = st.fixed_dictionaries({}, optional=items)
    strangers = st.dictionaries(st.text(max_size=6) | st.integers() | st.booleans(), hostile, max_size=3)
    return st.tuples(known, strangers, st.integers(0, 4)).map(
        lambda t: dict(t[0], **{k: v for k, v in t[1].items() if isinstance(k, str)}) if t[2] else
        {**t[0], **t[1]})


def _nan_keys(obj, prefix=""):
    """Dotted names of the NaN float fields of a config (its dataclasses and plug-in settings)."""
    out = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            out += _nan_keys(value, "%s%s." % (prefix, key))
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if isinstance(value, float) and math.isnan(value):
                out.append(prefix + f.name)
            elif dataclasses.is_dataclass(value) or (f.name == "plugins" and isinstance(value, dict)):
                out += _nan_keys(value, "%s%s." % (prefix, f.name))
    return out


def _registry(cls):
    return agent_plugins.registered() if cls is AgentConfig else coordinator_plugins.registered()


def _leaves(cls, prefix=()):
    """(dotted path, annotation) of every scalar key of config ``cls``, plug-in settings included."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        base = inner[0] if typing.get_origin(tp) is typing.Union and len(inner) == 1 else tp
        if not f.init:
            continue
        if dataclasses.is_dataclass(base):
            yield from _leaves(base, prefix + (f.name,))
        elif f.name == "plugins" and cls in (AgentConfig, CoordinatorConfig):
            for name, plugin in sorted(_registry(cls).items()):
                yield from _leaves(plugin.Config, prefix + ("plugins", name))
        else:
            yield prefix + (f.name,), tp


def _nest(path, value):
    for key in reversed(path):
        value = {key: value}
    return value


def config_cases(cls):
    """Mappings for ``cls``: the defaults with one key at an edge value, or many keys at once."""
    one_key = st.sampled_from(list(_leaves(cls))).flatmap(
        lambda leaf: st.one_of(_typed(leaf[1], 0), hostile).map(lambda v: _nest(leaf[0], v)))
    return st.one_of(one_key, config_dicts(cls))


def check_config(load):
    """Only ConfigError, and a config that loads holds no NaN (every range check is false on NaN)."""
    try:
        loaded = load()
    except ConfigError:
        return
    if dataclasses.is_dataclass(loaded):
        assert not _nan_keys(loaded)


@FUZZ
@given(st.sampled_from([AgentConfig, CoordinatorConfig]).flatmap(
    lambda cls: st.tuples(st.just(cls), config_cases(cls))))
def test_build_raises_only_config_errors(case):
    cls, values = case
    check_config(lambda: config_loader.build(cls, values))


@pytest.fixture(scope="module")
def yaml_path(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz") / "config.yaml"


_YAML_SNIPPETS = [
    ".nan", ".inf", "-.inf", "1e999", "0x7fffffffffffffffff", "0o777", "2001-02-30", "2001-13-01 25:61:61",
    "!!binary not-base64!", "!!int abc", "!!float x", "!!timestamp 2020-99-99", "!!set {a, b}",
    "!!python/object:os.system x", "&a [*a]", "*undefined", "{<<: 1}", "{<<: [1, 2]}", "? [1]\n: 2",
    "? {a: 1}\n: 2", "[" * 600, "{a: " * 200 + "1" + "}" * 200, "1" * 5000, "'unterminated", "\t",
    "%YAML 9.9\n---\na: 1", "--- 1\n--- 2", "\ufeffa: 1", "a: \x00", "!!str", "~", "[]", "{}", "yes",
]


@st.composite
def yaml_documents(draw):
    cls = draw(st.sampled_from([AgentConfig, CoordinatorConfig]))
    how = draw(st.sampled_from(["dump", "snippet", "text"]))
    if how == "dump":
        text = yaml.safe_dump(draw(config_cases(cls)), allow_unicode=True)
    elif how == "snippet":
        keys = [f.name for f in dataclasses.fields(cls)] + ["mqtt", "model"]
        text = "\n".join("%s: %s" % (draw(st.sampled_from(keys)), draw(st.sampled_from(_YAML_SNIPPETS)))
                         for _ in range(draw(st.integers(1, 3))))
        if draw(st.booleans()):
            text = draw(st.sampled_from(_YAML_SNIPPETS))
    else:
        text = draw(st.text(max_size=200))
    return cls, text


@FUZZ
@given(yaml_documents(), st.sampled_from([None, "coordinator", "fleet"]))
def test_config_files_raise_only_config_errors(yaml_path, case, section):
    cls, text = case
    check_config(lambda: config_loader.parse_yaml(text, "fuzz"))
    try:
        yaml_path.write_text(text, encoding="utf-8", errors="surrogatepass")
    except UnicodeError:
        assume(False)
    if cls is AgentConfig:
        check_config(lambda: load_agent_config(yaml_path))
    else:
        check_config(lambda: load_config(yaml_path, section=section))
    check_config(lambda: config_loader.load(cls, yaml_path, section=section))


@FUZZ
@given(st.sampled_from([AgentConfig, CoordinatorConfig]).flatmap(
    lambda cls: st.tuples(st.just(cls), config_dicts(cls, depth=1))))
def test_config_overrides_raise_only_config_errors(case):
    cls, overrides = case
    if cls is AgentConfig:
        check_config(lambda: load_agent_config(None, overrides))
    else:
        check_config(lambda: load_config(None, overrides))
        check_config(lambda: config_loader.load(cls, None, overrides))


def _in_effect(cls, path):
    """Settings under which the key at ``path`` is in use: a coordinator plug-in's key needs the
    plug-in listed, with those it requires, under a strategy it accepts."""
    if path[0] != "plugins" or cls is AgentConfig:
        return {}
    plugin = coordinator_plugins.registered()[path[1]]
    for strategy in ("fedasync", "fedavg"):
        base = {"strategy": strategy, "plugins": {name: {} for name in tuple(plugin.requires) + (path[1],)}}
        try:
            config_loader.build(cls, base)
        except ConfigError:
            continue
        return base
    raise AssertionError("plug-in %s loads under no strategy" % path[1])


def test_every_float_key_refuses_nan():
    """NaN passes any range check written ``value < 0``: each float key, alone, must refuse it."""
    accepted = []
    for cls in (AgentConfig, CoordinatorConfig):
        for path, tp in _leaves(cls):
            if float not in (tp,) + typing.get_args(tp):
                continue
            values = config_loader.merge(_in_effect(cls, path), _nest(path, math.nan))
            try:
                config_loader.build(cls, values)
            except ConfigError:
                continue
            accepted.append("%s: %s" % (cls.__name__, ".".join(path)))
    assert not accepted


def test_config_fuzz_can_fail():
    """The config properties above are not vacuous: a known-bad value is a ConfigError, and a
    good default loads."""
    with pytest.raises(ConfigError):
        config_loader.build(CoordinatorConfig, {"alpha": math.nan})
    assert config_loader.build(CoordinatorConfig, {}).alpha == CoordinatorConfig().alpha
    assert config_loader.build(AgentConfig, {"lr": 0.5}).lr == 0.5
