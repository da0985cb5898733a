"""FedCurv through the cores: the Fisher diagonal, the coordinator's U/V sums (and their survival of a
restart), the device's penalty."""
import json
import logging
import zlib

import numpy as np
import pytest
import torch

from factories import UNBOUNDED_ADMISSION, greet, make_hello, make_update
from streamfl.agent.config import AgentConfig
from streamfl.agent.core import AgentCore
from streamfl.methods.fedcurv.agent import FedCurvAgentPlugin
from streamfl.config import build
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.core import CoordinatorCore
from streamfl.coordinator.persistence import Persister, StateStore
from streamfl.methods.fedcurv.coordinator import CAPPED_WARN_INTERVAL_S, CurvatureSums
from streamfl.models import ModelSpec, build_model, tensor_spec
from streamfl.models.fisher import fisher_diagonal
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import GlobalModel
from streamfl.methods.fedcurv.payloads import CurvatureDiagonal, CurvatureTerms
from streamfl.sensors.window import Window

SPEC = {"name": "mlp", "in_channels": 3, "window_len": 8, "num_classes": 3, "hidden": 8}


def _windows(n=24, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 8, 3)).astype(np.float32)
    y = np.arange(n) % 3
    X[np.arange(n), :, y] += 2.0
    return X, y


def test_fisher_diagonal_is_the_mean_of_squared_per_sample_gradients():
    model = build_model(ModelSpec(**SPEC), seed=3)
    X, y = _windows(6)
    diag = fisher_diagonal(model, X, y)
    expected = {n: np.zeros(p.shape) for n, p in model.named_parameters()}
    for i in range(len(y)):
        model.zero_grad()
        torch.log_softmax(model(torch.from_numpy(X[i:i + 1])), dim=1)[0, int(y[i])].backward()
        for n, p in model.named_parameters():
            expected[n] += p.grad.double().numpy() ** 2 / len(y)
    model.zero_grad()
    assert set(diag) == set(model.state_dict())
    for n in expected:
        np.testing.assert_allclose(diag[n], expected[n], rtol=1e-5, atol=1e-9)
        assert diag[n].dtype == np.float32


def test_fisher_diagonal_subsamples_and_checks_labels():
    model = build_model(ModelSpec(**SPEC), seed=3)
    X, y = _windows(10)
    g = torch.Generator().manual_seed(1)
    a = fisher_diagonal(model, X, y, num_samples=4, generator=g)
    b = fisher_diagonal(model, X, y, num_samples=4, generator=torch.Generator().manual_seed(1))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError):
        fisher_diagonal(model, X, y[:3])


def _update(device, tensors, fisher, version=0):
    return make_update(tensors, device_id=device, base_version=version, tensors=tensors,
                       extras={"curvature_diagonal": CurvatureDiagonal(fisher)} if fisher else {})


def test_sums_keep_each_devices_latest_contribution_only():
    sums = CurvatureSums()
    rng = np.random.default_rng(0)
    t = {d: [{"w": rng.standard_normal(4).astype(np.float32)} for _ in range(3)] for d in "abc"}
    f = {d: [{"w": rng.random(4).astype(np.float32)} for _ in range(3)] for d in "abc"}
    for r in range(3):
        for d in "abc":
            assert sums.on_update(_update(d, t[d][r], f[d][r], r))
    U, V = sums.sums()
    np.testing.assert_allclose(U["w"], sum(f[d][2]["w"] for d in "abc"), rtol=1e-6)
    np.testing.assert_allclose(V["w"], sum(f[d][2]["w"] * t[d][2]["w"] for d in "abc"),
                               rtol=1e-5, atol=1e-6)
    sums.forget("a")
    np.testing.assert_allclose(sums.sums()[0]["w"], f["b"][2]["w"] + f["c"][2]["w"], rtol=1e-6)
    assert not sums.on_update(_update("d", t["a"][0], {}))          # no Fisher: nothing folded in
    assert CurvatureSums().sums() == (None, None)                   # nobody reported yet


