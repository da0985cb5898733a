"""One contract suite over every registered method plug-in, coordinator side and agent side (the
DVFS contract suite's way): state round-trips through JSON, shown tensors are never mutated, the same
inputs give the same outputs, and what a plug-in puts on the wire survives the codec. A new plug-in
is covered by registering it."""
import copy
import json

import numpy as np
import pytest

from factories import plugin_strategy, make_hello, make_update
from streamfl.agent import plugins as agent_plugins
from streamfl.agent.config import AgentConfig
from streamfl.agent.core import AgentCore
from streamfl.config import build
from streamfl.coordinator import plugins as coordinator_plugins
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.core import CoordinatorCore
from streamfl.coordinator.persistence import PLUGIN_TENSORS
from streamfl.models import ModelSpec, tensor_spec
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import GlobalModel
from streamfl.methods.fedcurv.payloads import CurvatureDiagonal
from streamfl.methods.clp.payloads import FisherTrace
from streamfl.sensors.window import Window

SPEC = ModelSpec(name="mlp", in_channels=2, window_len=4, num_classes=3, hidden=4)
DEVICES = ("d0", "d1", "d2")
COORDINATOR_PLUGINS = sorted(coordinator_plugins.registered())
AGENT_PLUGINS = sorted(agent_plugins.registered())


def decoder():
    return Decoder({SPEC.arch_id: tensor_spec(SPEC)})


def settings_for(name):
    """The plug-in with what it requires, under the first strategy it accepts."""
    strategy, plugins = plugin_strategy(name)
    return {"model": SPEC, "strategy": strategy, "plugins": plugins,
            "fedavg": {"deadline_s": 2.0}, "alpha": 0.5}


def make_core(name):
    return CoordinatorCore(build(CoordinatorConfig, settings_for(name), "test"))


def updates(core, n, seed=0):
    """``n`` updates from the three devices, each with a Fisher trace and a Fisher diagonal."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        tensors = {name: rng.normal(size=a.shape).astype(np.float32) for name, a in core.model.items()}
        diag = {name: rng.random(a.shape).astype(np.float32) for name, a in core.model.items()}
        out.append(make_update(SPEC, device_id=DEVICES[k % 3], update_id="u%d" % k,
                               base_version=max(0, k // 2 - 1), tensors=tensors, num_samples=10 + k,
                               class_counts={k % 3: 6, (k * k) % 3: 4},
                               extras={"fisher_trace": FisherTrace(1.0 + 0.3 * k),
                                       "curvature_diagonal": CurvatureDiagonal(diag)}))
    return out


def drive(core, batch, start_s=0.0):
    """Hellos, then each update with a tick after it; the steps' commands and events."""
    seen = []
    for i, d in enumerate(DEVICES):
        core.on_message(make_hello(d, SPEC), start_s + 0.01 * i)
    for k, u in enumerate(batch):
        t = start_s + 1.0 + k
        for step in (core.on_message(u, t), core.tick(t + 0.5)):
            seen.append(([(c.device_id, c.command) for c in step.commands], step.events,
                         [a.version for a in step.aggregations]))
    return seen


def frame(gm):
    return encode(gm)


