"""AgentCore without I/O: readiness, hyper-parameters from the coordinator, rounds and their Update."""
import logging

import numpy as np
import pytest
import torch

from streamfl.agent.config import AgentConfig
from streamfl.agent.core import AgentCore, NotReadyError
from streamfl.agent.hparams import DEFAULT_HPARAM_LIMITS as HPARAM_RANGES
from streamfl.models import ModelSpec, build_model, model_to_arrays, tensor_spec
from streamfl.protocol.messages import Command, GlobalModel
from streamfl.sensors.window import UNLABELLED, Window

SPEC = ModelSpec(name="mlp", in_channels=3, window_len=8, num_classes=3, hidden=16)


class FakeClock:
    """Seconds that move only when the test says so."""

    def __init__(self, t_s=100.0):
        self.t_s = t_s

    def __call__(self):
        return self.t_s


def make_core(clock=None, **overrides):
    values = dict(device_id="dev-1", model=SPEC, min_buffer=8, local_steps=5, batch_size=8,
                  lr=0.05, round_interval_s=2.0, buffer_capacity=64,
                  sensor={"channels": 3, "window_len": 8, "num_classes": 3})
    values.update(overrides)
    from streamfl.config import build
    cfg = build(AgentConfig, values, "test")
    return AgentCore(cfg, clock=clock or FakeClock(), seed=7)


def separable_windows(n, rng, classes=3):
    """Class c has channel c shifted by +2: a linear model separates them easily."""
    out = []
    for i in range(n):
        label = i % classes
        x = rng.normal(0, 1, (SPEC.window_len, SPEC.in_channels)).astype(np.float32)
        x[:, label] += 2.0
        out.append(Window(x, label))
    return out


def global_model(version, seed=1, spec=SPEC, **hparams):
    return GlobalModel(version=version, arch_id=spec.arch_id,
                       tensors=model_to_arrays(build_model(spec, seed=seed)), hparams=hparams)


def fill(core, n=32, seed=0):
    for w in separable_windows(n, np.random.default_rng(seed)):
        core.add_window(w)


def test_ready_needs_min_buffer_and_a_global_model():
    core = make_core()
    assert not core.ready(0.0)
    fill(core, n=7)
    core.on_global_model(global_model(1))
    assert not core.ready(0.0)  # 7 < min_buffer 8
    core.add_window(Window(np.zeros((8, 3)), UNLABELLED))
    assert not core.ready(0.0)  # unlabelled windows do not count
    fill(core, n=1)
    assert core.ready(0.0)
    with pytest.raises(NotReadyError):
        make_core().train_round()


def test_skip_command_pauses_for_n_round_intervals_and_train_resumes():
    core = make_core()
    fill(core)
    core.on_global_model(global_model(1))
    core.on_command(Command("skip", {"rounds": 2}))
    assert not core.ready(10.0)  # the skip starts now: 2 rounds * 2 s
    assert not core.ready(13.9)
    assert core.ready(14.0)
    core.on_command(Command("skip", {"rounds": 5}))
    assert not core.ready(20.0)
    assert not core.take_train_request()
    core.on_command(Command("train"))
    assert core.ready(20.0)
    assert core.take_train_request() and not core.take_train_request()


def test_hparams_from_global_model_are_applied_and_clamped(caplog):
    core = make_core()
    fill(core)
    core.on_global_model(global_model(1, lr=50.0, batch_size=4, local_steps=3, dropout=0.25,
                                      unknown_knob=1.0))
    assert core.hparams["lr"] == HPARAM_RANGES["lr"][1]
    assert core.hparams["batch_size"] == 4 and isinstance(core.hparams["batch_size"], int)
    assert "clamped" in caplog.text
    update = core.train_round()
    assert update.num_samples == 3 * 4
    assert core.model.dropout.p == 0.25
    core.on_command(Command("override", {"batch_size": 0, "dropout": "high", "local_steps": 2.6}))
    assert core.hparams["batch_size"] == 1  # clamped to the lower bound
    assert core.hparams["dropout"] == 0.25  # non-numeric ignored
    assert core.hparams["local_steps"] == 3
    core.on_command(Command("reboot"))  # unknown kinds are logged and ignored
    assert "unsupported command 'reboot'" in caplog.text