def test_a_capped_diagonal_warns_at_most_once_a_minute_with_the_count_held_back(caplog):
    now = [0.0]
    sums = CurvatureSums(max_peer_multiple=4.0, clock=lambda: now[0])
    w = {"w": np.ones(4, np.float32)}
    for d in "abc":
        sums.on_update(_update(d, w, {"w": np.full(4, 0.1, np.float32)}))
    with caplog.at_level(logging.DEBUG, logger="streamfl.methods.fedcurv.coordinator"):
        for r in range(50):  # its old diagonal is re-weighed on every update: capped each time
            sums.on_update(_update("big", w, {"w": np.full(4, 100.0, np.float32)} if r == 0 else {}))
            now[0] += 1.0
        sums.on_update(_update("big", w, {}))  # 50 s on: still held back
        now[0] = CAPPED_WARN_INTERVAL_S + 1.0
        sums.on_update(_update("big", w, {}))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and all("'s Fisher diagonal" in m for m in warnings)
    assert "more capped Fisher diagonals" not in warnings[0]
    assert "(50 more capped Fisher diagonals since the last warning)" in warnings[1]
    assert sums.scale("big") < 1.0


def test_penalty_gradient_is_lambda2_times_peers_pull():
    """d/dtheta = lambda2 ((U - F_k) theta - (V - F_k theta_k)), methods/fedcurv/README.md."""
    model = build_model(ModelSpec(**SPEC), seed=0)
    names = [n for n, _ in model.named_parameters()]
    rng = np.random.default_rng(1)
    U = {n: rng.random(p.shape).astype(np.float32) + 1.0 for n, p in model.named_parameters()}
    V = {n: rng.standard_normal(p.shape).astype(np.float32) for n, p in model.named_parameters()}
    client = FedCurvAgentPlugin()
    own_f = {n: (rng.random(U[n].shape) * 0.5).astype(np.float32) for n in names}
    own_t = {n: rng.standard_normal(U[n].shape).astype(np.float32) for n in names}
    client._own = (own_f, own_t)
    def terms(**kw):
        return GlobalModel(version=1, arch_id="x", tensors={}, extras={"curvature": CurvatureTerms(**kw)})

    client.on_model_received(terms(lambda2=0.7, fisher_samples=4, U=U, V=V), {})
    penalty = client.before_round(model)
    model.zero_grad()
    penalty(model).backward()
    for n, p in model.named_parameters():
        theta = p.detach().double().numpy()
        want = 0.7 * ((U[n] - own_f[n]) * theta - (V[n] - own_f[n] * own_t[n]))
        np.testing.assert_allclose(p.grad.double().numpy(), want, rtol=1e-4, atol=1e-5)
    assert float(penalty(model).detach()) >= 0.0
    client.on_model_received(terms(lambda2=0.7, fisher_samples=4), {})
    assert client.before_round(model) is None                         # no peer sums yet
    client.on_model_received(terms(lambda2=0.0, fisher_samples=4, U=U, V=V), {})
    assert client.before_round(model) is None                         # FedCurv off
    # A coordinator without FedCurv leaves the plug-in dormant (the agent contract suite).


def _agent(device):
    cfg = build(AgentConfig, {"device_id": device, "model": SPEC, "min_buffer": 8, "local_steps": 3,
                              "batch_size": 8, "plugins": {"clp": {"fisher_samples": 0}},
                              "sensor": {"channels": 3, "window_len": 8, "num_classes": 3}}, "test")
    agent = AgentCore(cfg, clock=lambda: 0.0, seed=zlib.crc32(device.encode()) % 1000)  # not hash(): per process
    X, y = _windows(24, seed=len(device))
    for x, label in zip(X, y):
        agent.add_window(Window(x, int(label)))
    return agent


def test_fleet_through_the_codec_builds_sums_and_devices_train_with_them():
    coord = greet(CoordinatorCore(build(CoordinatorConfig, {"model": SPEC, "plugins": {"fedcurv": {
        "penalty_strength": 1.5, "fisher_samples": 6}}}, "test")), "d1", "d2")
    dec = Decoder({coord.arch_id: tensor_spec(ModelSpec(**SPEC))})
    agents = [_agent("d1"), _agent("d2")]
    sent = {}
    for rnd in range(2):
        for agent in agents:
            gm = dec.decode(encode(coord.global_model()))
            assert gm.extras["curvature"].lambda2 == 1.5
            agent.on_global_model(gm)
            penalized = bool(agent.trainer.penalties) if rnd else None
            update = dec.decode(encode(agent.train_round()))
            assert "curvature_diagonal" in update.extras
            assert set(update.extras["curvature_diagonal"].F) == set(update.tensors)
            sent[agent.device_id] = update
            coord.on_update(update, 1.0)
        if rnd:
            assert penalized  # the second round trains against the peers' sums
    gm = coord.global_model()
    # Each device counts with its peer-cap factor (1 unless its Fisher total passes
    # max_peer_multiple x the other's: two devices' totals can differ that much).
    sums = next(p for p in coord.plugins if p.name == "fedcurv").sums
    for name in gm.tensors:
        u = sum(sums.scale(d) * np.asarray(sent[d].extras["curvature_diagonal"].F[name], np.float64)
                for d in sent)
        np.testing.assert_allclose(gm.extras["curvature"].U[name], u, rtol=1e-5, atol=1e-12)


