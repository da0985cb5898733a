"""The wire codec: every message round-trips, and every way a frame can be bad is rejected by reason."""
import json
import logging
import struct

import numpy as np
import pytest
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from streamfl.errors import ProtocolError
from streamfl.models import ModelSpec, tensor_spec
from streamfl.protocol.codec import FORMAT_VERSION, MAGIC, Decoder, encode
from streamfl.methods.clp.payloads import ClpState, FisherTrace
from streamfl.methods.fedcurv.payloads import CurvatureDiagonal, CurvatureTerms
from streamfl.protocol.messages import (
    MESSAGE_TYPES, PROTOCOL_VERSION, Command, CommandReply, CoordinatorStatus, DeviceReply, GlobalModel, Hello,
    Offline, Telemetry, Update,
)

SPEC = ModelSpec()
ARCH = SPEC.arch_id
TSPEC = tensor_spec(SPEC)


def tensors(seed=0, spec=TSPEC):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(shape).astype(np.float32) for k, (shape, _) in spec.items()}


def decoder(**kw):
    return Decoder({ARCH: TSPEC}, **kw)


def samples():
    t = tensors()
    return [
        Hello(device_id="jetson-01", board="orin-nano", software_version="0.1.0", arch_id=ARCH,
              buffer_capacity=512, dvfs_levels={"cpu": [0, 1, 2], "gpu": [3]}),
        Offline(device_id="jetson-01", reason="lost"),
        CoordinatorStatus(online=True, version=7),
        GlobalModel(version=7, arch_id=ARCH, tensors=t, hparams={"lr": 0.01, "batch_size": 32},
                    extras={"clp": ClpState(version=7, fisher_global=2.5, fisher_global_prev=1.0,
                                            in_clp=True, segment=1, segment_start_version=3,
                                            regulating=True),
                            "curvature": CurvatureTerms(lambda2=0.5, fisher_samples=20,
                                                        U={k: np.abs(v) for k, v in tensors(1).items()},
                                                        V=tensors(2))}),
        Update(device_id="pi-7", update_id="pi-7-0003", base_version=6, arch_id=ARCH, tensors=t,
               num_samples=640, class_counts={0: 10, 3: 630}, loss=0.25, seconds_per_sample=0.002,
               round_index=3, created_s=1700000000.5, energy_j=3.0, clock_levels={"cpu": 2},
               extras={"fisher_trace": FisherTrace(12.5), "curvature_diagonal": CurvatureDiagonal({k: np.abs(v) for k, v in tensors(3).items()})}),
        Command(kind="override", params={"lr": 0.001, "dvfs": {"cpu": 1}}),
        CommandReply(kind="status", seq=17, ok=True, handled_by=["coordinator"],
                     result={"version": 3, "devices": [{"device": "pi-7", "online": True}]}, run_id="r1"),
        DeviceReply(device_id="pi-7", kind="logs", seq=18, ok=True, result={"lines": ["a", "b"]},
                    run_id="r1"),
        Telemetry(device_id="pi-7", time_s=12.5, buffer_fill=100, buffer_capacity=512, rounds=4,
                  power_w=5.5, clocks_khz={"cpu": 1500000}, temperatures_c={"soc": 51.0},
                  predictions_per_s=4.75, prediction_confidence=0.875, predictions_dropped=3),
    ]


def assert_same(a, b, atol=0.0):
    assert type(a) is type(b)
    for name, va in vars(a).items():
        vb = getattr(b, name)
        if name == "tensors":
            assert sorted(va) == sorted(vb)
            for k in va:
                assert vb[k].dtype == np.float32 and vb[k].shape == va[k].shape
                np.testing.assert_allclose(vb[k], va[k], atol=atol, rtol=1e-3 if atol else 0)
        elif name == "extras":
            assert sorted(va) == sorted(vb)
            for k, v in va.items():
                assert type(vb[k]) is type(v) and vb[k].fields() == v.fields()
                for group, arrays in v.groups().items():
                    for n in arrays:
                        np.testing.assert_array_equal(vb[k].groups()[group][n], arrays[n])  # always float32
        else:
            assert vb == va, name


