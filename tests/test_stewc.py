"""ST-EWC's temporal half through the cores: its payloads, the coordinator's P/Q sums (eq. 9) and
their survival of a restart, period announcements, the device's penalty, T-FDM and drift count."""
import numpy as np
import pytest
import torch

from factories import UNBOUNDED_ADMISSION, greet, make_update
from streamfl.agent.config import AgentConfig
from streamfl.agent.core import AgentCore
from streamfl.methods.stewc.drift import InputDrift
from streamfl.agent.plugins.base import RoundContext
from streamfl.methods.stewc.agent import StEwcAgentPlugin
from streamfl.config import build
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.core import CoordinatorCore
from streamfl.coordinator.persistence import Persister, StateStore
from streamfl.methods.stewc.temporal import TemporalSums
from streamfl.errors import ProtocolError
from streamfl.models import ModelSpec, build_model, tensor_spec
from streamfl.models.fisher import fisher_diagonal
from streamfl.models.serialize import arrays_to_model, model_to_arrays
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import GlobalModel
from streamfl.methods.stewc.payloads import DriftSignal, PeriodFisher, PeriodTerms
from streamfl.sensors.window import Window

SPEC = {"name": "mlp", "in_channels": 3, "window_len": 8, "num_classes": 3, "hidden": 8}
MSPEC = ModelSpec(**SPEC)


def _tensors(seed, positive=False):
    rng = np.random.default_rng(seed)
    out = {k: rng.standard_normal(s).astype(np.float32) for k, (s, _) in tensor_spec(MSPEC).items()}
    return {k: np.abs(v) for k, v in out.items()} if positive else out


def _decoder():
    return Decoder({MSPEC.arch_id: tensor_spec(MSPEC)})


# ---- payloads ----------------------------------------------------------------------------------
def test_payloads_round_trip_through_the_codec():
    P, Q, F = _tensors(1, positive=True), _tensors(2), _tensors(3, positive=True)
    gm = GlobalModel(version=4, arch_id=MSPEC.arch_id, tensors=_tensors(0), extras={
        "periods": PeriodTerms(period=2, lambda1=3.0, fisher_samples=10, consolidating=1, P=P, Q=Q)})
    got = _decoder().decode(encode(gm)).extras["periods"]
    assert (got.period, got.lambda1, got.fisher_samples, got.consolidating) == (2, 3.0, 10, 1)
    np.testing.assert_array_equal(got.Q["head.bias"], Q["head.bias"])
    update = make_update(MSPEC, extras={"period_fisher": PeriodFisher(1, 200, F),
                                        "drift": DriftSignal(3, 1.25)})
    got = _decoder().decode(encode(update)).extras
    assert (got["period_fisher"].period, got["period_fisher"].samples) == (1, 200)
    assert (got["drift"].drifts, got["drift"].shift) == (3, 1.25)


@pytest.mark.parametrize("fields,groups", [
    ({"period": 1, "lambda1": -1.0, "fisher_samples": 1}, {}),               # negative lambda1
    ({"period": 1, "lambda1": 1.0, "fisher_samples": 1, "consolidating": 1}, {}),  # not earlier
    ({"period": 1, "lambda1": 1.0, "fisher_samples": 1, "x": 1}, {}),        # unknown field
    ({"period": 1, "lambda1": 1.0, "fisher_samples": 1}, {"P": {"w": np.ones(2)}}),  # P without Q
    ({"period": 1, "lambda1": 1.0, "fisher_samples": 1},
     {"P": {"w": -np.ones(2)}, "Q": {"w": np.ones(2)}}),                      # negative P
    ({"period": 1, "lambda1": 1.0, "fisher_samples": 1},
     {"P": {"w": np.ones(2)}, "Q": {"w": np.array([1.0, np.inf])}}),          # Q not finite
    ({"period": 1, "lambda1": 1.0, "fisher_samples": 1},
     {"P": {"w": np.ones(2)}, "Q": {"w": np.ones(3)}}),                       # torn
])
def test_hostile_period_terms_are_refused(fields, groups):
    with pytest.raises(ProtocolError):
        PeriodTerms.parse(fields, groups)


