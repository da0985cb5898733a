"""Every number a typed payload carries has a declared range, and the codec refuses a value outside it.

Walks ``EXTRA_TYPES``: a registered payload whose numeric field or tensor group has no ``BOUNDS``
entry fails here, so a new payload cannot skip it. Then, for every declared bound, a frame carrying
a value just outside it is refused by the full codec (reason ``bounds``), and one at the bound
decodes to the same value.
"""
import dataclasses
import logging
import math
import typing
from dataclasses import dataclass

import numpy as np
import pytest

from factories import SPEC, make_global_model, make_tensors, make_update
from streamfl.errors import ProtocolError
from streamfl.models import tensor_spec
from streamfl.methods.adaptive_lr.payloads import AdaptiveLr
from streamfl.protocol.codec import REASONS, Decoder, encode
from streamfl.protocol.extras import EXTRA_TYPES, MAX_EXACT_INT, Bound, Extra, Tensors, check_bounds, register_extra
from streamfl.protocol.messages import Telemetry
from streamfl.methods.clp.payloads import ClpState, FisherTrace
from streamfl.methods.fedcurv.payloads import CurvatureDiagonal, CurvatureTerms
from streamfl.methods.schedule.payloads import ScheduleRequest, ScheduleStats
from streamfl.methods.stewc.payloads import DriftSignal, PeriodFisher, PeriodTerms
from streamfl.methods.importance.payloads import ImportanceTerms
from streamfl.methods.sfedpo.payloads import SfedpoReport, SfedpoTerms
from streamfl.methods.sessions.payloads import SessionAux, SessionTerms
from streamfl.methods.agent_side import MethodSettings


def _positive(seed):
    return make_tensors(SPEC, seed=seed, positive=True)


#: One well-formed payload of every registered kind, every optional field and group set, and
#: whether the coordinator sends it in a global model ("model") or a device in an update.
SAMPLES = {
    "clp": (ClpState(version=7, fisher_global=2.5, fisher_global_prev=1.0, in_clp=True, segment=1,
                     segment_start_version=3, regulating=True, fisher_segment_start=2.0,
                     fisher_reference=2.2), "model"),
    "fisher_trace": (FisherTrace(12.5), "update"),
    "curvature": (CurvatureTerms(lambda2=0.5, fisher_samples=20, U=_positive(1), V=_positive(2),
                                 fisher_every=2), "model"),
    "curvature_diagonal": (CurvatureDiagonal(_positive(3)), "update"),
    "schedule": (ScheduleRequest(True), "model"),
    "schedule_stats": (ScheduleStats(counts=(4, 6), prev_counts=(5, 5), frame=2, class_grad_norms=(0.5, 1.5),
                                     grad_var=0.1, grad_norm=2.0, loss=0.7, snr_hz=1e9), "update"),
    "periods": (PeriodTerms(period=10, lambda1=10.0, fisher_samples=100, consolidating=9, P=_positive(4),
                            Q=_positive(5)), "model"),
    "period_fisher": (PeriodFisher(period=9, samples=100, F=_positive(6)), "update"),
    "drift": (DriftSignal(3, 1.25), "update"),
    "session": (SessionTerms(session=5, aux_round=1, aux_rounds=64, aux=_positive(7)), "model"),
    "session-aux": (SessionAux(session=5, aux_round=1), "update"),
    "sfedpo": (SfedpoTerms(states=(3, 7), weights=(0.25, 0.75)), "model"),
    "sfedpo_report": (SfedpoReport(score=1.5, availability=0.2, shared_ids=True, states=(3, 7), counts=(10, 20),
                                   admission_rate=0.4), "update"),
    "importance": (ImportanceTerms(budget=0.5, candidates=8), "model"),
    "adaptive_lr": (AdaptiveLr(scale=0.5, lr0=0.1), "model"),
    "method_settings": (MethodSettings.of("streamclp", {"plugins": {"clp": {"lr_rule": "learned"}}}), "model"),
}

