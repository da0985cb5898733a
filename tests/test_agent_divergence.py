"""The agent bounds the quadratic pulls it applies (FedCurv's like ST-EWC's, and their sum), reports a
round that diverges once with its cause, counts it in its telemetry, and does not retry it on the
same global model."""
import logging
import threading

import numpy as np
import pytest
import torch

from polling import wait_until
from streamfl.agent.config import AgentConfig
from streamfl.agent.core import AgentCore, DivergedError
from streamfl.agent.daemon import AgentDaemon
from streamfl.agent.divergence import DivergenceCause, DivergenceWatch
from streamfl.agent.quadratic import QuadraticPull, bound, largest_curvature
from streamfl.agent.trainer import LocalTrainer
from streamfl.config import build
from streamfl.models import ModelSpec, build_model, model_to_arrays, tensor_spec
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import GlobalModel, Telemetry, Update
from streamfl.methods.fedcurv.payloads import CurvatureTerms
from streamfl.protocol.topics import Topics
from streamfl.sensors import make_source
from streamfl.sensors.window import Window

SPEC = ModelSpec(name="mlp", in_channels=3, window_len=8, num_classes=3, hidden=16)
LR = 0.5
#: FedCurv's peers' curvature as a forged or fleet-sized sum might give it: 1e4 per element.
U_ELEMENT = 1e4


class FakeClock:
    def __init__(self, t_s=100.0):
        self.t_s = t_s

    def __call__(self):
        return self.t_s


def make_core(clock=None, stability=None, **overrides):
    values = dict(device_id="dev-1", model=SPEC, min_buffer=8, local_steps=20, batch_size=8,
                  lr=0.05, round_interval_s=2.0, buffer_capacity=64,
                  sensor={"channels": 3, "window_len": 8, "num_classes": 3})
    if stability is not None:
        values["plugins"] = {"fedcurv": {"stability": stability}}
    values.update(overrides)
    core = AgentCore(build(AgentConfig, values, "test"), clock=clock or FakeClock(), seed=7)
    rng = np.random.default_rng(0)
    for i in range(32):
        x = rng.normal(0, 1, (SPEC.window_len, SPEC.in_channels)).astype(np.float32)
        x[:, i % 3] += 2.0
        core.add_window(Window(x, i % 3))
    return core


def curvature_model(version, spec=SPEC, lambda2=1.0, u=U_ELEMENT, shift=1.0, run_id="", seed=1):
    """A global model whose FedCurv sums pull every weight towards (its value + ``shift``) with
    curvature ``lambda2 * u`` per element."""
    tensors = model_to_arrays(build_model(spec, seed=seed))
    U = {k: np.full_like(v, u) for k, v in tensors.items()}
    V = {k: (U[k] * (v + shift)).astype(np.float32) for k, v in tensors.items()}
    terms = CurvatureTerms(lambda2=lambda2, fisher_samples=4, U=U, V=V)
    return GlobalModel(version=version, arch_id=spec.arch_id, tensors=tensors,
                       hparams={"lr": LR}, extras={CurvatureTerms.KIND: terms}, run_id=run_id)


def plain_model(version, spec=SPEC, scale=None, seed=1):
    tensors = model_to_arrays(build_model(spec, seed=seed))
    if scale is not None:  # weights so large that the forward pass overflows
        tensors = {k: np.full_like(v, scale) for k, v in tensors.items()}
    return GlobalModel(version=version, arch_id=spec.arch_id, tensors=tensors, hparams={"lr": LR})


def divergence_warnings(caplog):
    return [r for r in caplog.records
            if r.name == "streamfl.agent.divergence" and r.levelno >= logging.WARNING]


# ---- the stability cap ----------------------------------------------------------------------------