def test_hostile_fisher_and_drift_reports_are_refused():
    with pytest.raises(ProtocolError):
        PeriodFisher.parse({"period": 0, "samples": 5}, {"F": {"w": np.array([np.nan])}})
    with pytest.raises(ProtocolError):
        PeriodFisher.parse({"period": 0, "samples": 5}, {"F": {"w": np.array([-1.0])}})
    with pytest.raises(ProtocolError):
        PeriodFisher.parse({"period": 0, "samples": 0}, {"F": {"w": np.array([1.0])}})
    with pytest.raises(ProtocolError):
        DriftSignal.parse({"drifts": -1}, {})
    with pytest.raises(ProtocolError):
        DriftSignal.parse({"drifts": 1, "shift": float("nan")}, {})


# ---- the coordinator's sums ----------------------------------------------------------------------
def test_sums_are_eq_9_per_period_and_p_q_accumulate_over_periods():
    sums = TemporalSums()
    anchors, folded = [_tensors(10), _tensors(11)], []
    for t, anchor in enumerate(anchors):
        sums.begin(t, anchor, version=t, now=0.0, expected=["a", "b"])
        fa, fb = _tensors(20 + t, positive=True), _tensors(30 + t, positive=True)
        assert sums.add("a", PeriodFisher(t, 100, fa)) and sums.add("b", PeriodFisher(t, 300, fb))
        assert not sums.add("a", PeriodFisher(t, 100, fb))          # once per device and period
        assert sums.ready(0.0, ["a", "b"], quorum=1.0, wait_s=30.0)
        assert sums.fold()["devices"] == 2
        folded.append({k: (100 * fa[k] + 300 * fb[k]) / 400 for k in fa})
    for k in anchors[0]:
        np.testing.assert_allclose(sums.P[k], folded[0][k] + folded[1][k], rtol=1e-5)
        want_q = folded[0][k] * anchors[0][k] + folded[1][k] * anchors[1][k]
        np.testing.assert_allclose(sums.Q[k], want_q, rtol=1e-4, atol=1e-6)
    assert sums.folded == 2 and sums.pending is None


def test_sums_refuse_other_periods_and_shapes_and_clip_forged_values():
    sums = TemporalSums(max_fisher=2.0, max_samples=50)
    anchor = _tensors(0)
    sums.begin(3, anchor, version=9, now=0.0, expected=["a", "b", "c"])
    f = {k: np.full_like(v, 1.0e6) for k, v in anchor.items()}
    assert not sums.add("a", PeriodFisher(2, 10, f))                                # another period
    assert not sums.add("a", PeriodFisher(3, 10, {k: v[..., :1] for k, v in f.items()}))  # shapes
    assert sums.add("a", PeriodFisher(3, 10 ** 9, f))
    assert sums.pending.samples == 50
    assert not sums.ready(1.0, ["a", "b", "c"], quorum=1.0, wait_s=30.0)   # 1 of 3, not timed out
    assert sums.ready(1.0, ["a"], quorum=1.0, wait_s=30.0)                # the others went away
    assert sums.ready(31.0, ["a", "b", "c"], quorum=1.0, wait_s=30.0)      # waited long enough
    sums.fold()
    assert max(float(p.max()) for p in sums.P.values()) == 2.0            # clipped to max_fisher
    assert TemporalSums().fold() is None


def test_a_period_nobody_answered_is_dropped():
    sums = TemporalSums()
    sums.begin(0, _tensors(0), version=1, now=0.0, expected=["a"])
    assert not sums.ready(100.0, ["a"], quorum=1.0, wait_s=1.0)
    assert sums.fold() is None and sums.P is None and sums.pending is None


# ---- through the coordinator core ------------------------------------------------------------
def _core(tensors=None, **stewc):
    settings = {"boundary": "schedule", "period_s": 10.0, "temporal_strength": 2.0, "fisher_samples": 6}
    settings.update(stewc)
    return CoordinatorCore(build(CoordinatorConfig, {"model": SPEC, "admission": UNBOUNDED_ADMISSION,
                                                     "plugins": {"stewc": settings}}, "test"),
                           tensors=tensors)


