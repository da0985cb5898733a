"""Adaptive-FedAvg (Canonaco et al. 2021): the coordinator's rate rule at hand-computed points, our
guards (decay_every, min_lr_ratio), its settings, the AdaptiveLr payload against hostile values,
restarts, and the device applying the rate (through the codec)."""
import json
import math

import numpy as np
import pytest

from factories import make_global_model, make_hello, make_update
from streamfl.agent.config import AgentConfig
from streamfl.agent.core import AgentCore
from streamfl.methods.adaptive_lr.agent import AdaptiveLrAgentConfig, AdaptiveLrAgentPlugin
from streamfl.config import build
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.core import CoordinatorCore
from streamfl.coordinator.plugins import Aggregation, FleetView, plugin_configs
from streamfl.methods.adaptive_lr.coordinator import AdaptiveLrConfig, AdaptiveLrPlugin, flat_parameters
from streamfl.errors import ProtocolError
from streamfl.models import ModelSpec, tensor_spec
from streamfl.methods.adaptive_lr.payloads import MIN_SCALE, AdaptiveLr
from streamfl.protocol.codec import Decoder, encode

NAN, INF = float("nan"), float("inf")
#: The hand-computed run: three global models of a 2-parameter model (b1 = b2 = b3 = 0.5).
#:   t=1: x=[1,3]   m^=[1,3]   v^=5            r^=1                  lr0 * min(1, 1/1)
#:   t=2: x=[7,-3]  m^=[5,-1]  v^=77/3 (d=36)  r^=169/45 (ratio 77/15)  min binds: 169/90 > 1
#:   t=3: x=[5,-1]  m^=[5,-1]  v^=11   (d=0)   r^=1363/735 (ratio 3/7)  lr0 * 1363/2205
MODELS = ([1.0, 3.0], [7.0, -3.0], [5.0, -1.0])
SCALES = (1.0, 1.0, 1363.0 / 2205.0)
V_HATS = (5.0, 77.0 / 3.0, 11.0)
R_HATS = (1.0, 169.0 / 45.0, 1363.0 / 735.0)


class Fleet:
    """A FleetView around a model the test sets (two tensors of one parameter each)."""

    def __init__(self):
        self.model = {"a": np.zeros(1, np.float32), "b": np.zeros(1, np.float32)}
        self.view = FleetView(online=lambda: (), model=lambda: self.model)

    def set(self, x):
        self.model = {"a": np.array([x[0]], np.float32), "b": np.array([x[1]], np.float32)}


def plugin(**settings):
    fleet = Fleet()
    return AdaptiveLrPlugin(AdaptiveLrConfig(**settings), fleet.view, {}), fleet


def aggregate(p, fleet, x, version):
    fleet.set(x)
    return p.on_model_made(Aggregation(version, (), float(version)))


# ---- the rule -----------------------------------------------------------------------------------

def test_no_extra_before_the_first_aggregation():
    p, _ = plugin()
    assert p.before_publish() == [] and p.scale() is None


def test_three_aggregations_at_hand_computed_points():
    p, fleet = plugin(lr0=0.1)
    for t, x in enumerate(MODELS, start=1):
        effects = aggregate(p, fleet, x, t)
        assert p.stats.t == t
        assert p.stats.v_hat() == pytest.approx(V_HATS[t - 1], rel=1e-12)
        assert p.stats.r_hat() == pytest.approx(R_HATS[t - 1], rel=1e-12)
        assert p.scale() == pytest.approx(SCALES[t - 1], rel=1e-12)
        (extra,) = p.before_publish()
        assert isinstance(extra, AdaptiveLr) and extra.lr0 == 0.1
        assert extra.lr_for(0.5) == pytest.approx(0.1 * SCALES[t - 1], rel=1e-12)
        (event,) = effects.events
        assert event["event"] == "adaptive_lr" and event["t"] == t
        assert event["lr"] == pytest.approx(0.1 * SCALES[t - 1], rel=1e-12)
    np.testing.assert_allclose(p.stats.m_hat(), [5.0, -1.0], rtol=1e-12)
    assert p.stats.ratio == pytest.approx(3.0 / 7.0, rel=1e-12)


def test_the_min_with_lr0_binds_at_t2():
    p, fleet = plugin()
    aggregate(p, fleet, MODELS[0], 1)
    aggregate(p, fleet, MODELS[1], 2)
    assert p.stats.r_hat() / 2 == pytest.approx(169.0 / 90.0) and p.scale() == 1.0
    (extra,) = p.before_publish()
    assert extra.lr0 is None and extra.lr_for(0.02) == 0.02   # lr0: the broadcast rate