def test_fedcurv_pull_of_a_fleet_sized_curvature_no_longer_diverges_a_round():
    gm = curvature_model(1)
    # Without a cap this pull's lr * curvature is 5000: SGD multiplies the distance to the target
    # by 4999 each step (diverging above 2). The same pull applied uncapped blows the round up:
    assert LR * 1.0 * U_ELEMENT > 1000
    model = build_model(SPEC, seed=1)
    terms = gm.extras["curvature"]
    uncapped = QuadraticPull({n: (torch.as_tensor(terms.U[n]), torch.as_tensor(terms.V[n]))
                              for n, _ in model.named_parameters()}, stability=float("inf"))
    trainer = LocalTrainer(model, 3)
    trainer.penalties = [uncapped]
    rng = np.random.default_rng(0)
    X = rng.standard_normal((8, 8, 3)).astype(np.float32)
    y = np.arange(8) % 3
    result = trainer.run([(X, y)] * 20, lr=LR)
    assert not np.isfinite(result.mean_loss) or not all(
        torch.isfinite(p).all() for p in model.parameters())

    # The agent caps it at stability / lr (1 / 0.5 = 2 per element) and trains finitely.
    core = make_core()
    assert core.on_global_model(gm)
    pull = core.plugin("fedcurv").before_round(core.model)    # the round's (built once per model and lr)
    update = core.train_round()
    assert np.isfinite(update.loss) and all(np.isfinite(t).all() for t in update.tensors.values())
    assert LR * largest_curvature(core.trainer.applied.values()) == pytest.approx(1.0)
    # Capped, the pull still points at the peers' target B / A (the weights plus 1).
    for name, (A, B) in pull.coefficients.items():
        np.testing.assert_allclose(A.numpy(), 1.0 / LR, rtol=1e-6)
        np.testing.assert_allclose((B / A).numpy(), terms.V[name] / terms.U[name], rtol=1e-5, atol=1e-6)


def test_lifting_the_cap_lets_the_same_pull_diverge_and_the_cause_names_it(caplog):
    core = make_core(stability=100.0)   # lr * curvature up to 100: every step overshoots 99-fold
    core.on_global_model(curvature_model(1))
    with pytest.raises(DivergedError) as err:
        core.train_round()
    cause = err.value.cause
    assert cause.pulls == (("fedcurv", pytest.approx(100.0)),)
    assert cause.applied == pytest.approx(100.0) and cause.lr == LR
    assert cause.model_version == 1 and cause.base_version == 1 and not np.isfinite(cause.loss)
    [warning] = divergence_warnings(caplog)
    text = warning.getMessage()
    assert "fedcurv 100" in text and "lr 0.5" in text and "from v1" in text and "loss nan" in text


def test_the_trainer_caps_the_sum_of_pulls_each_under_its_own_bound():
    model = build_model(SPEC, seed=0)
    lr = 0.1
    pulls = []
    for target in (1.0, 3.0):   # each pull at 0.8 / lr: together 1.6 / lr
        pulls.append(QuadraticPull({n: (torch.full(p.shape, 0.8 / lr), torch.full(p.shape, 0.8 / lr * target))
                                    for n, p in model.named_parameters()}))
    merged, capped = bound(QuadraticPull.merge(pulls, model), lr, 1.0)
    assert capped == sum(p.numel() for p in model.parameters())
    for A, B in merged.values():
        np.testing.assert_allclose(A.numpy(), 1.0 / lr, rtol=1e-6)
        np.testing.assert_allclose((B / A).numpy(), 2.0, rtol=1e-6)   # the merged target kept
    # Where nothing binds, the tensors are the plug-ins' own (no numerics change).
    small = QuadraticPull.merge([QuadraticPull({n: (torch.full(p.shape, 0.5), torch.zeros(p.shape))
                                                for n, p in model.named_parameters()})], model)
    same, capped = bound(small, lr, 1.0)
    assert capped == 0 and all(same[p][0] is small[p][0] and same[p][1] is small[p][1] for p in small)
    # A pull that is not finite is dropped.
    bad = dict(small)
    first = next(iter(bad))
    bad[first] = (bad[first][0], bad[first][1] + float("inf"))
    assert bound(bad, lr, 1.0) == (None, 0)


def test_a_fedcurv_pull_beyond_float32_is_dropped_with_one_warning(caplog):
    core = make_core()
    gm = curvature_model(1, lambda2=1e4, u=1.0)
    terms = gm.extras["curvature"]
    V = {k: np.full_like(v, 3e38) for k, v in terms.V.items()}   # lambda2 * V overflows float32
    core.on_global_model(GlobalModel(version=1, arch_id=SPEC.arch_id, tensors=gm.tensors, hparams=gm.hparams,
                                     extras={"curvature": CurvatureTerms(1e4, 4, terms.U, V)}))
    for _ in range(3):
        update = core.train_round()              # trains without the pull
        assert np.isfinite(update.loss)
    warnings = [r for r in caplog.records if r.name == "streamfl.methods.fedcurv.agent"
                and r.levelno == logging.WARNING and "not finite" in r.getMessage()]
    assert len(warnings) == 1 and "v1" in warnings[0].getMessage()


