"""What an agent follows: versions within one coordinator run, a new run by resync, commands once,
hyper-parameters and skips within the board's own limits."""
import numpy as np
import pytest

from factories import make_global_model
from streamfl.agent.config import AgentConfig
from streamfl.agent.core import AgentCore
from streamfl.config import build
from streamfl.errors import ConfigError
from streamfl.models import ModelSpec
from streamfl.protocol.messages import Command
from streamfl.sensors.window import Window

SPEC = ModelSpec(name="mlp", in_channels=3, window_len=8, num_classes=3, hidden=16)


def make_agent(**overrides):
    values = dict(device_id="pi-01", model=SPEC, min_buffer=8, local_steps=2, batch_size=4,
                  buffer_capacity=32, sensor={"channels": 3, "window_len": 8, "num_classes": 3})
    values.update(overrides)
    agent = AgentCore(build(AgentConfig, values, "test"), clock=lambda: 0.0, seed=1)
    rng = np.random.default_rng(0)
    for i in range(16):
        agent.add_window(Window(rng.standard_normal((8, 3)).astype(np.float32), i % 3))
    return agent


def gm(version, run_id="run-a", value=0.0, **hparams):
    return make_global_model(SPEC, version, value, run_id=run_id, hparams=hparams)


def test_versions_are_compared_within_a_run_and_a_new_run_is_followed():
    agent = make_agent()
    assert agent.on_global_model(gm(922))
    agent.train_round()
    assert agent.base_version == 922
    assert not agent.on_global_model(gm(33))              # same run, older: ignored
    assert agent.on_global_model(gm(33, "run-b", 0.5))    # coordinator reset: followed at once
    assert agent.gate.resyncs == 1 and agent.base_version == -1
    plan = agent.begin_round()
    assert plan.base_version == 33 and plan.start_tensors is not None   # starts from the new model
    assert len(agent.buffer) == 16                        # the buffer is kept
    assert agent.on_global_model(gm(34, "run-b")) and not agent.on_global_model(gm(34, "run-b"))


def test_a_forged_huge_version_does_not_lock_out_the_real_coordinator():
    agent = make_agent()
    assert agent.on_global_model(gm(5, "real"))
    assert agent.on_global_model(gm(10 ** 12, "forged", lr=1.0, batch_size=1024, local_steps=10000))
    assert agent.hparams["lr"] == 0.5 and agent.hparams["batch_size"] == 256   # the board's limits
    assert agent.hparams["local_steps"] == 500
    arrays, meta = agent.checkpoint()
    restarted = make_agent()
    restarted.restore(arrays, meta)
    assert restarted.on_global_model(gm(6, "real"))       # the real run is back: resync
    assert restarted.gate.run_id == "real" and restarted.base_version == -1


def test_unnamed_runs_keep_plain_version_order():
    agent = make_agent()
    assert agent.on_global_model(gm(3, ""))
    assert not agent.on_global_model(gm(2, "")) and agent.on_global_model(gm(4, ""))


def test_commands_are_obeyed_once_and_only_from_the_followed_run():
    agent = make_agent()
    agent.on_global_model(gm(1, "run-a"))
    assert agent.on_command(Command("skip", {"rounds": 2}, run_id="run-a", seq=10))
    assert agent.skipping
    assert not agent.on_command(Command("train", {}, run_id="run-a", seq=10))    # a replay
    assert not agent.on_command(Command("train", {}, run_id="run-b", seq=99))    # another run
    assert agent.skipping and agent.gate.rejected_commands == 2
    assert agent.on_command(Command("train", {}, run_id="run-a", seq=11))
    assert not agent.skipping
    arrays, meta = agent.checkpoint()
    restarted = make_agent()
    restarted.restore(arrays, meta)                          # a restart does not reopen replays
    assert not restarted.on_command(Command("skip", {"rounds": 2}, run_id="run-a", seq=10))
    assert restarted.on_command(Command("skip", {"rounds": 1}))    # unstamped (simulator): obeyed


def test_skip_and_hparams_are_bounded_by_the_boards_config():
    agent = make_agent(max_skip_rounds=5, hparam_limits={"lr": [0.001, 0.02], "local_steps": [1, 3]})
    agent.on_global_model(gm(1, lr=0.5, local_steps=100))
    assert agent.hparams["lr"] == 0.02 and agent.hparams["local_steps"] == 3
    agent.on_command(Command("skip", {"rounds": 100000}))
    assert agent.orders.skip_rounds == 5
    agent.on_command(Command("override", {"lr": 1e-9}))
    assert agent.hparams["lr"] == 0.001


@pytest.mark.parametrize("bad, match", [
    ({"hparam_limits": {"lr": [0.1]}}, "hparam_limits.lr"),
    ({"hparam_limits": {"momentum": [0, 1]}}, "unknown hyper-parameter"),
    ({"hparam_limits": {"batch_size": [0, 10]}}, "hparam_limits.batch_size"),
    ({"coordinator_public_key": "hello"}, "coordinator_public_key"),
    ({"max_skip_rounds": -1}, "max_skip_rounds"),
])
def test_bad_trust_settings_are_config_errors(bad, match):
    with pytest.raises(ConfigError, match=match):
        make_agent(**bad)