def test_a_diagonal_outside_its_bounds_is_left_out_and_the_update_still_counts(monkeypatch, caplog):
    # An honest board whose training blew up (lr 0.4 in the AdaCLP regime) measured Fisher
    # elements of 1.4e5 against the declared 1e4: the coordinator's decoder refuses a whole update
    # that carries one, so the agent sends the update without its diagonal.
    import streamfl.methods.fedcurv.agent as fedcurv_agent
    real = fedcurv_agent.fisher_diagonal
    monkeypatch.setattr(fedcurv_agent, "fisher_diagonal",
                        lambda *a, **k: {n: f + 1.4e5 for n, f in real(*a, **k).items()})
    coord = greet(CoordinatorCore(build(CoordinatorConfig, {"model": SPEC, "plugins": {"fedcurv": {
        "fisher_samples": 6}}, "admission": UNBOUNDED_ADMISSION}, "test")), "d1")
    dec = Decoder({coord.arch_id: tensor_spec(ModelSpec(**SPEC))})
    agent = _agent("d1")
    with caplog.at_level(logging.WARNING, logger="streamfl.agent.plugin_set"):
        for _ in range(3):
            agent.on_global_model(dec.decode(encode(coord.global_model())))
            update = dec.decode(encode(agent.train_round()))  # the codec takes it whole
            assert "curvature_diagonal" not in update.extras
            assert coord.on_update(update, 1.0).update.aggregated
    assert agent.methods.out_of_bounds == {"curvature_diagonal": 3}
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and r.name == "streamfl.agent.plugin_set"]
    assert len(warnings) == 1 and "curvature_diagonal left out of the message" in warnings[0]
    assert "outside [0.0, 10000.0]" in warnings[0]
    assert coord.version == 3 and len(coord.plugin("fedcurv").sums) == 0  # nothing folded in


def test_fedcurv_off_sends_no_diagonal():
    coord = CoordinatorCore(build(CoordinatorConfig, {"model": SPEC}, "test"))
    agent = _agent("d1")
    agent.on_global_model(coord.global_model())
    update = agent.train_round()
    assert "curvature_diagonal" not in update.extras and agent.trainer.penalties == []
    assert "curvature" not in coord.global_model().extras


def _fedcurv_core(tensors=None):
    return CoordinatorCore(build(CoordinatorConfig, {"model": SPEC, "plugins": {"fedcurv": {}},
                                                     "admission": UNBOUNDED_ADMISSION}, "test"),
                           tensors=tensors)


def _curv_update(core, device, tensors, fisher):
    return make_update(ModelSpec(**SPEC), device_id=device, base_version=core.version,
                       tensors=tensors, extras={"curvature_diagonal": CurvatureDiagonal(fisher)})


def _fleet_with_sums(n_devices=3, rounds=2):
    """A coordinator whose FedCurv sums hold ``n_devices`` devices' contributions."""
    core = _fedcurv_core()
    for i in range(n_devices):
        core.on_message(make_hello("d%d" % i, ModelSpec(**SPEC)), 0.0)
    rng = np.random.default_rng(4)
    for r in range(rounds):
        for i in range(n_devices):
            t = {k: rng.standard_normal(s).astype(np.float32)
                 for k, (s, _) in tensor_spec(ModelSpec(**SPEC)).items()}
            f = {k: rng.random(a.shape).astype(np.float32) for k, a in t.items()}
            core.on_message(_curv_update(core, "d%d" % i, t, f), float(r))
    assert len(core.plugin("fedcurv").sums) == n_devices
    return core


def _restart(state_dir):
    tensors, state = StateStore(state_dir).load(ModelSpec(**SPEC))
    core = _fedcurv_core(tensors)
    core.restore(tensors, state, now=50.0)
    return core