# ---- a round that diverges --------------------------------------------------------------------

def test_divergence_is_logged_once_and_a_round_that_succeeds_again_is_said(caplog):
    clock = FakeClock()
    core = make_core(clock=clock)
    for version in (1, 2, 3):               # every model diverges (its weights overflow)
        assert core.on_global_model(plain_model(version, scale=3e38))
        assert core.ready(clock.t_s)
        with pytest.raises(DivergedError):
            core.train_round()
        clock.t_s += 2.0
        assert not core.ready(clock.t_s)
    assert len(divergence_warnings(caplog)) == 1
    assert core.stats()["diverged_rounds"] == 3 and "v3" in core.stats()["divergence"]
    core.on_global_model(plain_model(4))
    assert core.ready(clock.t_s)
    update = core.train_round()
    assert update.base_version == 4 and np.isfinite(update.loss)
    again = [r for r in caplog.records if r.name == "streamfl.agent.divergence"
             and "converges again" in r.getMessage()]
    assert len(again) == 1 and "after 3 diverged" in again[0].getMessage()
    assert core.stats()["diverged_rounds"] == 3 and core.stats()["divergence"] == ""
    assert len(divergence_warnings(caplog)) == 1


def test_after_a_divergence_no_round_starts_from_the_same_model_until_the_retry_time():
    clock = FakeClock(t_s=0.0)
    core = make_core(clock=clock, round_interval_s=2.0, diverged_retry_rounds=10)
    core.on_global_model(plain_model(5, scale=3e38))
    with pytest.raises(DivergedError):
        core.train_round()
    for t in (0.0, 2.0, 10.0, 19.9):
        assert not core.ready(t), t                       # the same model: no round
    assert not core.on_global_model(plain_model(5, scale=3e38))   # the retained model again
    assert not core.ready(19.9)
    assert core.ready(20.0)                                # 10 round intervals without a new one
    with pytest.raises(DivergedError):
        core.train_round()
    assert not core.ready(21.0) and not core.ready(39.9)  # the wait starts again
    core.on_global_model(plain_model(6))
    assert core.ready(40.0)                                # a new model: at once
    assert core.train_round().base_version == 6


def test_a_model_of_another_run_with_the_same_version_is_a_new_model():
    core = make_core()
    gm = plain_model(3, scale=3e38)
    core.on_global_model(GlobalModel(3, SPEC.arch_id, gm.tensors, gm.hparams, run_id="run-a"))
    with pytest.raises(DivergedError):
        core.train_round()
    assert not core.ready(100.0)
    core.on_global_model(GlobalModel(3, SPEC.arch_id, plain_model(3).tensors, gm.hparams, run_id="run-b"))
    assert core.ready(100.0)