def test_stale_and_duplicate_global_models_are_ignored():
    core = make_core()
    assert core.on_global_model(global_model(3, lr=0.02))
    assert not core.on_global_model(global_model(2, lr=0.5))
    assert not core.on_global_model(global_model(3, lr=0.5))
    assert core.global_model.version == 3 and core.hparams["lr"] == 0.02
    assert core.on_global_model(global_model(4))


def test_global_model_of_another_architecture_is_rejected(caplog):
    core = make_core()
    other = ModelSpec(name="mlp", in_channels=3, window_len=8, num_classes=3, hidden=32)
    with caplog.at_level(logging.WARNING):
        assert not core.on_global_model(global_model(5, spec=other))
    assert core.global_model is None and core.rejected_models == 1
    assert other.arch_id in caplog.text


def test_train_round_returns_a_complete_update():
    clock = FakeClock(123.0)
    core = make_core(clock=clock)
    fill(core, n=30)
    core.on_global_model(global_model(4))
    update = core.train_round()
    assert update.device_id == "dev-1"
    assert update.arch_id == SPEC.arch_id
    assert update.base_version == 4
    assert update.round_index == 0 and core.rounds == 1
    assert update.created_s == 123.0
    assert len(update.update_id) == 32 and int(update.update_id, 16) >= 0
    spec = tensor_spec(SPEC)
    assert set(update.tensors) == set(spec)
    for name, (shape, dtype) in spec.items():
        assert update.tensors[name].shape == shape and update.tensors[name].dtype == np.float32
    assert update.num_samples == 5 * 8
    assert sum(update.class_counts.values()) == update.num_samples
    assert set(update.class_counts) <= {0, 1, 2}
    assert np.isfinite(update.loss) and update.loss > 0
    assert update.seconds_per_sample > 0
    # The tensors are the trained local model, not the global one.
    assert any(not np.allclose(update.tensors[k], core.global_model.tensors[k]) for k in spec)
    second = core.train_round()
    assert second.round_index == 1 and second.update_id != update.update_id


def test_round_starts_from_newer_global_else_continues_locally():
    core = make_core(lr=1e-6)  # learning barely moves the weights: the start point shows through
    fill(core)
    g1, g2 = global_model(1, seed=1), global_model(2, seed=2)
    core.on_global_model(g1)
    first = core.train_round()
    assert all(np.allclose(first.tensors[k], g1.tensors[k], atol=1e-4) for k in g1.tensors)
    plan = core.begin_round()
    assert plan.start_tensors is None and plan.base_version == 1  # no newer global: keep local
    core.finish_round(plan)
    core.on_global_model(g2)
    plan = core.begin_round()
    assert plan.base_version == 2 and plan.start_tensors is g2.tensors
    third = core.finish_round(plan)
    assert third.base_version == 2
    assert all(np.allclose(third.tensors[k], g2.tensors[k], atol=1e-4) for k in g2.tensors)


def test_loss_decreases_over_rounds_on_separable_data():
    core = make_core(lr=0.1, local_steps=10)
    fill(core, n=60)
    core.on_global_model(global_model(1))
    losses = [core.train_round().loss for _ in range(6)]
    assert losses[-1] < 0.5 * losses[0], losses
    with torch.no_grad():
        X = torch.from_numpy(core.buffer.X[:len(core.buffer)])
        pred = core.model.eval()(X).argmax(1).numpy()
    assert (pred == core.buffer.y[:len(core.buffer)]).mean() > 0.9