def _update(core, device, extras=None, seed=0):
    return make_update(MSPEC, device_id=device, base_version=core.version, tensors=_tensors(seed),
                       extras=extras or {})


def _consolidate(core, devices, now):
    """Cross a boundary at ``now`` and answer it from ``devices``; the P and Q it should give."""
    core.tick(now)
    core.on_update(_update(core, devices[0], seed=int(now)), now)     # the aggregation announcing it
    terms = core.global_model().extras["periods"]
    anchor = dict(core.model)
    assert terms.consolidating == terms.period - 1
    fishers = [_tensors(int(now) + i, positive=True) for i in range(len(devices))]
    for i, (device, f) in enumerate(zip(devices, fishers)):
        core.on_update(_update(core, device, {"period_fisher": PeriodFisher(terms.consolidating, 10 * (i + 1), f)}), now)
    folded = core.tick(now + 0.5)
    assert [e["event"] for e in folded.events] == ["consolidated"]    # said when it happens
    assert folded.events[0]["devices"] == len(devices)
    weights = [10 * (i + 1) for i in range(len(devices))]
    F = {k: sum(w * f[k] for w, f in zip(weights, fishers)) / sum(weights) for k in anchor}
    return F, {k: F[k] * anchor[k] for k in anchor}


def test_a_scheduled_boundary_is_announced_consolidated_and_broadcast():
    core = greet(_core(), "a", "b")
    core.tick(0.0)
    core.on_update(_update(core, "a"), 1.0)
    terms = core.global_model().extras["periods"]
    assert (terms.period, terms.consolidating, terms.P) == (0, None, None)
    F, FQ = _consolidate(core, ["a", "b"], 10.0)
    terms = core.global_model().extras["periods"]
    assert (terms.period, terms.consolidating, terms.lambda1) == (1, None, 2.0)
    for k in F:
        np.testing.assert_allclose(terms.P[k], F[k], rtol=1e-5)
        np.testing.assert_allclose(terms.Q[k], FQ[k], rtol=1e-4, atol=1e-6)
    events = [e for e in core.on_update(_update(core, "a"), 11.0).events]
    assert "consolidated" not in [e["event"] for e in events]     # it was the tick's news


def test_period_sums_and_an_open_consolidation_survive_a_restart(tmp_path):
    core = greet(_core(), "a", "b")
    core.tick(0.0)
    _consolidate(core, ["a", "b"], 10.0)
    core.tick(20.0)
    core.on_update(_update(core, "a"), 20.0)           # period 2 announced, its T-FDM open
    core.on_update(_update(core, "a", {"period_fisher": PeriodFisher(1, 5, _tensors(7, True))}), 20.0)
    Persister(StateStore(tmp_path)).flush(core)
    tensors, state = StateStore(tmp_path).load(MSPEC)
    again = greet(_core(tensors), "a", "b")
    again.restore(tensors, state, now=21.0)
    before, after = core.plugin("stewc"), again.plugin("stewc")
    assert after.period == 2 and after.sums.pending.period == 1 and after.sums.pending.devices == {"a"}
    for k in before.sums.P:
        np.testing.assert_array_equal(after.sums.P[k], before.sums.P[k])
        np.testing.assert_array_equal(after.sums.Q[k], before.sums.Q[k])
    # The open period finishes after the restart as it would have before it.
    late = _update(again, "b", {"period_fisher": PeriodFisher(1, 5, _tensors(8, True))})
    for c in (core, again):
        c.on_update(late, 22.0)
        c.tick(22.5)
    for k in before.sums.P:
        np.testing.assert_allclose(after.sums.P[k], before.sums.P[k], rtol=1e-6)
    assert after.sums.folded == before.sums.folded == 2


def test_saved_sums_that_are_not_finite_are_refused(tmp_path, caplog):
    core = greet(_core(), "a", "b")
    core.tick(0.0)
    _consolidate(core, ["a", "b"], 10.0)
    arrays = dict(core.plugin("stewc").sums.arrays())
    key = next(k for k in arrays if k.startswith("P/"))
    for bad in ({**arrays, key: np.full_like(arrays[key], np.nan)}, {**arrays, key: -arrays[key] - 1},
                {k: v for k, v in arrays.items() if k != key}, {**arrays, "R/x": arrays[key]}):
        with pytest.raises(ValueError):
            TemporalSums().load({"folded": 1}, bad)