@pytest.mark.parametrize("name", COORDINATOR_PLUGINS)
class TestCoordinatorPluginContract:

    def test_same_inputs_give_the_same_models_commands_and_events(self, name):
        a, b = make_core(name), make_core(name)
        batch = updates(a, 12)
        assert drive(a, batch) == drive(b, copy.deepcopy(batch))
        assert a.version == b.version and a.version > 0
        assert frame(a.global_model()) == frame(b.global_model())

    def test_shown_tensors_are_never_mutated(self, name):
        core = make_core(name)
        batch = updates(core, 12)
        kept = copy.deepcopy(batch)
        models = [{k: v.copy() for k, v in core.model.items()}]
        published = [core.global_model()]
        for u in batch:
            core.on_message(u, 1.0)
            published.append(core.global_model())
            models.append({k: v.copy() for k, v in core.model.items()})
        for u, before in zip(batch, kept):
            assert all(np.array_equal(u.tensors[k], before.tensors[k]) for k in u.tensors)
            f, f0 = u.extras["curvature_diagonal"].F, before.extras["curvature_diagonal"].F
            assert all(np.array_equal(f[k], f0[k]) for k in f)
        for gm, model in zip(published, models):
            assert all(np.array_equal(gm.tensors[k], model[k]) for k in model)

    def test_weight_factors_are_finite_and_non_negative(self, name):
        core = make_core(name)
        plugin = next(p for p in core.plugins if p.name == name)
        verdicts = []
        decide = plugin.on_update_admitted

        def recorded(update, now):
            verdicts.append(decide(update, now))
            return verdicts[-1]

        plugin.on_update_admitted = recorded
        drive(core, updates(core, 12))
        assert verdicts, "the plug-in saw no admitted update"
        for verdict in verdicts:
            assert np.isfinite(verdict.weight) and verdict.weight >= 0.0

    def test_state_round_trips_through_json(self, name):
        core = make_core(name)
        drive(core, updates(core, 12))
        plugin = next(p for p in core.plugins if p.name == name)
        saved = plugin.state()
        fresh = next(p for p in make_core(name).plugins if p.name == name)
        if saved is None:
            assert fresh.state() is None
            return
        fresh.load_state(json.loads(json.dumps(saved)))
        assert fresh.state() == saved
        # A coordinator restored from the whole state continues where the first one was.
        again = make_core(name)
        state = core.state()
        arrays = state.pop(PLUGIN_TENSORS)  # they go to plugins.safetensors, not through JSON
        again.restore(core.model, dict(json.loads(json.dumps(state)), **{PLUGIN_TENSORS: arrays}), 100.0)
        assert again.version == core.version
        assert [p.state() for p in again.plugins] == [p.state() for p in core.plugins]

    def test_its_extras_survive_the_codec(self, name):
        core = make_core(name)
        drive(core, updates(core, 12))
        gm = core.global_model()
        back = decoder().decode(frame(gm))
        assert set(back.extras) == set(gm.extras)
        back.hparams = gm.hparams        # the header's hparams decode as floats (not the plug-in's)
        assert frame(back) == frame(gm)

    def test_a_malformed_saved_state_is_a_clear_error(self, name):
        plugin = make_core(name).plugins[-1]
        if plugin.state() is None:
            pytest.skip("keeps no state")
        bad = {key: "not a number" for key in plugin.state()}
        with pytest.raises(ValueError):
            plugin.load_state(bad)


def agent(seed=7):
    cfg = build(AgentConfig, {"device_id": "a1", "model": SPEC, "min_buffer": 8, "buffer_capacity": 64,
                              "seed": seed, "local_steps": 3, "batch_size": 4,
                              "sensor": {"kind": "mqtt", "window_len": 4, "channels": 2, "num_classes": 3}},
                "test")
    core = AgentCore(cfg, timer=lambda: 0.0)
    rng = np.random.default_rng(1)
    for i in range(32):
        core.add_window(Window(rng.normal(size=(4, 2)).astype(np.float32), i % 3, float(i)))
    return core


def model_asking_for(name):
    """A global model carrying the extras of the coordinator plug-in of the same name (if any)."""
    if name not in coordinator_plugins.registered():
        return None
    core = make_core(name)
    drive(core, updates(core, 6))
    return decoder().decode(frame(core.global_model()))