def test_decay_every_counts_aggregations_per_unit_of_t():
    p, fleet = plugin(decay_every=3)
    for t, x in enumerate(MODELS, start=1):
        aggregate(p, fleet, x, t)
    # t / decay_every = 1: no decay yet, the ratio alone (1363/735 > 1) and the min with lr0.
    assert p.stats.r_hat() == pytest.approx(R_HATS[2]) and p.scale() == 1.0
    p, fleet = plugin(decay_every=2)
    for t, x in enumerate(MODELS * 2, start=1):
        aggregate(p, fleet, x, t)
    assert p.scale() == pytest.approx(min(1.0, p.stats.r_hat() / 3.0), rel=1e-12)


def test_min_lr_ratio_floors_the_rate():
    p, fleet = plugin(min_lr_ratio=0.7, lr0=0.2)
    for t, x in enumerate(MODELS, start=1):
        aggregate(p, fleet, x, t)
    assert SCALES[2] < 0.7 and p.scale() == 0.7 and p.lr() == pytest.approx(0.14)


def test_a_zero_previous_variance_counts_as_ratio_one():
    p, fleet = plugin()
    for t in range(1, 6):
        aggregate(p, fleet, [0.0, 0.0], t)   # v^ stays 0: every ratio is the guard's 1
        assert p.stats.ratio == 1.0 and p.stats.r_hat() == pytest.approx(1.0)
        assert p.scale() == pytest.approx(1.0 / t)


def test_a_settled_model_decays_but_never_to_zero():
    p, fleet = plugin()
    for t in range(1, 2001):
        aggregate(p, fleet, [1.0, 3.0], t)
    scale = p.scale()
    assert 0 < scale < 1e-3 and math.isfinite(scale) and scale >= MIN_SCALE
    AdaptiveLr.parse(AdaptiveLr(scale).fields(), {})   # what goes out always parses


def test_matches_a_direct_reimplementation_on_a_random_run():
    rng = np.random.default_rng(3)
    xs = [rng.normal(size=2) * (1 + 5 * (k == 7)) for k in range(12)]   # a jump at t = 8
    p, fleet = plugin(mean_decay=0.3, variance_decay=0.6, ratio_decay=0.9, decay_every=4)
    m, v, r, v_prev = np.zeros(2), 0.0, 0.0, None
    for t, x in enumerate(xs, start=1):
        x = x.astype(np.float32).astype(np.float64)
        m_hat_prev = m / (1 - 0.3 ** (t - 1)) if t > 1 else np.zeros(2)
        v = 0.6 * v + 0.4 * np.mean((x - m_hat_prev) ** 2)
        m = 0.3 * m + 0.7 * x
        v_hat = v / (1 - 0.6 ** t)
        r = 0.9 * r + 0.1 * (1.0 if v_prev is None else v_hat / v_prev)
        v_prev = v_hat
        aggregate(p, fleet, x, t)
        assert p.scale() == pytest.approx(min(1.0, r / (1 - 0.9 ** t) / max(1.0, t / 4)), rel=1e-9)


def test_flat_parameters_skips_integer_tensors():
    tensors = {"b": np.array([2.0], np.float32), "a": np.array([[1.0, 3.0]], np.float32),
               "n": np.array([5], np.int64)}
    np.testing.assert_array_equal(flat_parameters(tensors), [1.0, 3.0, 2.0])


# ---- settings -----------------------------------------------------------------------------------

@pytest.mark.parametrize("settings", [
    {"mean_decay": NAN}, {"mean_decay": 1.0}, {"variance_decay": -0.1}, {"ratio_decay": NAN}, {"ratio_decay": INF},
    {"lr0": 0.0}, {"lr0": -0.01}, {"lr0": 10.5}, {"lr0": NAN}, {"lr0": INF},
    {"decay_every": 0}, {"decay_every": True}, {"decay_every": 2.5},
    {"min_lr_ratio": -0.1}, {"min_lr_ratio": 1.5}, {"min_lr_ratio": NAN},
])
def test_bad_settings_are_refused(settings):
    with pytest.raises(ValueError):
        AdaptiveLrConfig(**settings)
    with pytest.raises(ValueError):
        plugin_configs({"adaptive_lr": settings}, "fedavg")