def test_drift_reports_cut_periods_when_a_quorum_moved():
    core = greet(_core(boundary="drift", drift_quorum=0.5, min_period_s=5.0), "a", "b", "c", "d")
    core.tick(0.0)
    for d in "abcd":
        core.on_update(_update(core, d, {"drift": DriftSignal(0)}), 1.0)
    core.on_update(_update(core, "a", {"drift": DriftSignal(1)}), 6.0)
    core.tick(6.0)
    assert not core.plugin("stewc")._announce                 # one device of four is its own business
    core.on_update(_update(core, "b", {"drift": DriftSignal(1)}), 7.0)
    core.tick(7.0)
    core.on_update(_update(core, "c"), 7.5)
    assert core.global_model().extras["periods"].period == 1


# ---- the device side ---------------------------------------------------------------------------
def _terms(P, Q, lam=2.0, period=1, consolidating=None):
    return GlobalModel(version=3, arch_id=MSPEC.arch_id, tensors=_tensors(5), hparams={"lr": 0.01},
                       extras={"periods": PeriodTerms(period, lam, 4, consolidating, P, Q)})


def test_penalty_gradient_is_lambda1_times_p_theta_minus_q_and_capped_for_stability():
    model = build_model(MSPEC, seed=0)
    P, Q = _tensors(1, positive=True), _tensors(2)
    plugin = StEwcAgentPlugin()
    gm = _terms(P, Q)
    plugin.on_model_received(gm, {"lr": 0.01})       # cap stability / (lr lambda1) = 50 > every P here
    model.zero_grad()
    plugin.before_round(model)(model).backward()
    for n, p in model.named_parameters():
        want = 2.0 * (P[n] * p.detach().double().numpy() - Q[n])
        np.testing.assert_allclose(p.grad.double().numpy(), want, rtol=1e-4, atol=1e-5)
    plugin.on_model_received(gm, {"lr": 1.0})        # cap 0.5: lr * lambda1 * P never above 1
    model.zero_grad()
    plugin.before_round(model)(model).backward()
    for n, p in model.named_parameters():
        theta = p.detach().double().numpy()
        want = 2.0 * np.minimum(P[n], 0.5) * (theta - Q[n] / P[n])
        np.testing.assert_allclose(p.grad.double().numpy(), want, rtol=1e-3, atol=1e-4)
    plugin.on_model_received(_terms(None, None), {"lr": 0.01})
    assert plugin.before_round(model) is None      # nothing consolidated yet
    plugin.on_model_received(_terms(P, Q, lam=0.0), {"lr": 0.01})
    assert plugin.before_round(model) is None      # TimeEWC off


def _agent(device="d1"):
    cfg = build(AgentConfig, {"device_id": device, "model": SPEC, "min_buffer": 8, "local_steps": 3,
                              "batch_size": 8, "plugins": {"clp": {"fisher_samples": 0}},
                              "sensor": {"channels": 3, "window_len": 8, "num_classes": 3}}, "test")
    agent = AgentCore(cfg, clock=lambda: 0.0, seed=3)
    rng = np.random.default_rng(0)
    for i in range(24):
        x = rng.standard_normal((8, 3)).astype(np.float32)
        x[:, i % 3] += 2.0
        agent.add_window(Window(x, i % 3))
    return agent