def frame(header, block=None, fmt=FORMAT_VERSION, magic=MAGIC):
    """Hand-made frame, to express what ``encode`` refuses to produce."""
    raw = json.dumps(header).encode()
    return struct.pack(">3sBI", magic, fmt, len(raw)) + raw + (st_save({}) if block is None else block)


def header_of(msg):
    """The JSON header ``encode`` writes for ``msg``, and the frame's tensor block."""
    data = encode(msg)
    (n,) = struct.unpack(">I", data[4:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def reason_of(data, dec=None):
    with pytest.raises(ProtocolError) as info:
        (dec or decoder()).decode(data)
    return info.value.reason


# -- round trips -----------------------------------------------------------------------------------

@pytest.mark.parametrize("float16", [False, True])
def test_every_message_type_round_trips(float16):
    msgs = samples()
    assert {type(m) for m in msgs} == set(MESSAGE_TYPES.values())
    dec = decoder()
    for msg in msgs:
        data = encode(msg, float16=float16)
        assert data[:3] == MAGIC and data[3] == FORMAT_VERSION
        assert_same(msg, dec.decode(data), atol=2e-3 if float16 else 0.0)
    assert dec.rejected == {}


def test_float16_halves_the_tensor_bytes():
    msg = samples()[4]
    full, half = encode(msg), encode(msg, float16=True)
    nbytes = sum(a.nbytes for a in msg.tensors.values())
    assert len(full) - len(half) == pytest.approx(nbytes / 2, abs=64)


def test_update_class_counts_keys_come_back_as_ints():
    out = decoder().decode(encode(samples()[4]))
    assert out.class_counts == {0: 10, 3: 630}
    assert all(type(k) is int for k in out.class_counts)


def test_decoded_tensors_are_views_or_writable_copies():
    data = encode(samples()[4])
    assert not decoder().decode(data).tensors["head.bias"].flags.writeable
    arr = decoder(writable=True).decode(data).tensors["head.bias"]
    arr += 1.0  # must not raise
    assert decoder().decode(data).tensors["head.bias"][0] == pytest.approx(arr[0] - 1.0)


def test_tensor_block_is_real_safetensors_both_ways():
    header, block = header_of(samples()[4])
    loaded = st_load(block)
    for k, a in samples()[4].tensors.items():
        np.testing.assert_array_equal(loaded[k], a)
    # and a block written by the safetensors library (its own order, with metadata) decodes
    t = tensors(5)
    lib_block = st_save(dict(reversed(list(t.items()))), metadata={"who": "library"})
    header["body"]["extras"] = {"fisher_trace": header["body"]["extras"]["fisher_trace"]}  # no tensors
    out = decoder().decode(frame(header, lib_block))
    for k in t:
        np.testing.assert_array_equal(out.tensors[k], t[k])


def test_numpy_scalars_in_header_fields_are_encoded_as_json_numbers():
    msg = Update(device_id="d", update_id="u", base_version=np.int64(1), arch_id=ARCH, tensors=tensors(),
                 num_samples=np.int32(3), class_counts={np.int64(2): 3}, loss=np.float32(0.5),
                 seconds_per_sample=np.float64(0.1))
    out = decoder().decode(encode(msg))
    assert (out.base_version, out.num_samples, out.loss, out.class_counts) == (1, 3, 0.5, {2: 3})


def test_encode_refuses_what_the_decoder_would_reject():
    with pytest.raises(ProtocolError) as info:
        encode(Telemetry(device_id="d", time_s=float("nan"), buffer_fill=0, buffer_capacity=1))
    assert info.value.reason == "non_finite"
    big = dict(tensors(), **{"head.bias": np.full(6, 1e6, np.float32)})
    with pytest.raises(ProtocolError) as info:
        encode(GlobalModel(version=1, arch_id=ARCH, tensors=big), float16=True)
    assert info.value.reason == "non_finite"
    with pytest.raises(ProtocolError) as info:
        encode(Command(kind="train", params={"x": object()}))
    assert info.value.reason == "schema"
    with pytest.raises(ProtocolError) as info:
        encode("not a message")
    assert info.value.reason == "unknown_type"


# -- rejections ------------------------------------------------------------------------------------

def test_truncated_frames_are_malformed():
    data = encode(samples()[4])
    for cut in (0, 2, 7, 12, 300, len(data) - 1):
        assert reason_of(data[:cut]) == "malformed", cut


def test_bad_magic_is_malformed():
    data = encode(samples()[0])
    assert reason_of(b"XFL" + data[3:]) == "malformed"


def test_oversize_is_checked_before_parsing():
    data = encode(samples()[4])
    assert reason_of(data, decoder(max_frame_bytes=len(data) - 1)) == "oversize"
    assert reason_of(b"\0" * 101, decoder(max_frame_bytes=100)) == "oversize"  # not even a frame
    decoder(max_frame_bytes=len(data)).decode(data)


def test_bad_json_and_bad_block_are_malformed():
    header, block = header_of(samples()[4])
    raw = b'{"type": "hello", '
    assert reason_of(struct.pack(">3sBI", MAGIC, FORMAT_VERSION, len(raw)) + raw + block) == "malformed"
    assert reason_of(frame([1, 2])) == "malformed"
    bad_st = struct.pack("<Q", 5) + b"{oops"
    assert reason_of(frame(header, bad_st)) == "malformed"
    assert reason_of(frame(header, block[:-4])) == "malformed"          # data shorter than header says
    assert reason_of(frame(header, block + b"\0" * 4)) == "malformed"   # trailing bytes
    (n,) = struct.unpack("<Q", block[:8])
    st = json.loads(block[8:8 + n])
    first = next(iter(st))
    st[first]["data_offsets"][0] += 4  # a gap
    raw_st = json.dumps(st).encode()
    assert reason_of(frame(header, struct.pack("<Q", len(raw_st)) + raw_st + block[8 + n:])) == "malformed"


def test_unknown_format_byte_and_protocol_version_are_bad_version():
    data = encode(samples()[0])
    assert reason_of(data[:3] + bytes([FORMAT_VERSION + 1]) + data[4:]) == "bad_version"
    header, _ = header_of(samples()[0])
    assert reason_of(frame(dict(header, v=PROTOCOL_VERSION + 1))) == "bad_version"
    assert reason_of(frame(dict(header, v=True))) == "bad_version"


def test_unknown_type():
    header, _ = header_of(samples()[0])
    assert reason_of(frame(dict(header, type="reboot"))) == "unknown_type"
    assert reason_of(frame(dict(header, type=3))) == "unknown_type"


@pytest.mark.parametrize("mutate", [
    pytest.param(lambda b: b.pop("board"), id="missing-field"),
    pytest.param(lambda b: b.update(extra=1), id="extra-field"),
    pytest.param(lambda b: b.update(buffer_capacity="512"), id="str-for-int"),
    pytest.param(lambda b: b.update(buffer_capacity=True), id="bool-for-int"),
    pytest.param(lambda b: b.update(buffer_capacity=1.5), id="float-for-int"),
    pytest.param(lambda b: b.update(buffer_capacity=-1), id="negative-count"),
    pytest.param(lambda b: b.update(online=1), id="int-for-bool"),
    pytest.param(lambda b: b.update(dvfs_levels={"cpu": ["1"]}), id="list-item-type"),
    pytest.param(lambda b: b.update(dvfs_levels=[1]), id="list-for-dict"),
    pytest.param(lambda b: b.update(device_id="a/b"), id="device-id-with-slash"),
    pytest.param(lambda b: b.update(device_id="+"), id="device-id-wildcard"),
])
def test_hello_schema_violations(mutate):
    header, _ = header_of(samples()[0])
    mutate(header["body"])
    assert reason_of(frame(header)) == "schema"


@pytest.mark.parametrize("mutate", [
    pytest.param(lambda b: b.update(class_counts={"x": 1}), id="non-int-key"),
    pytest.param(lambda b: b.update(class_counts={"1": -1}), id="negative-count"),
    pytest.param(lambda b: b.update(class_counts={"1": True}), id="bool-count"),
    pytest.param(lambda b: b.update(energy_j="1"), id="str-for-optional-float"),
    pytest.param(lambda b: b["extras"]["fisher_trace"].update(value="1"), id="str-in-an-extra"),
    pytest.param(lambda b: b["extras"]["fisher_trace"].update(extra=1), id="unknown-extra-field"),
    pytest.param(lambda b: b["extras"].update(fisher_trace=[1.0]), id="extra-not-an-object"),
    pytest.param(lambda b: b.update(clock_levels={"cpu": 1.0}), id="float-for-int-value"),
    pytest.param(lambda b: b.pop("update_id"), id="missing-update-id"),
])
def test_update_schema_violations(mutate):
    header, block = header_of(samples()[4])
    mutate(header["body"])
    assert reason_of(frame(header, block)) == "schema"


def test_floats_accept_ints_and_optionals_accept_null():
    header, block = header_of(samples()[4])
    header["body"].update(loss=1, energy_j=None)
    out = decoder().decode(frame(header, block))
    assert out.loss == 1.0 and type(out.loss) is float and out.energy_j is None


def test_other_schema_violations():
    header, block = header_of(samples()[5])
    assert reason_of(frame(dict(header, body=dict(header["body"], kind="Reboot now!")))) == "schema"
    assert reason_of(frame(dict(header, dtype="float64"))) == "schema"
    assert reason_of(frame(dict(header, body=[]))) == "schema"
    assert reason_of(frame({k: v for k, v in header.items() if k != "dtype"})) == "schema"
    # tensors on a message type that takes none
    assert reason_of(frame(header, st_save({"x": np.zeros(2, np.float32)}))) == "schema"
    # a tensor whose dtype is not the header's
    gm_header, _ = header_of(samples()[3])
    t16 = {k: v.astype(np.float16) for k, v in tensors().items()}
    assert reason_of(frame(gm_header, st_save(t16))) == "schema"
    assert reason_of(frame(gm_header, st_save({k: v.astype(np.float64) for k, v in tensors().items()}))) \
        == "schema"


def test_nan_and_inf_in_tensors_are_non_finite():
    for bad in (np.nan, np.inf, -np.inf):
        t = tensors()
        t["lstm.weight_hh_l0"][3, 4] = bad
        msg = Update(device_id="d", update_id="u", base_version=0, arch_id=ARCH, tensors=t, num_samples=1,
                     class_counts={}, loss=0.0, seconds_per_sample=0.0)
        assert reason_of(encode(msg)) == "non_finite"
        header, _ = header_of(msg)
        t16 = {k: v.astype(np.float16) for k, v in t.items()}
        assert reason_of(frame(dict(header, dtype="float16"), st_save(t16))) == "non_finite"


def test_huge_finite_tensors_are_accepted():
    t = tensors()
    t["head.weight"][:] = 3e38  # a.a overflows; the exact check must still accept it
    out = decoder().decode(encode(GlobalModel(version=0, arch_id=ARCH, tensors=t)))
    assert out.tensors["head.weight"][0, 0] == np.float32(3e38)


def test_inf_and_nan_in_header_are_non_finite():
    header, block = header_of(samples()[4])
    for spelled in (b"Infinity", b"-Infinity", b"NaN", b"1e999"):
        raw = json.dumps(header).encode().replace(b'"loss": 0.25', b'"loss": ' + spelled)
        assert spelled in raw
        data = struct.pack(">3sBI", MAGIC, FORMAT_VERSION, len(raw)) + raw + block
        assert reason_of(data) == "non_finite", spelled


def test_wrong_arch_id_is_arch_mismatch():
    header, block = header_of(samples()[4])
    header["body"]["arch_id"] = "lstm-c9-w50-k6-h128"
    assert reason_of(frame(header, block)) == "arch_mismatch"
    other = ModelSpec(name="mlp")
    msg = GlobalModel(version=1, arch_id=other.arch_id, tensors=tensors(spec=tensor_spec(other)))
    assert reason_of(encode(msg)) == "arch_mismatch"
    Decoder({other.arch_id: tensor_spec(other)}).decode(encode(msg))


def test_wrong_shape_missing_and_extra_tensors_are_arch_mismatch():
    base = samples()[4]
    t = tensors()
    t["head.weight"] = np.zeros((7, 128), np.float32)
    cases = [t, {k: v for k, v in tensors().items() if k != "head.bias"},
             dict(tensors(), extra=np.zeros(1, np.float32))]
    for bad in cases:
        base.tensors = bad
        assert reason_of(encode(base)) == "arch_mismatch"
    gm = samples()[3]
    terms = gm.extras["curvature"]
    gm.extras["curvature"] = CurvatureTerms(terms.lambda2, terms.fisher_samples,
                                            {k: v for k, v in terms.U.items() if k != "head.bias"}, terms.V)
    assert reason_of(encode(gm)) == "arch_mismatch"


def test_try_decode_logs_counts_and_never_raises(caplog):
    dec = decoder(max_frame_bytes=10 ** 6)
    caplog.set_level(logging.WARNING, logger="streamfl.protocol.codec")
    good = encode(samples()[1])
    assert dec.try_decode(good, source="t/ok") == samples()[1]
    assert dec.try_decode(b"garbage!!", source="t/bad") is None
    assert dec.try_decode(b"\0" * (10 ** 6 + 1), source="t/big") is None
    assert dec.try_decode(b"XFL", source="t/short") is None
    assert dec.try_decode(None, source="t/none") is None  # not even bytes: still no exception
    assert dec.accepted == 1
    assert dec.rejected == {"malformed": 3, "oversize": 1}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # the first per reason; the other malformed ones are rate-limited
    assert "t/bad" in warnings[0].getMessage() and "malformed" in warnings[0].getMessage()
    assert "oversize" in warnings[1].getMessage()


class FakeClock:
    """A settable monotonic clock, so rate-limit tests need no sleep."""

    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


def rejections(caplog, level):
    return [r.getMessage() for r in caplog.records
            if r.name == "streamfl.protocol.codec" and r.levelno == level and "rejected frame" in r.getMessage()]


def test_rejection_warnings_are_rate_limited_per_reason(caplog):
    clock = FakeClock()
    dec = decoder(max_frame_bytes=100, warn_interval_s=10.0, clock=clock)
    caplog.set_level(logging.DEBUG, logger="streamfl.protocol.codec")
    for i in range(50):  # a flood of one kind of bad frame
        assert dec.try_decode(b"garbage %d" % i, source="t/flood") is None
    assert dec.try_decode(b"\0" * 101, source="t/big") is None  # another reason warns at once
    warnings = rejections(caplog, logging.WARNING)
    assert len(warnings) == 2
    assert "t/flood" in warnings[0] and "malformed" in warnings[0] and "suppressed" not in warnings[0]
    assert "oversize" in warnings[1] and "suppressed" not in warnings[1]
    assert len(rejections(caplog, logging.DEBUG)) == 49  # nothing lost, only demoted
    assert dec.rejected == {"malformed": 50, "oversize": 1}

    caplog.clear()
    clock.now += 9.9  # still inside the interval
    dec.try_decode(b"garbage again", source="t/flood")
    assert rejections(caplog, logging.WARNING) == []
    clock.now += 0.1  # the interval has passed: one warning that says how many were held back
    dec.try_decode(b"garbage late", source="t/late")
    warnings = rejections(caplog, logging.WARNING)
    assert len(warnings) == 1
    assert "t/late" in warnings[0] and "50 more malformed rejections suppressed" in warnings[0]
    dec.try_decode(b"garbage next", source="t/late")
    assert len(rejections(caplog, logging.WARNING)) == 1
    clock.now += 10.0
    dec.try_decode(b"garbage later", source="t/late")
    warnings = rejections(caplog, logging.WARNING)
    assert len(warnings) == 2 and "1 more malformed" in warnings[1]
    assert dec.rejected == {"malformed": 54, "oversize": 1} and dec.accepted == 0


def test_zero_interval_warns_every_rejection_and_results_are_unchanged(caplog):
    clock = FakeClock()
    limited, every = decoder(clock=clock), decoder(warn_interval_s=0, clock=clock)
    caplog.set_level(logging.WARNING, logger="streamfl.protocol.codec")
    good = encode(samples()[1])
    frames = [b"garbage", good, b"XFL", None, good, b"bad again"]
    for data in frames:
        assert limited.try_decode(data) == every.try_decode(data)
    assert limited.rejected == every.rejected == {"malformed": 4}
    assert limited.accepted == every.accepted == 2
    messages = rejections(caplog, logging.WARNING)
    assert len(messages) == 1 + 4  # limited: the first; every: all four, none says "suppressed"
    assert not any("suppressed" in m for m in messages)


def test_default_warn_interval_and_bad_interval():
    from streamfl.protocol.codec import DEFAULT_WARN_INTERVAL_S
    assert DEFAULT_WARN_INTERVAL_S == 10.0 and decoder().warn_interval_s == 10.0
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError):
            decoder(warn_interval_s=bad)


def test_layout_cache_does_not_hide_a_changed_frame():
    dec = decoder()
    good = encode(samples()[4])
    dec.decode(good)
    dec.decode(good)  # cached layout
    t = tensors()
    t["head.bias"][0] = np.nan
    bad = samples()[4]
    bad.tensors = t
    assert reason_of(encode(bad), dec) == "non_finite"
    header, block = header_of(samples()[4])
    header["body"]["arch_id"] = "other"
    assert reason_of(frame(header, block), dec) == "arch_mismatch"


def test_update_carries_a_fisher_diagonal_checked_against_the_architecture():
    dec = decoder()
    upd = samples()[4]
    back = dec.decode(encode(upd, float16=True))
    assert sorted(back.extras) == ["curvature_diagonal", "fisher_trace"]
    diag = back.extras["curvature_diagonal"].F
    assert all(a.dtype == np.float32 for a in diag.values())  # float32 even in a float16 frame
    full = samples()[4].extras["curvature_diagonal"].F
    upd.extras = {"curvature_diagonal": CurvatureDiagonal({k: v for k, v in full.items() if k != "head.bias"})}
    assert reason_of(encode(upd), dec) == "arch_mismatch"
    upd.extras = {"curvature_diagonal": CurvatureDiagonal({k: v[..., :1] for k, v in full.items()})}
    assert reason_of(encode(upd), dec) == "arch_mismatch"


def test_an_unknown_extra_kind_is_dropped_and_the_model_kept(caplog):
    header, block = header_of(samples()[3])
    header["body"]["extras"]["from-a-newer-coordinator"] = {"x": 1}
    back = decoder().decode(frame(header, block))
    assert sorted(back.extras) == ["clp", "curvature"] and back.version == 7


def test_an_extra_that_is_not_registered_cannot_be_encoded():
    upd = samples()[4]
    upd.extras = {"fisher_trace": 1.5}
    with pytest.raises(ProtocolError):
        encode(upd)


def test_extra_tensor_names_are_checked():
    header, block = header_of(samples()[4])
    renamed = dict(st_load(block))
    renamed["extra/onlykind"] = renamed.pop(next(k for k in renamed if k.startswith("extra/")))
    assert reason_of(frame(header, st_save(renamed))) == "schema"