def test_checkpoint_restore_continues_local_model():
    core = make_core()
    fill(core)
    core.on_global_model(global_model(3))
    core.train_round()
    arrays, meta = core.checkpoint()
    assert meta == {"global_version": 3, "round_index": 1, "device_id": "dev-1",
                    "arch_id": SPEC.arch_id, "run_id": "", "command_seq": 0}
    fresh = make_core()
    fresh.restore(arrays, meta)
    fill(fresh)
    fresh.on_global_model(global_model(3))  # the same retained version arrives after a restart
    plan = fresh.begin_round()
    assert plan.start_tensors is None and plan.round_index == 1
    fresh.on_global_model(global_model(4))
    assert fresh.begin_round().start_tensors is not None


def test_hello_describes_the_device():
    core = make_core(board="raspberry-pi-5")
    hello = core.hello()
    assert hello.device_id == "dev-1" and hello.board == "raspberry-pi-5"
    assert hello.arch_id == SPEC.arch_id and hello.buffer_capacity == 64


def test_torch_threads_come_from_config():
    before = torch.get_num_threads()
    try:
        make_core(torch_threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_diverged_round_raises_and_next_round_restarts_from_global():
    from streamfl.agent.core import DivergedError
    core = make_core()
    fill(core)
    good = global_model(2)
    huge = GlobalModel(version=1, arch_id=SPEC.arch_id,
                       tensors={k: np.full_like(v, 3e38) for k, v in good.tensors.items()})
    core.on_global_model(huge)
    with pytest.raises(DivergedError):
        core.train_round()
    assert core.base_version == -1
    core.on_global_model(good)
    update = core.train_round()
    assert update.base_version == 2 and np.isfinite(update.loss)


def test_round_stops_at_the_next_step_when_asked():
    from streamfl.agent.core import RoundInterrupted
    core = make_core(local_steps=50)
    fill(core)
    core.on_global_model(global_model(1))
    polls = []

    def should_stop():
        polls.append(1)
        return len(polls) > 3

    with pytest.raises(RoundInterrupted, match="after 3 of 50 steps"):
        core.finish_round(core.begin_round(), should_stop=should_stop)
    assert core.rounds == 0


def test_every_plugin_is_asked_whether_to_train_even_after_one_declines():
    """A resting CLP plug-in (first in calling order) must not hide the round opportunity from
    SFedPO, whose availability q_n counts every time a round could start."""
    from streamfl.methods.clp.payloads import ClpState
    from streamfl.methods.sfedpo.payloads import SfedpoTerms
    core = make_core()
    fill(core)
    gm = global_model(1)
    gm.extras = {"clp": ClpState(1, None, None, False, 0, 0, False), "sfedpo": SfedpoTerms()}  # both run
    core.on_global_model(gm)
    clp, sfedpo = core.plugin("clp"), core.plugin("sfedpo")
    clp._rest_until_s = 1e9                               # CLP rests for the whole test
    assert core.ready(0.0) and not core.round_opportunity(0.0)
    assert not core.round_opportunity(50.0)
    assert sfedpo.availability(10.0) == pytest.approx((0 + 1.0) / (5.0 + 1.0 + 2.0))


def test_ready_is_a_query_the_methods_are_told_of_an_opportunity_apart():
    """Polling ``ready`` (the daemon does, five times a second) tells no plug-in anything; only
    ``round_opportunity``, once per round a runtime would start, reaches them."""
    from streamfl.methods.clp.payloads import ClpState
    from streamfl.methods.sfedpo.payloads import SfedpoTerms
    core = make_core()
    fill(core)
    gm = global_model(1)
    gm.extras = {"clp": ClpState(1, None, None, False, 0, 0, False), "sfedpo": SfedpoTerms()}
    core.on_global_model(gm)
    told = []
    for plugin in core.active_plugins:
        plugin.on_round_opportunity = lambda now, name=plugin.name: told.append(name) or True
    assert all(core.ready(t) for t in (0.0, 0.2, 0.4)) and told == []
    assert core.round_opportunity(0.6) and sorted(told) == ["clp", "sfedpo"]
