"""AdaCLP wired through the cores: devices send Fisher traces, the coordinator's
probe puts F_G, the CLP flag and the segment in every global model and in metrics, devices refine
their hyper-parameters from it, and over real MQTT a CLP change reaches the agents' lr and clocks."""
import dataclasses
import re

import numpy as np
import pytest

from factories import greet

from streamfl.agent.config import AgentConfig
from streamfl.agent.core import AgentCore
from streamfl.config import build
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.core import CoordinatorCore
from streamfl.models import ModelSpec
from streamfl.protocol.codec import Decoder, encode
from streamfl.models import tensor_spec
from streamfl.sensors.window import Window

SPEC = {"name": "mlp", "in_channels": 6, "window_len": 50, "num_classes": 6, "hidden": 16}


def _agent(**over):
    clp = dict({"fisher_samples": 8}, **over.pop("clp", {}))
    cfg = build(AgentConfig, dict({"device_id": "d1", "model": SPEC, "min_buffer": 8,
                                   "plugins": {"clp": clp}}, **over), "test")
    agent = AgentCore(cfg, clock=lambda: 0.0)
    rng = np.random.default_rng(0)
    for k in range(40):
        agent.add_window(Window(rng.standard_normal((50, 6)).astype(np.float32), k % 6))
    return agent


def _coordinator(**clp):
    core = CoordinatorCore(build(CoordinatorConfig, {"model": SPEC, "plugins": {"clp": clp}}, "test"))
    return greet(core, "d1")


def test_updates_carry_a_fisher_trace_and_the_probe_broadcasts_it():
    coord, agent = _coordinator(trace_window=3), _agent()
    decoder = Decoder({coord.arch_id: tensor_spec(ModelSpec(**SPEC))})
    gm = coord.global_model()
    state = gm.extras["clp"]
    assert state.regulating is True and state.in_clp is True      # training starts in the CLP
    for i in range(4):
        agent.on_global_model(decoder.decode(encode(coord.global_model())))
        update = agent.train_round()
        trace = update.extras["fisher_trace"].value
        assert trace > 0
        # A minute apart: admission counts a device's updates no faster than the rounds they
        # claim (a slow first round on a busy machine would otherwise spend the burst allowance).
        step = coord.on_update(decoder.decode(encode(update)), 60.0 * i)
        event = step.update.as_event()
        assert event["fisher_trace"] == pytest.approx(trace)
        assert event["clp"]["version"] == coord.version - 1   # the CLP state the update met
        assert [e["version"] for e in step.events if e["event"] == "clp"] == [coord.version]
        assert [e["event"] for e in step.events] == ["clp"]
    clp = decoder.decode(encode(coord.global_model())).extras["clp"]
    assert clp.fisher_global > 0 and clp.version == 4
    assert set(coord.plugin("clp").probe.weights()) == {2, 3, 4}
    # Persisted and restored with the coordinator's state.
    again = _coordinator(trace_window=3)
    again.restore(coord.model, coord.state(), 0.0)
    assert again.global_model().extras["clp"] == coord.global_model().extras["clp"]


def test_off_by_default_and_no_trace_when_disabled_on_the_device():
    coord = CoordinatorCore(build(CoordinatorConfig, {"model": SPEC}, "test"))
    assert coord.global_model().extras == {}
    agent = _agent(clp={"fisher_samples": 0})
    agent.on_global_model(_coordinator().global_model())
    assert "fisher_trace" not in agent.train_round().extras
    # A coordinator without the probe asks for no trace: the device spends no backward pass on it.
    agent = _agent()
    agent.on_global_model(coord.global_model())
    assert agent.config.plugins["clp"].fisher_samples > 0
    assert agent.train_round().extras == {} and agent.statistics_windows == {}
    probing = _coordinator().global_model()                    # the same model, from a probing coordinator
    agent.on_global_model(dataclasses.replace(probing, version=1))
    update = agent.train_round()
    assert "fisher_trace" in update.extras
    assert agent.statistics_windows == {"batched": min(8, len(agent.buffer))}


def test_devices_refine_lr_batch_and_dropout_from_the_clp_state():
    agent = _agent(clp={"fisher_scale": 1.0})
    base = {"lr": 0.05, "batch_size": 32, "local_steps": 5, "dropout": 0.0}
    coord = _coordinator()
    gm = coord.global_model()
    gm.hparams.update(base)
    agent.on_global_model(gm)                          # segment start: eta0, B0, D0
    assert (agent.hparams["lr"], agent.hparams["batch_size"], agent.hparams["dropout"]) == (0.01, 50, 0.2)
    rising = dataclasses.replace(gm.extras["clp"], version=5, fisher_global=50.0, fisher_global_prev=49.9,
                                 segment_start_version=0)
    gm2 = type(gm)(version=5, arch_id=gm.arch_id, tensors=gm.tensors, hparams=dict(base),
                   extras={"clp": rising})
    agent.on_global_model(gm2)
    assert agent.hparams["lr"] == pytest.approx(0.01 * 50.0 ** -np.log(2))          # eq. 4
    assert agent.hparams["batch_size"] == int(round(1 + 50 / (1 + np.log(50.0))))   # eq. 5
    assert agent.hparams["dropout"] == pytest.approx(0.2 * (1 - 1 / (1 + np.exp(-10 * 0.1))))  # eq. 6
    done = dataclasses.replace(rising, version=6, regulating=False)
    agent.on_global_model(type(gm)(version=6, arch_id=gm.arch_id, tensors=gm.tensors,
                                   hparams=dict(base), extras={"clp": done}))
    assert agent.hparams == base                       # after R_end: the coordinator's own


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_clp_change_over_mqtt_reaches_the_agents_lr_and_clocks(fleet):
    """sigma is set out of reach, so the fleet starts in the CLP (lowest clocks, eta0) and leaves it
    once F_G has a history; agents then take eq. 4's lr and clp-aware climbs the clocks."""
    run = fleet(coordinator_overrides={"plugins": {"clp": {"trace_window": 3, "growth_threshold": 1e6}}},
                agent_overrides={"dvfs": {"policy": "clp-aware"},
                                 "plugins": {"clp": {"fisher_scale": 1e-6, "fisher_samples": 8}}})
    run.start_fleet(2)
    agents = list(run.agents.values())
    run.wait_for(lambda: run.version() >= 12, 150, "12 aggregations")

    updates = run.updates()
    assert any(u["clp"].get("in_clp") is False for u in updates), updates[-1]
    assert all(u["fisher_trace"] and u["fisher_trace"] > 0 for u in updates)
    first = [u for u in updates if u["base_version"] == 0]
    later = [u for u in updates if u["base_version"] >= 6]
    assert first and later
    # Trained in the CLP at the lowest level of the scaled domain, then climbed out of it.
    def scaled(u):                  # the GPU on the Orin Nano, the CPU on the Raspberry Pi 4
        return u["clock_levels"].get("gpu", u["clock_levels"].get("cpu0"))
    assert all(scaled(u) == 0 for u in first), first
    assert any(scaled(u) > 0 for u in later), later
    for agent in agents:
        text = agent.log_text()
        lrs = [float(x) for x in re.findall(r"hyper-parameters from v\d+: lr ([0-9.e-]+)", text)]
        assert lrs and lrs[0] == pytest.approx(0.01), text[-2000:]   # eta0 at the segment start
        assert min(lrs) < 0.01                                            # eq. 4 once F_G is known