def test_settings_from_yaml_values():
    config = plugin_configs({"adaptive_lr": {"lr0": 0.05, "decay_every": 20, "min_lr_ratio": 0.1}},
                            "fedavg")["adaptive_lr"]
    assert (config.lr0, config.decay_every, config.min_lr_ratio, config.mean_decay) == (0.05, 20, 0.1, 0.5)
    assert build(AdaptiveLrConfig, {}, "t") == AdaptiveLrConfig()


# ---- the payload --------------------------------------------------------------------------------

@pytest.mark.parametrize("fields", [
    {"scale": NAN}, {"scale": INF}, {"scale": -0.5}, {"scale": 0}, {"scale": 0.0}, {"scale": 1.5},
    {"scale": True}, {"scale": "0.5"}, {"scale": None}, {"scale": [0.5]}, {"scale": 10 ** 400},
    {}, {"lr0": 0.1},
    {"scale": 0.5, "lr0": NAN}, {"scale": 0.5, "lr0": INF}, {"scale": 0.5, "lr0": -0.1},
    {"scale": 0.5, "lr0": 0}, {"scale": 0.5, "lr0": 10.01}, {"scale": 0.5, "lr0": False},
    {"scale": 0.5, "lr0": "0.1"}, {"scale": 0.5, "lr0": None},
    {"scale": 0.5, "lr": 0.1},
])
def test_hostile_fields_are_refused(fields):
    with pytest.raises(ProtocolError):
        AdaptiveLr.parse(fields, {})


def test_attached_tensors_are_refused():
    with pytest.raises(ProtocolError):
        AdaptiveLr.parse({"scale": 0.5}, {"m": {"a": np.zeros(1, np.float32)}})


def test_good_fields_parse():
    assert AdaptiveLr.parse({"scale": 1}, {}) == AdaptiveLr(1.0)
    assert AdaptiveLr.parse({"scale": 0.25, "lr0": 10}, {}) == AdaptiveLr(0.25, 10.0)
    assert AdaptiveLr(0.25, 0.4).lr_for(99.0) == pytest.approx(0.1)


SPEC = ModelSpec(name="mlp", in_channels=2, window_len=4, num_classes=3, hidden=4)


def test_the_extra_survives_the_codec():
    decoder = Decoder({SPEC.arch_id: tensor_spec(SPEC)})
    for extra in (AdaptiveLr(0.3), AdaptiveLr(1.0 / 3.0, 0.05)):
        gm = make_global_model(SPEC, extras={AdaptiveLr.KIND: extra})
        assert decoder.decode(encode(gm)).extras[AdaptiveLr.KIND] == extra


# ---- restarts -----------------------------------------------------------------------------------

def test_state_round_trip_gives_the_same_lr_after_the_next_aggregation():
    p, fleet = plugin(lr0=0.1)
    for t, x in enumerate(MODELS, start=1):
        aggregate(p, fleet, x, t)
    state = json.loads(json.dumps(p.state()))
    arrays = {k: a.copy() for k, a in p.state_tensors().items()}
    q, fleet_q = plugin(lr0=0.1)
    fleet_q.set(MODELS[-1])
    q.load_state(state)
    q.load_state_tensors(arrays)
    assert q.state() == p.state() and q.scale() == p.scale()
    aggregate(p, fleet, [2.0, 2.0], 4)
    aggregate(q, fleet_q, [2.0, 2.0], 4)
    assert q.scale() == p.scale() and q.lr() == p.lr() and q.stats.r_hat() == p.stats.r_hat()
    np.testing.assert_array_equal(q.stats.m, p.stats.m)


def test_state_tensors_are_replaced_never_changed():
    p, fleet = plugin()
    aggregate(p, fleet, MODELS[0], 1)
    shown = p.state_tensors()["m"]
    kept = shown.copy()
    aggregate(p, fleet, MODELS[1], 2)
    np.testing.assert_array_equal(shown, kept)


def test_without_saved_m_the_mean_restarts_at_the_restored_model():
    p, fleet = plugin()
    for t, x in enumerate(MODELS[:2], start=1):
        aggregate(p, fleet, x, t)
    q, fleet_q = plugin()
    fleet_q.set([4.0, 4.0])
    q.load_state(json.loads(json.dumps(p.state())))
    np.testing.assert_allclose(q.stats.m_hat(), [4.0, 4.0], rtol=1e-12)
    assert q.scale() == p.scale()