def test_sums_survive_a_coordinator_restart(tmp_path):
    core = _fleet_with_sums()
    Persister(StateStore(tmp_path)).flush(core)
    assert (tmp_path / "plugins.safetensors").exists()
    assert "plugin_tensors" not in json.loads((tmp_path / "state.json").read_text())
    again = _restart(tmp_path)
    before, after = core.plugin("fedcurv").sums, again.plugin("fedcurv").sums
    assert len(after) == len(before) == 3
    for b, a in zip(before.sums(), after.sums()):
        for k in b:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-7)
    # The next update of a device replaces its restored contribution, as before the restart.
    update = _curv_update(again, "d1", {k: np.zeros_like(v) for k, v in core.model.items()},
                          {k: np.ones_like(v) for k, v in core.model.items()})
    before.on_update(update)
    after.on_update(update)
    for k, u in before.sums()[0].items():
        np.testing.assert_allclose(after.sums()[0][k], u, rtol=1e-6, atol=1e-7)


def test_saved_sums_that_are_not_finite_or_torn_are_refused_whole(tmp_path, caplog):
    core = _fleet_with_sums(n_devices=2)
    arrays = dict(core.plugin("fedcurv").sums.arrays())
    key = next(k for k in arrays if "/F/" in k)
    for bad in ({**arrays, key: np.full_like(arrays[key], np.nan)},      # not finite
                {**arrays, key: -np.abs(arrays[key]) - 1.0},              # a negative Fisher value
                {k: v for k, v in arrays.items() if k != key},            # F without its pair
                {**arrays, "zz/F/w": arrays[key]}):                       # a key that is no device
        sums = CurvatureSums()
        with pytest.raises(ValueError):
            sums.load(bad)
        assert len(sums) == 0 and sums.sums() == (None, None)
    Persister(StateStore(tmp_path)).flush(core)
    (tmp_path / "plugins.safetensors").write_bytes(b"not a checkpoint")
    again = _restart(tmp_path)  # the model and the rest of the state still load
    assert again.version == core.version and len(again.plugin("fedcurv").sums) == 0
    assert "plugins.safetensors" in caplog.text


def test_the_arrays_are_rewritten_at_most_every_interval(tmp_path):
    clock = [0.0]
    persister = Persister(StateStore(tmp_path), plugin_interval_s=30.0, clock=lambda: clock[0])
    core = _fleet_with_sums(n_devices=1)
    assert persister.save(core.model, core.state())
    first = (tmp_path / "plugins.safetensors").stat().st_mtime_ns
    core.on_message(_curv_update(core, "d0", dict(core.model),
                                 {k: np.ones_like(v) for k, v in core.model.items()}), 10.0)
    clock[0] = 10.0
    assert persister.save(core.model, core.state())  # the model is saved; the arrays wait
    assert (tmp_path / "plugins.safetensors").stat().st_mtime_ns == first
    assert _restart(tmp_path).plugin("fedcurv").sums.sums()[0]["head.bias"].max() < 1.0  # older
    clock[0] = 31.0
    assert persister.save(core.model, core.state())
    restored = _restart(tmp_path).plugin("fedcurv").sums
    assert len(restored) == 1
    np.testing.assert_array_equal(restored.sums()[0]["head.bias"], 1.0)  # d0's newest F


def test_devices_estimate_their_diagonal_every_n_rounds_and_the_sums_follow_their_models():
    """fisher_every_rounds = 3: a diagonal on rounds 1, 4, ...; in between the coordinator keeps the
    device's last F_k with its newest model, so V's F_k * theta_k moves with the device."""
    coord = greet(CoordinatorCore(build(CoordinatorConfig, {"model": SPEC, "plugins": {"fedcurv": {
        "fisher_samples": 6, "fisher_every_rounds": 3}}, "admission": UNBOUNDED_ADMISSION}, "test")), "d1")
    dec = Decoder({coord.arch_id: tensor_spec(ModelSpec(**SPEC))})
    agent = _agent("d1")
    sent = []
    for _ in range(5):
        gm = dec.decode(encode(coord.global_model()))
        assert gm.extras["curvature"].fisher_every == 3
        agent.on_global_model(gm)
        update = dec.decode(encode(agent.train_round()))
        sent.append("curvature_diagonal" in update.extras)
        coord.on_update(update, 1.0)
        f, fw = coord.plugin("fedcurv").sums.contribution("d1")
        for k in f:
            np.testing.assert_allclose(fw[k], f[k] * update.tensors[k], rtol=1e-6, atol=1e-9)
    assert sent == [True, False, False, True, False]
    plugin = next(p for p in agent.plugins if p.name == "fedcurv")
    for k, theta in plugin._own[1].items():       # the device subtracts its newest model too
        np.testing.assert_array_equal(theta, update.tensors[k])