def test_a_device_answers_a_consolidation_once_with_the_fisher_at_theta_star():
    agent = _agent()
    gm = _terms(None, None, period=1, consolidating=0)
    gm = GlobalModel(version=1, arch_id=MSPEC.arch_id, tensors=_tensors(5), hparams={"lr": 0.05},
                     extras=gm.extras)
    agent.on_global_model(gm)
    update = _decoder().decode(encode(agent.train_round()))
    fisher = update.extras["period_fisher"]
    assert (fisher.period, fisher.samples) == (0, 24) and "drift" in update.extras
    plugin = next(p for p in agent.plugins if p.name == "stewc")
    assert plugin._anchor is None and plugin._answered == {0}
    # The T-FDM is the Fisher at theta* (the announcing model), not at the trained model.
    fresh = StEwcAgentPlugin()
    fresh.on_model_received(gm, dict(gm.hparams))
    X, y = _all_windows(agent)
    trained = build_model(MSPEC, seed=1)
    ctx = RoundContext(model=trained, tensors=model_to_arrays(trained), round_index=1, seed=3,
                       sample=lambda n: (X[:n], y[:n]), buffer_len=len(y))
    stats = fresh.after_round(ctx)
    got = next(s.extra for s in stats if isinstance(s.extra, PeriodFisher)).F
    at = build_model(MSPEC, seed=0)
    arrays_to_model(at, gm.tensors)
    for model, same in ((at, True), (trained, False)):
        want = fisher_diagonal(model, X[:4], y[:4], generator=torch.Generator().manual_seed(3 * 7919))
        close = all(np.allclose(got[k], want[k], rtol=1e-5, atol=1e-9) for k in want)
        assert close == same
    agent.on_global_model(GlobalModel(version=2, arch_id=MSPEC.arch_id, tensors=_tensors(6),
                                      hparams={"lr": 0.05}, extras=gm.extras))
    assert "period_fisher" not in agent.train_round().extras        # answered once


def _all_windows(agent):
    return agent.buffer.sample(len(agent.buffer), np.random.default_rng(0))


def test_a_device_without_the_method_sends_nothing():
    agent = _agent()
    agent.on_global_model(GlobalModel(version=1, arch_id=MSPEC.arch_id, tensors=_tensors(5)))
    update = agent.train_round()
    assert "period_fisher" not in update.extras and "drift" not in update.extras


# ---- the drift detector -------------------------------------------------------------------------
def _stream(n, rng, perm=None):
    for i in range(n):
        x = rng.standard_normal((28, 28)).astype(np.float32) * 0.3
        x[8:20, 10:18] += 1.0 + (i % 2)          # two "classes", a blob in the middle
        yield x if perm is None else x.reshape(-1)[perm].reshape(28, 28)


def test_drift_is_counted_once_per_domain_change_and_never_on_stationary_data():
    rng = np.random.default_rng(0)
    drift = InputDrift(windows=32, threshold=0.75)
    for x in _stream(2000, rng):
        assert not drift.add(x)
    assert drift.drifts == 0 and 0 < drift.shift < 0.75
    perm = np.random.default_rng(1).permutation(28 * 28)
    hits = [drift.add(x) for x in _stream(300, rng, perm)]
    assert sum(hits) == 1 and drift.drifts == 1
    assert hits.index(True) < 32                   # noticed within one comparison window


def test_the_trainer_fuses_pulls_into_the_same_step_as_their_loss_terms():
    """Two pulls added to the gradients in place give the parameters that the same pulls as loss
    terms give (and the logged loss stays the data's)."""
    from streamfl.agent.quadratic import QuadraticPull
    from streamfl.agent.trainer import LocalTrainer
    rng = np.random.default_rng(0)
    X = rng.standard_normal((4, 8, 3)).astype(np.float32)
    y = np.array([0, 1, 2, 0])
    pulls = []
    for seed in (1, 2):
        model = build_model(MSPEC, seed=0)
        r = np.random.default_rng(seed)
        pulls.append(QuadraticPull({n: (torch.as_tensor(r.random(p.shape), dtype=p.dtype),
                                        torch.as_tensor(r.standard_normal(p.shape), dtype=p.dtype))
                                    for n, p in model.named_parameters()}))
    after, losses = [], []
    for fused in (True, False):
        model = build_model(MSPEC, seed=0)
        trainer = LocalTrainer(model, 3)
        trainer.penalties = list(pulls) if fused else [lambda m, p=p: p(m) for p in pulls]
        result = trainer.run([(X, y), (X, y)], lr=0.05)
        after.append(model_to_arrays(model))
        losses.append(result.losses[0])
    for k in after[0]:
        np.testing.assert_allclose(after[0][k], after[1][k], rtol=1e-4, atol=1e-6)
    assert losses[0] < losses[1]          # the fused pulls are not in the logged loss