def test_a_divergence_that_goes_on_is_summarized_at_most_every_log_interval(caplog):
    watch = DivergenceWatch(retry_after_s=5.0, log_every_s=600.0)
    cause = DivergenceCause(round_index=0, loss=float("nan"), lr=0.1, base_version=2, model_version=2)
    watch.diverged(cause)
    assert not watch.allows(("", 2), 0.0)
    t = 0.0
    for k in range(1, 400):                 # a round every 5 s on the same model: 400 rounds
        t += 5.0
        assert watch.allows(("", 2), t)
        watch.diverged(DivergenceCause(k, float("nan"), 0.1, 2, 2))
        watch.allows(("", 2), t)
    messages = [r.getMessage() for r in divergence_warnings(caplog)]
    assert len(messages) == 1 + int(t // 600)          # the start, then one per 10 minutes
    assert all("still diverges" in m for m in messages[1:])
    assert watch.status() == {"diverged_rounds": 400, "divergence": watch.cause.describe()}


# ---- a daemon over mosquitto ------------------------------------------------------------------

DAEMON_SPEC = ModelSpec(name="mlp", hidden=16)   # the sensor defaults: 6 channels, 50 samples, 6 classes


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_daemon_trains_finitely_under_a_retained_fleet_sized_curvature_and_reports_a_divergence(
        mqtt_broker, tmp_path, caplog):
    from streamfl.protocol.transport.base import MqttSettings
    from streamfl.protocol.transport.paho import PahoTransport

    fleet, dev = "div", "dev-1"
    topics = Topics(fleet)
    decoder = Decoder({DAEMON_SPEC.arch_id: tensor_spec(DAEMON_SPEC)})
    got = []
    coord = PahoTransport(MqttSettings(host=mqtt_broker.host, port=mqtt_broker.port,
                                       client_id="coordinator", persistent_session=False))
    coord.on_message = lambda topic, payload: got.append(decoder.try_decode(payload, topic))
    coord.subscribe(topics.all_devices("update"))
    coord.subscribe(topics.all_devices("telemetry"), qos=0)
    coord.connect()
    assert coord.wait_connected(10)
    # U = 1e4 everywhere with lambda2 = 1 at lr 0.5 (lr * curvature 5000 before the agent's cap),
    # V = U times the model's weights: the sums of a fleet whose devices all sit at the model.
    coord.publish(topics.model, encode(curvature_model(1, spec=DAEMON_SPEC, shift=0.0)), qos=1,
                  retain=True)
    cfg = build(AgentConfig, dict(fleet=fleet, device_id=dev, model=DAEMON_SPEC, min_buffer=16,
                                  buffer_capacity=256, round_interval_s=0.1, local_steps=20,
                                  batch_size=8, telemetry_interval_s=0.1, diverged_retry_rounds=1000,
                                  sensor={"windows_per_s": 400.0, "schedule": "all"}), "test")
    transport = PahoTransport(MqttSettings(host=mqtt_broker.host, port=mqtt_broker.port,
                                           client_id=dev, persistent_session=False))
    daemon = AgentDaemon(cfg, transport, make_source(cfg.sensor, dev), tmp_path / "state")
    thread = threading.Thread(target=daemon.run, daemon=True)
    thread.start()

    def updates(version=None):
        return [m for m in list(got) if isinstance(m, Update) and version in (None, m.base_version)]

    def telemetry():
        return [m for m in list(got) if isinstance(m, Telemetry)]

    try:
        wait_until(lambda: len(updates(1)) >= 5, 60, "five updates under the curvature")
        for u in updates(1):
            assert np.isfinite(u.loss) and all(np.isfinite(t).all() for t in u.tensors.values())
            assert "curvature_diagonal" in u.extras
        assert sum(decoder.rejected.values()) == 0
        assert daemon.counters["diverged_rounds"] == 0 and daemon.counters["round_errors"] == 0

        # A model that diverges: reported once, in the telemetry too, and not retried on it.
        coord.publish(topics.model, encode(plain_model(2, spec=DAEMON_SPEC, scale=3e38)), qos=1,
                      retain=True)
        wait_until(lambda: any(m.diverged_rounds == 1 for m in telemetry()), 30, "telemetry of a divergence")
        seen = len(telemetry())
        wait_until(lambda: len(telemetry()) >= seen + 10, 30, "ten more telemetry messages")
        assert daemon.counters["diverged_rounds"] == 1    # ~1 s of 0.1 s rounds: no retry on v2
        report = [m for m in telemetry() if m.diverged_rounds == 1][-1]
        assert "loss nan" in report.divergence and "global model v2" in report.divergence
        assert not updates(2)

        coord.publish(topics.model, encode(plain_model(3, spec=DAEMON_SPEC)), qos=1, retain=True)
        wait_until(lambda: updates(3), 30, "an update from the next model")
        wait_until(lambda: telemetry()[-1].divergence == "", 30, "divergence cleared")
        assert telemetry()[-1].diverged_rounds == 1
    finally:
        daemon.stop()
        thread.join(30)
        coord.close()
    assert not thread.is_alive()
    assert len(divergence_warnings(caplog)) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_the_coordinator_says_once_that_a_device_reports_diverged_rounds(caplog):
    from factories import SPEC, greet
    from streamfl.coordinator.config import CoordinatorConfig
    from streamfl.coordinator.core import CoordinatorCore
    from streamfl.protocol.messages import Telemetry
    core = greet(CoordinatorCore(CoordinatorConfig(model=SPEC)), "pi-0")
    caplog.set_level("WARNING", logger="streamfl.coordinator.core")
    for n in (0, 1, 2, 3):
        core.on_message(Telemetry(device_id="pi-0", time_s=float(n), buffer_fill=1, buffer_capacity=4,
                                  diverged_rounds=n, divergence="fedcurv lr*curvature 1e4" if n else ""),
                        float(n))
    lines = [r.getMessage() for r in caplog.records if "diverged" in r.getMessage()]
    assert len(lines) == 1 and "pi-0" in lines[0] and "fedcurv" in lines[0], lines