#: Other fields set while one is tested, so that the payload's relations (checked by ``parse``)
#: hold at both ends of the tested field's range.
RELATED = {
    ("periods", "period"): {"consolidating": None},            # consolidating < period
    ("periods", "consolidating"): {"period": MAX_EXACT_INT},
    ("session", "aux_round"): {"aux": None},                   # an auxiliary model needs a round
    ("session", "aux_rounds"): {"aux_round": 0, "aux": None},  # aux_round <= aux_rounds
}
#: Values just outside a bound that ``parse`` refuses first for a relation (reason ``schema``):
#: aux_round 65 is beyond aux_rounds (at most 64), consolidating 2**53 is not before any period.
SCHEMA_FIRST = {("session", "aux_round", "above"), ("periods", "consolidating", "above")}

DECODER = Decoder({SPEC.arch_id: tensor_spec(SPEC)})


# ---- (a) every number has a declared bound -------------------------------------------------------

def _field_kind(tp):
    """'int', 'float' (numbers, alone, optional or in a tuple), 'tensors', 'plain' (bool, str), or
    None for an annotation this test cannot classify (extend it rather than skip the field)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        rest = [a for a in args if a is not type(None)]
        return _field_kind(rest[0]) if len(rest) == 1 else None
    if tp in (bool, str):
        return "plain"
    if tp in (int, float):
        return tp.__name__
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis and args[0] in (int, float):
        return args[0].__name__
    if origin is dict and args == (str, np.ndarray):
        return "tensors"
    return None


def _unbounded(cls):
    """Problems with ``cls``'s declared bounds: numeric fields or groups without one, fields of an
    unknown kind, tensor fields that are not declared groups."""
    hints = typing.get_type_hints(cls)
    problems = []
    for f in dataclasses.fields(cls):
        kind = _field_kind(hints[f.name])
        if kind is None:
            problems.append("%s: annotation %r not classified" % (f.name, hints[f.name]))
        elif kind in ("int", "float") and f.name not in cls.BOUNDS:
            problems.append("%s: no bound" % f.name)
        elif kind == "tensors" and f.name not in cls.GROUPS:
            problems.append("%s: tensors, not in GROUPS" % f.name)
    problems += ["group %s: no bound" % g for g in cls.GROUPS if g not in cls.BOUNDS]
    return problems


@pytest.mark.parametrize("kind", sorted(EXTRA_TYPES))
def test_every_numeric_field_and_tensor_group_has_a_bound(kind):
    cls = EXTRA_TYPES[kind]
    assert _unbounded(cls) == []
    assert kind in SAMPLES, "add a sample of %r to SAMPLES" % kind
    sample, _ = SAMPLES[kind]
    assert type(sample) is cls
    assert set(sample.groups()) == set(cls.GROUPS)  # the sample sets every group; none undeclared
    for key, bound in cls.BOUNDS.items():
        assert math.isfinite(bound.lo) and math.isfinite(bound.hi)


def test_the_coverage_check_finds_a_missing_bound():
    @dataclass(frozen=True)
    class Unbounded(Extra):
        KIND = "test_unbounded"
        GROUPS = ("W",)
        BOUNDS = {"count": Bound(0, 10)}
        count: int
        value: float
        ratios: typing.Tuple[float, ...]
        name: str
        W: typing.Optional[typing.Dict[str, np.ndarray]] = None
        X: typing.Optional[typing.Dict[str, np.ndarray]] = None
        odd: typing.List[float] = dataclasses.field(default_factory=list)

        @classmethod
        def parse(cls, fields, groups):
            raise NotImplementedError

    assert _unbounded(Unbounded) == ["value: no bound", "ratios: no bound", "X: tensors, not in GROUPS",
                                     "odd: annotation typing.List[float] not classified", "group W: no bound"]


def test_bounds_are_finite_ordered_and_name_a_field_or_group():
    for lo, hi in ((0, math.inf), (-math.inf, 0), (math.nan, 1), (2, 1), (0, True), ("0", 1)):
        with pytest.raises(ValueError):
            Bound(lo, hi)

    @dataclass(frozen=True)
    class Typo(Extra):
        KIND = "test_typo_bound"
        BOUNDS = {"valeu": Bound(0, 1)}
        value: float = 0.0

        @classmethod
        def parse(cls, fields, groups):
            return cls()

    with pytest.raises(ValueError, match="valeu"):
        register_extra(Typo)
    assert "test_typo_bound" not in EXTRA_TYPES


def test_a_tensor_is_compared_with_the_bound_itself_not_its_float32_rounding():
    @dataclass(frozen=True)
    class Share(Extra):
        KIND = "test_float32_bound"
        GROUPS = ("w",)
        BOUNDS = {"w": Bound(0.0, 0.1)}  # float32(0.1) is 0.10000000149..., past the bound
        w: Tensors = None

        def groups(self):
            return {"w": self.w}

        @classmethod
        def parse(cls, fields, groups):
            return cls(w=groups["w"])

    inside = np.nextafter(np.float32(0.1), np.float32(0))
    assert check_bounds(Share({"x": np.array([0.0, inside], np.float32)}))
    with pytest.raises(ProtocolError) as err:
        check_bounds(Share({"x": np.array([0.0, np.float32(0.1)], np.float32)}))
    assert err.value.reason == "bounds"


# ---- (b) the codec refuses a value just outside, and takes one at the bound ----------------------

def _is_int_field(cls, key):
    return _field_kind(typing.get_type_hints(cls).get(key)) == "int"


def _float32_at(end, inward):
    """The float32 nearest ``end`` on the inside of the range (``inward`` -inf for hi, +inf for lo)."""
    v = np.float32(end)
    if (inward < 0 and float(v) > end) or (inward > 0 and float(v) < end):
        v = np.nextafter(v, np.float32(inward))
    return v


def _cases():
    for kind in sorted(SAMPLES):
        cls = EXTRA_TYPES[kind]
        for key, bound in cls.BOUNDS.items():
            for side in ("below", "at_lo", "at_hi", "above"):
                yield pytest.param(kind, key, side, id="%s.%s-%s" % (kind, key, side))


def _value(cls, key, bound, side):
    """The value for ``side`` of ``bound``: at an end, or the next representable one outside."""
    if key in cls.GROUPS:
        lo, hi = _float32_at(bound.lo, math.inf), _float32_at(bound.hi, -math.inf)
        return {"at_lo": lo, "at_hi": hi, "below": np.nextafter(lo, np.float32(-np.inf)),
                "above": np.nextafter(hi, np.float32(np.inf))}[side]
    if _is_int_field(cls, key):
        return {"at_lo": int(bound.lo), "at_hi": int(bound.hi), "below": int(bound.lo) - 1,
                "above": int(bound.hi) + 1}[side]
    lo, hi = float(bound.lo), float(bound.hi)
    return {"at_lo": lo, "at_hi": hi, "below": float(np.nextafter(lo, -np.inf)),
            "above": float(np.nextafter(hi, np.inf))}[side]


def _with(sample, key, value):
    """``sample`` with ``key`` carrying ``value``: a scalar replaced, a list's last element, or a
    group's last tensor's last element."""
    cls = type(sample)
    if key in cls.GROUPS:
        group = {name: a.copy() for name, a in sample.groups()[key].items()}
        last = sorted(group)[-1]
        group[last].reshape(-1)[-1] = value
        return dataclasses.replace(sample, **{key: group})
    current = getattr(sample, key)
    if isinstance(current, tuple):
        return dataclasses.replace(sample, **{key: current[:-1] + (value,)})
    return dataclasses.replace(sample, **{key: value})


def _frame(kind, extra):
    carrier = SAMPLES[kind][1]
    if carrier == "model":
        return encode(make_global_model(SPEC, version=3, extras={kind: extra}))
    return encode(make_update(SPEC, extras={kind: extra}))


def _sent(extra, key):
    if key in type(extra).GROUPS:
        return extra.groups()[key]
    return getattr(extra, key)


@pytest.mark.parametrize("kind,key,side", list(_cases()))
def test_a_value_outside_a_bound_is_refused_by_the_codec_and_one_at_it_passes(kind, key, side):
    sample, _ = SAMPLES[kind]
    cls = type(sample)
    sample = dataclasses.replace(sample, **RELATED.get((kind, key), {}))
    value = _value(cls, key, cls.BOUNDS[key], side)
    extra = _with(sample, key, value)
    frame = _frame(kind, extra)
    if side.startswith("at_"):
        got = DECODER.decode(frame).extras[kind]
        if key in cls.GROUPS:
            sent = _sent(extra, key)
            assert {n: a.tolist() for n, a in got.groups()[key].items()} == {n: a.tolist() for n, a in sent.items()}
        else:
            assert _sent(got, key) == _sent(extra, key)
        return
    with pytest.raises(ProtocolError) as err:
        DECODER.decode(frame)
    if (kind, key, side) in SCHEMA_FIRST:
        assert err.value.reason == "schema", err.value
    else:
        assert err.value.reason == "bounds", err.value
        assert str(err.value).startswith("bounds: extras.%s.%s: " % (kind, key)), err.value
    with pytest.raises(ProtocolError):  # a direct parse enforces the same bounds
        cls.parse(extra.fields(), extra.groups())


# ---- the attacks that motivated the bounds -------------------------------------------------------

@pytest.mark.parametrize("kind,extra", [
    ("curvature_diagonal", CurvatureDiagonal(make_tensors(SPEC, value=1e30))),      # NaN'd FedCurv
    ("fisher_trace", FisherTrace(1e9)),                                              # flipped CLP
    ("sfedpo_report", SfedpoReport(score=0.0, availability=1e-9)),                   # owned SAW
    ("period_fisher", PeriodFisher(period=0, samples=10 ** 9, F=_positive(7))),      # owned P
], ids=["fisher-diagonal-1e30", "fisher-trace-1e9", "availability-1e-9", "tfdm-samples-1e9"])
def test_the_hostile_payloads_of_issue_27_are_refused_at_the_boundary(kind, extra):
    with pytest.raises(ProtocolError) as err:
        DECODER.decode(encode(make_update(SPEC, extras={kind: extra})))
    assert err.value.reason == "bounds"


def test_the_message_names_the_kind_key_value_range_and_tensor():
    f = make_tensors(SPEC, value=0.5)
    name = sorted(f)[1]
    f[name].reshape(-1)[0] = 1e30
    with pytest.raises(ProtocolError) as err:
        DECODER.decode(encode(make_update(SPEC, extras={"curvature_diagonal": CurvatureDiagonal(f)})))
    assert str(err.value) == ("bounds: extras.curvature_diagonal.F: 1.0000000150474662e+30 outside "
                              "[0.0, 10000.0] (tensor %s)" % name)


def test_a_nan_in_a_group_is_refused_even_without_the_codec():
    f = make_tensors(SPEC, value=0.5)
    f[sorted(f)[0]].reshape(-1)[0] = np.nan
    with pytest.raises(ProtocolError) as err:
        check_bounds(CurvatureDiagonal(f))
    assert err.value.reason == "bounds"


def test_telemetry_reports_are_bounded_too():
    report = ScheduleStats(counts=(3, -1), prev_counts=(1, 1))
    frame = encode(Telemetry(device_id="d1", time_s=1.0, buffer_fill=1, buffer_capacity=4,
                             extras={"schedule_stats": report}))
    with pytest.raises(ProtocolError) as err:
        DECODER.decode(frame)
    assert err.value.reason == "bounds" and "extras.schedule_stats.counts: -1 outside" in str(err.value)


def test_bounds_rejections_are_counted_and_their_warnings_rate_limited(caplog):
    now = [0.0]
    dec = Decoder({SPEC.arch_id: tensor_spec(SPEC)}, warn_interval_s=10.0, clock=lambda: now[0])
    frame = encode(make_update(SPEC, extras={"fisher_trace": FisherTrace(1e9)}))
    assert "bounds" in REASONS
    with caplog.at_level(logging.DEBUG, logger="streamfl.protocol.codec"):
        for t in (0.0, 1.0, 2.0, 11.0):
            now[0] = t
            assert dec.try_decode(frame, source="evil") is None
    assert dec.rejected["bounds"] == 4
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "extras.fisher_trace.value" in warnings[0]
    assert "2 more bounds rejections suppressed" in warnings[1]