@pytest.mark.parametrize("name", AGENT_PLUGINS)
class TestAgentPluginContract:

    def test_dormant_without_its_extra(self, name):
        core = agent()
        calls = _spy(core, name)
        plugin = core.plugin(name)
        assert plugin.activated_by, "a method's plug-in names the extra its coordinator side sends"
        gm = _plain_model(1)
        core.on_global_model(gm)
        core.add_window(Window(np.zeros((4, 2), dtype=np.float32), 0, 99.0))
        assert core.ready(1.0) and core.round_opportunity(1.0)
        assert core.train_round().extras == {} and core.statistics_windows == {}
        assert core.report_extras(2.0) == {}
        assert calls == [] and plugin not in core.active_plugins     # no hook of a dormant plug-in
        assert core.hparams == gm.hparams and not core.critical_period
        assert core.buffer.policy is core.policy

    def test_its_extra_activates_it_and_its_absence_starts_it_afresh(self, name):
        gm = model_asking_for(name)
        if gm is None:
            pytest.skip("no coordinator plug-in of that name makes its extra")
        core = agent()
        plugin = core.plugin(name)
        assert set(plugin.activated_by) & set(gm.extras), "activated_by names no kind its coordinator sends"
        core.on_global_model(gm)
        assert plugin in core.active_plugins
        core.round_opportunity(1.0)
        core.train_round()
        calls = _spy(core, name)
        core.on_global_model(_plain_model(gm.version + 1))
        fresh = core.plugin(name)
        assert fresh is not plugin and type(fresh) is type(plugin) and fresh not in core.active_plugins
        assert core.plugins.index(fresh) == [p.name for p in core.plugins].index(name)   # its place kept
        assert vars(fresh).keys() == vars(type(plugin)(plugin.config)).keys()
        assert calls == []                          # the deactivating model is not shown to it
        assert not core.critical_period and core.buffer.policy is core.policy
        core.round_opportunity(2.0)
        assert core.train_round().extras == {}

    def test_same_inputs_give_the_same_update(self, name):
        gm = model_asking_for(name)
        if gm is None:
            pytest.skip("no coordinator plug-in of that name makes its extra")
        outs = []
        for _ in range(2):
            core = agent()
            core.on_global_model(gm)
            first = core.train_round()
            core.on_global_model(GlobalModel(gm.version + 1, gm.arch_id, gm.tensors, gm.hparams, gm.extras))
            outs.append((first, core.train_round(), dict(core.hparams), dict(core.statistics_windows)))
        (a1, a2, ha, sa), (b1, b2, hb, sb) = outs
        assert ha == hb and sa == sb
        for x, y in ((a1, b1), (a2, b2)):
            assert all(np.array_equal(x.tensors[k], y.tensors[k]) for k in x.tensors)
            assert set(x.extras) == set(y.extras)
            assert encode(_only_extras(x)) == encode(_only_extras(y))

    def test_the_global_model_is_never_mutated_and_statistics_pass_the_codec(self, name):
        gm = model_asking_for(name)
        if gm is None:
            pytest.skip("no coordinator plug-in of that name makes its extra")
        kept = frame(gm)
        core = agent()
        core.on_global_model(gm)
        for _ in range(2):
            update = core.train_round()
            back = decoder().decode(encode(update))
            assert encode(_only_extras(back)) == encode(_only_extras(update))
        assert frame(gm) == kept


#: The hooks a dormant plug-in never hears (``bind`` runs once, at construction).
HOOKS = ("on_window_arrived", "on_model_received", "on_round_opportunity", "before_round", "after_round",
         "before_telemetry")


def _spy(core, name):
    """Record every hook call the core makes on the plug-in ``name`` (as it is now)."""
    calls = []
    plugin = core.plugin(name)
    for hook in HOOKS:
        def recorded(*args, _hook=hook, _inner=getattr(plugin, hook)):
            calls.append(_hook)
            return _inner(*args)
        setattr(plugin, hook, recorded)
    return calls


def _plain_model(version):
    """A global model with no extras: a coordinator that runs no method plug-in."""
    return GlobalModel(version=version, arch_id=SPEC.arch_id, tensors=make_core("clp").model,
                       hparams={"lr": 0.05, "batch_size": 4, "local_steps": 3, "dropout": 0.0})


def _only_extras(update):
    """The update with fixed identity fields, so two frames differ only where the extras do."""
    return make_update(update.tensors, 0.0, device_id="a1", update_id="x", arch_id=update.arch_id,
                       extras=update.extras)