@pytest.mark.parametrize("state", [
    {"t": "3"}, {"t": -1}, {"t": True}, {"t": 2.0}, {"t": 3, "v": NAN}, {"t": 3, "r": -1.0},
    {"t": 3, "v": "x"}, {"t": 3, "ratio": INF},
])
def test_a_malformed_state_is_refused(state):
    p, _ = plugin()
    with pytest.raises(ValueError):
        p.load_state(state)


@pytest.mark.parametrize("arrays", [
    {"m": np.zeros(3)}, {"m": np.array([1.0, NAN])}, {"m": np.zeros(2), "x": np.zeros(2)}, {},
])
def test_malformed_saved_arrays_are_refused(arrays):
    p, fleet = plugin()
    aggregate(p, fleet, MODELS[0], 1)
    q, _ = plugin()
    q.load_state(p.state())
    with pytest.raises(ValueError):
        q.load_state_tensors(arrays)


# ---- the device ---------------------------------------------------------------------------------

HPARAMS = {"lr": 0.05, "batch_size": 4, "local_steps": 3, "dropout": 0.0}


def test_the_agent_plugin_is_dormant_without_the_extra():
    core = agent_core()
    core.on_global_model(make_global_model(SPEC, hparams=dict(HPARAMS)))
    assert core.plugin("adaptive_lr") not in core.active_plugins and core.hparams == HPARAMS


def test_the_agent_plugin_sets_the_lr_and_goes_dormant_again():
    a = AdaptiveLrAgentPlugin(AdaptiveLrAgentConfig())
    given = dict(HPARAMS)
    out = a.on_model_received(make_global_model(SPEC, hparams=dict(HPARAMS),
                                                extras={"adaptive_lr": AdaptiveLr(0.2)}), given).hparams
    assert out["lr"] == pytest.approx(0.01) and given == HPARAMS
    assert {k: v for k, v in out.items() if k != "lr"} == {k: v for k, v in HPARAMS.items() if k != "lr"}
    gm = make_global_model(SPEC, hparams=dict(HPARAMS), extras={"adaptive_lr": AdaptiveLr(0.5, 0.1)})
    assert a.on_model_received(gm, dict(HPARAMS)).hparams["lr"] == pytest.approx(0.05)
    core = agent_core()
    core.on_global_model(make_global_model(SPEC, version=1, hparams=dict(HPARAMS),
                                           extras={"adaptive_lr": AdaptiveLr(0.5, 0.1)}))
    assert core.hparams["lr"] == pytest.approx(0.05)
    core.on_global_model(make_global_model(SPEC, version=2, hparams=dict(HPARAMS)))
    assert core.hparams == HPARAMS and core.plugin("adaptive_lr") not in core.active_plugins


def agent_core():
    cfg = build(AgentConfig, {"device_id": "a1", "model": SPEC, "min_buffer": 8, "buffer_capacity": 64,
                              "seed": 1, "local_steps": 3, "batch_size": 4,
                              "sensor": {"kind": "mqtt", "window_len": 4, "channels": 2, "num_classes": 3}},
                "test")
    return AgentCore(cfg, timer=lambda: 0.0)


def test_a_fleet_through_the_codec_trains_at_the_coordinators_rate():
    core = CoordinatorCore(build(CoordinatorConfig, {
        "model": SPEC, "strategy": "fedavg", "fedavg": {"deadline_s": 2.0, "min_updates": 1},
        "hparams": {"lr": 0.04}, "plugins": {"adaptive_lr": {}}}, "test"))
    decoder = Decoder({SPEC.arch_id: tensor_spec(SPEC)})
    device = agent_core()
    assert AdaptiveLr.KIND not in decoder.decode(encode(core.global_model())).extras
    for d in ("d0", "d1"):
        core.on_message(make_hello(d, SPEC), 0.0)
    rng = np.random.default_rng(0)
    events = []
    for k in range(4):
        for d in ("d0", "d1"):
            tensors = {n: a + rng.normal(scale=0.1, size=a.shape).astype(np.float32)
                       for n, a in core.model.items()}
            step = core.on_message(make_update(SPEC, device_id=d, base_version=core.version,
                                               tensors=tensors), 1.0 + k)
            events += [e for e in step.events if e.get("event") == "adaptive_lr"]
    plugin = core.plugins[-1]
    assert core.version == 4 and [e["t"] for e in events] == [1, 2, 3, 4]
    gm = decoder.decode(encode(core.global_model()))
    assert gm.extras[AdaptiveLr.KIND].scale == pytest.approx(plugin.scale())
    assert device.on_global_model(gm)
    assert device.hparams["lr"] == pytest.approx(0.04 * plugin.scale())
