"""Without keys no forged model pins an agent past the real coordinator's next model: an unnamed
model never replaces a named run's, a named run always resyncs from an unnamed one (whatever
version it claimed), a round trained from the run left is dropped, and no checkpoint carries the
forged version on. Two coordinators alternating on one fleet are reported once."""
import logging

import numpy as np
import pytest

from factories import make_global_model
from streamfl.agent.config import AgentConfig
from streamfl.agent.core import AgentCore, RoundInterrupted
from streamfl.config import build
from streamfl.errors import ConfigError
from streamfl.models import ModelSpec
from streamfl.sensors.window import Window

SPEC = ModelSpec(name="mlp", in_channels=3, window_len=8, num_classes=3, hidden=16)
HUGE = 10 ** 12
GATE_LOG = "streamfl.agent.model_gate"


class Clock:
    """The core's clock, moved by the test."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def make_agent(clock=None, **overrides):
    values = dict(device_id="pi-01", model=SPEC, min_buffer=8, local_steps=2, batch_size=4,
                  buffer_capacity=32, sensor={"channels": 3, "window_len": 8, "num_classes": 3})
    values.update(overrides)
    agent = AgentCore(build(AgentConfig, values, "test"), clock=clock or Clock(), seed=1)
    rng = np.random.default_rng(0)
    for i in range(16):
        agent.add_window(Window(rng.standard_normal((8, 3)).astype(np.float32), i % 3))
    return agent


def gm(version, run_id, value=0.0, **hparams):
    return make_global_model(SPEC, version, value, run_id=run_id, hparams=hparams)


def forged():
    """The measured attack: an unnamed model at 10^12 driving the board as hard as it allows."""
    return gm(HUGE, "", 9.0, lr=1.0, batch_size=1024, local_steps=10000)


def warnings_of(caplog, text):
    return [r for r in caplog.records if r.name == GATE_LOG and r.levelno == logging.WARNING
            and text in r.getMessage()]


def test_an_unnamed_model_never_replaces_a_named_run_and_is_reported_once(caplog):
    agent = make_agent()
    assert agent.on_global_model(gm(10, "real"))
    agent.train_round()
    with caplog.at_level(logging.DEBUG, logger=GATE_LOG):
        assert not agent.on_global_model(forged())
        assert not agent.on_global_model(gm(HUGE + 1, ""))
    assert agent.gate.unnamed_models == 2 and agent.stats()["unnamed_models"] == 2
    assert len(warnings_of(caplog, "without a run identity")) == 1
    assert agent.global_model.version == 10 and agent.gate.run_id == "real"
    assert agent.hparams["lr"] == 0.01 and agent.hparams["local_steps"] == 2   # not driven
    assert agent.begin_round().base_version == 10
    assert agent.on_global_model(gm(11, "real"))                        # the run goes on


def test_the_real_coordinators_next_model_ends_an_unnamed_pin_whatever_its_version():
    agent = make_agent()
    assert agent.on_global_model(forged())                 # a fresh board: nothing to compare with
    assert agent.hparams["lr"] == 0.5 and agent.hparams["local_steps"] == 500    # its limits
    agent.apply_hparams({"local_steps": 2})
    assert agent.train_round().base_version == HUGE
    assert agent.on_global_model(gm(11, "real", lr=0.01, local_steps=2))          # a resync
    assert agent.gate.run_id == "real" and agent.gate.resyncs == 1 and agent.base_version == -1
    assert agent.hparams["lr"] == 0.01
    plan = agent.begin_round()
    assert plan.base_version == 11 and plan.start_tensors is not None   # from the real model
    assert agent.finish_round(plan).base_version == 11
    assert agent.checkpoint()[1]["global_version"] == 11
    assert not agent.on_global_model(forged())             # and the forgery cannot come back


def test_a_checkpoint_taken_while_pinned_does_not_carry_the_forged_version_on():
    agent = make_agent()
    agent.on_global_model(forged())
    agent.apply_hparams({"local_steps": 2})
    agent.train_round()
    arrays, meta = agent.checkpoint()
    assert meta["global_version"] == HUGE and meta["run_id"] == ""
    restarted = make_agent()
    restarted.restore(arrays, meta)
    assert restarted.on_global_model(gm(0, "fresh-run"))   # a coordinator on an empty state folder
    assert restarted.base_version == -1 and restarted.begin_round().base_version == 0
    restarted.train_round()
    assert restarted.checkpoint()[1]["global_version"] == 0
    assert restarted.checkpoint()[1]["run_id"] == "fresh-run"


@pytest.mark.parametrize("run_id", [None, "real"], ids=["checkpoint-without-run", "same-run"])
def test_a_restored_base_ahead_of_the_followed_model_is_dropped(run_id):
    """A checkpoint from before run ids, or of a forgery that copied the real run's id: the agent
    follows the real model and starts its next round from it, not from the local model."""
    agent = make_agent()
    arrays, meta = agent.checkpoint()
    meta = dict(meta, global_version=HUGE, round_index=7)
    if run_id is None:
        meta.pop("run_id")
    else:
        meta["run_id"] = run_id
    agent.restore(arrays, meta)
    assert agent.base_version == HUGE
    assert agent.on_global_model(gm(12, "real"))
    assert agent.base_version == -1
    plan = agent.begin_round()
    assert plan.base_version == 12 and plan.start_tensors is not None
    assert agent.finish_round(plan).base_version == 12


def test_what_stays_open_without_keys_a_forgery_that_copies_the_run_identity():
    """README, "Trust": followed until the run's versions pass it or a new run starts; a board
    restarted after the real coordinator published again is back on its model."""
    agent = make_agent()
    assert agent.on_global_model(gm(10, "real"))
    assert agent.on_global_model(gm(HUGE, "real", 9.0, lr=1.0))     # "newer" within the run
    assert not agent.on_global_model(gm(11, "real"))                # the real next model: stale
    agent.train_round()
    arrays, meta = agent.checkpoint()
    assert agent.on_global_model(gm(0, "new-run"))                  # a new run ends it
    restarted = make_agent()
    restarted.restore(arrays, meta)
    assert restarted.on_global_model(gm(12, "real"))                # the retained real model
    assert restarted.begin_round().base_version == 12


def test_a_round_training_from_the_run_left_is_dropped_not_sent():
    agent = make_agent()
    agent.on_global_model(forged())
    agent.apply_hparams({"local_steps": 50})
    plan = agent.begin_round()
    assert plan.base_version == HUGE
    agent.on_global_model(gm(11, "real"))                   # arrives while the round trains
    with pytest.raises(RoundInterrupted, match="run the agent left"):
        agent.finish_round(plan)
    assert agent.base_version == -1 and agent.last_update is None
    assert agent.begin_round().base_version == 11


def test_accept_unnamed_runs_makes_an_unnamed_model_a_resync_both_ways():
    agent = make_agent(accept_unnamed_runs=True)
    assert agent.on_global_model(gm(10, "real"))
    assert agent.on_global_model(gm(HUGE, ""))              # followed, as another run
    assert agent.gate.run_id == "" and agent.base_version == -1
    assert agent.on_global_model(gm(11, "real"))            # and the real run takes it back
    assert agent.gate.run_id == "real" and agent.gate.resyncs == 2 and agent.gate.unnamed_models == 0


def test_the_simulators_unnamed_run_keeps_plain_version_order():
    agent = make_agent()
    assert agent.on_global_model(gm(3, "")) and agent.on_global_model(gm(4, ""))
    assert not agent.on_global_model(gm(2, ""))
    assert agent.gate.resyncs == 0 and agent.gate.unnamed_models == 0


def test_two_coordinators_alternating_are_reported_once_naming_both_runs(caplog):
    clock = Clock()
    agent = make_agent(clock)
    agent.on_global_model(gm(0, "run-a"))
    with caplog.at_level(logging.DEBUG, logger=GATE_LOG):
        for i in range(1, 21):                               # a flip every 2 s, 40 s long
            clock.now = 2.0 * i
            assert agent.on_global_model(gm(i, "run-b" if i % 2 else "run-a"))
    two = warnings_of(caplog, "two coordinators seem to publish on this fleet")
    assert len(two) == 1 and "run-a" in two[0].getMessage() and "run-b" in two[0].getMessage()
    assert len(warnings_of(caplog, "run changed")) == 1      # only the first flip, before the return
    assert agent.gate.resyncs == 20 and agent.gate.run_alternations == 19
    assert agent.stats()["run_alternations"] == 19

    caplog.clear()
    clock.now += 1000.0                                      # quiet for longer than the window
    with caplog.at_level(logging.DEBUG, logger=GATE_LOG):
        agent.on_global_model(gm(100, "run-b"))
        clock.now += 1.0
        agent.on_global_model(gm(101, "run-a"))
    assert len(warnings_of(caplog, "run changed")) == 1      # a new episode: said again, once
    assert len(warnings_of(caplog, "two coordinators")) == 1


def test_a_coordinator_reset_is_a_run_change_not_an_alternation(caplog):
    clock = Clock()
    agent = make_agent(clock)
    agent.on_global_model(gm(50, "run-a"))
    with caplog.at_level(logging.DEBUG, logger=GATE_LOG):
        for k, run in enumerate(("run-b", "run-c", "run-d")):   # three resets, never back
            clock.now = 10.0 * (k + 1)
            agent.on_global_model(gm(0, run))
    assert len(warnings_of(caplog, "run changed")) == 3
    assert not warnings_of(caplog, "two coordinators") and agent.gate.run_alternations == 0


def test_a_zero_alternation_window_reports_every_change(caplog):
    clock = Clock()
    agent = make_agent(clock, run_alternation_window_s=0.0)
    agent.on_global_model(gm(0, "run-a"))
    with caplog.at_level(logging.DEBUG, logger=GATE_LOG):
        for i in range(1, 5):
            agent.on_global_model(gm(i, "run-b" if i % 2 else "run-a"))
    assert len(warnings_of(caplog, "run changed")) == 4 and agent.gate.run_alternations == 0


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), 1e300])
def test_a_bad_alternation_window_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="run_alternation_window_s"):
        make_agent(run_alternation_window_s=bad)
