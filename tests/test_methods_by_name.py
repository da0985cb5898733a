"""Methods by name: one registry for the simulator and the coordinator, ``--method NAME`` laid over
the coordinator's file (its keys winning, each replaced key logged), the agent side sent with
every global model and judged key by key on the board, hyper-parameters a plug-in replaces logged
once, and ``streamfl methods``."""
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from streamfl import methods
from streamfl.agent.config import AgentConfig
from streamfl.agent.core import AgentCore
from streamfl.cli import main as streamfl_main
from streamfl.config import build
from streamfl.coordinator.config import CoordinatorConfig, load_config
from streamfl.coordinator.core import CoordinatorCore
from streamfl.dvfs.policies.extremes import PerformancePolicy, PowersavePolicy
from streamfl.errors import ConfigError, ProtocolError
from streamfl.methods.agent_side import KIND, MethodSettings, split
from streamfl.methods.clp.payloads import ClpState
from streamfl.models import ModelSpec, build_model, model_to_arrays, tensor_spec
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import GlobalModel
from streamfl.sensors.window import Window

ROOT = Path(__file__).resolve().parent.parent
SPEC = ModelSpec(name="mlp", in_channels=3, window_len=8, num_classes=3, hidden=16)
DECODER = Decoder({SPEC.arch_id: tensor_spec(SPEC)})
TENSORS = model_to_arrays(build_model(SPEC, seed=1))
CLP = ClpState(version=1, fisher_global=2.5, fisher_global_prev=1.0, in_clp=True, segment=1,
               segment_start_version=0, regulating=True, fisher_segment_start=2.0)


def write(tmp_path, text):
    path = tmp_path / "coordinator.yaml"
    path.write_text(text)
    return path


def model(version, settings=None, method="test-method", clp=False, **hparams):
    extras = {}
    if settings is not None:
        extras[KIND] = MethodSettings.of(method, settings)
    if clp:
        extras[ClpState.KIND] = CLP
    return GlobalModel(version=version, arch_id=SPEC.arch_id, tensors=TENSORS,
                       hparams=hparams or {"lr": 0.05}, extras=extras, run_id="run-1")


def make_core(**overrides):
    values = dict(device_id="dev-1", model=SPEC, min_buffer=8, local_steps=2, batch_size=8,
                  buffer_capacity=64, sensor={"channels": 3, "window_len": 8, "num_classes": 3})
    values.update(overrides)
    core = AgentCore(build(AgentConfig, values, "test"), clock=lambda: 100.0, seed=7)
    rng = np.random.default_rng(0)
    for i in range(16):
        core.add_window(Window(rng.normal(0, 1, (8, 3)).astype(np.float32), i % 3))
    return core


# ---- one registry ------------------------------------------------------------------------------

def test_the_simulator_and_the_coordinator_share_one_registry_with_a_when_for_every_method():
    from streamfl.sim import methods as sim_methods
    named = methods.named_methods()
    assert sim_methods.METHODS is named
    assert list(named)[:2] == ["fedasync", "fedavg"]
    assert sim_methods.get_method("fedasync+balance-rest") is named["fedasync+balance-rest"]
    assert {p.name for p in methods.presets()} <= set(named)
    assert not [name for name, m in named.items() if not m.when], "every shipped method says when"
    with pytest.raises(ConfigError, match="unknown method 'nope'.*fedasync"):
        methods.named_method("nope")


def test_the_coordinator_config_does_not_load_the_simulator():
    code = ("import sys; from streamfl.coordinator.config import load_config; "
            "load_config(None, {'method': 'streamclp+balance'}); "
            "print(sorted(m for m in sys.modules if m.startswith('streamfl.sim')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- the coordinator side ------------------------------------------------------------------------

def test_a_method_is_laid_over_the_file_and_every_key_it_replaces_is_said(tmp_path):
    path = write(tmp_path, "method: fedasync+balance-rest\nstrategy: fedavg\nhparams: {lr: 0.05}\n"
                           "plugins: {balance: {rest_below: 0.3, floor: 0.2}, sampling: {}}\n")
    notes = []
    config = load_config(path, notes=notes)
    said = "\n".join(message for _, message in notes)
    assert config.strategy == "fedasync" and list(config.plugins) == ["balance"]
    balance = config.plugins["balance"]
    assert (balance.rest_below, balance.rest_rounds, balance.floor) == (0.25, 5, 0.2)  # the file's floor stays
    assert config.hparams.lr == 0.05
    warnings = [m for level, m in notes if level == logging.WARNING]
    assert "sets strategy: 'fedavg' (the file's) -> 'fedasync'" in said
    assert "sets plugins.balance.rest_below: 0.3 (the file's) -> 0.25" in said
    assert any("plugins.sampling of the file do not run" in m for m in warnings)
    assert (logging.INFO, "method fedasync+balance-rest sets plugins.balance.rest_rounds: 20 (default) -> 5") in notes
    assert config.method_settings == MethodSettings.of("fedasync+balance-rest", {})


def test_the_flag_names_the_method_and_without_notes_they_are_logged(tmp_path, caplog):
    path = write(tmp_path, "method: fedasync\n")
    with caplog.at_level(logging.INFO, logger="streamfl.coordinator.config"):
        config = load_config(path, {"method": "streamclp-dvfs"})
    assert config.method == "streamclp-dvfs" and list(config.plugins) == ["clp"]
    assert config.method_settings.settings == {
        "plugins": {"clp": {"lr_rule": "learned"}},
        "dvfs": {"policy": "clp-aware", "policy_options": {"clp_level": "efficient", "climb_energy_ratio": 1.1}}}
    assert "method streamclp-dvfs runs plug-in clp" in caplog.text
    with pytest.raises(ConfigError, match="key 'method': unknown method 'nope'"):
        load_config(path, {"method": "nope"})


def test_a_board_setting_of_a_method_is_never_sent_and_said_to_be_the_boards():
    notes = []
    config = load_config(None, {"method": "fedogd"}, notes=notes)
    assert config.strategy == "fedavg" and config.method_settings.settings == {}
    assert any("buffer_capacity: 32, min_buffer: 16 in every agent's YAML" in m for _, m in notes)
    assert split(methods.named_method("fedogd")).board == {"buffer_capacity": 32, "min_buffer": 16}


def test_a_config_that_names_a_method_it_does_not_run_is_refused():
    with pytest.raises(ConfigError, match="method fedavg: strategy is 'fedasync', the method's 'fedavg'"):
        build(CoordinatorConfig, {"method": "fedavg"})
    with pytest.raises(ConfigError, match="plugins are"):
        build(CoordinatorConfig, {"method": "adaclp"})
    with pytest.raises(ConfigError, match="plugins.clp.trace_window is 10, the method's 50"):
        build(CoordinatorConfig, {"method": "adaclp", "plugins": {"clp": {}}})
    probe = {"trace_window": 50, "growth_threshold": 0.002}   # the probe of adaclp's figures
    assert build(CoordinatorConfig, {"method": "adaclp", "plugins": {"clp": probe}}).method_settings.settings == {
        "dvfs": {"policy": "clp-aware"}}


def test_every_global_model_carries_the_agent_side_through_the_codec():
    config = load_config(None, {"method": "streamclp", "model": {"name": "mlp", "in_channels": 3,
                                                                  "window_len": 8, "num_classes": 3,
                                                                  "hidden": 16}})
    gm = DECODER.decode(encode(CoordinatorCore(config).global_model()))
    assert gm.extras[KIND] == config.method_settings
    assert gm.extras[KIND].settings == {"plugins": {"clp": {"lr_rule": "learned"}}, "dvfs": {"policy": "none"}}
    plain = load_config(None, {"model": {"name": "mlp", "in_channels": 3, "window_len": 8,
                                         "num_classes": 3, "hidden": 16}})
    assert KIND not in CoordinatorCore(plain).global_model().extras


def test_check_config_prints_what_the_method_changed_as_comments_of_valid_yaml(tmp_path):
    path = write(tmp_path, "strategy: fedavg\n")
    proc = subprocess.run([sys.executable, "-m", "streamfl.coordinator", "--config", str(path),
                           "--method", "fedasync+balance-rest", "--check-config"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "# method fedasync+balance-rest sets strategy: 'fedavg' (the file's) -> 'fedasync'" in proc.stdout
    printed = yaml.safe_load(proc.stdout)
    assert printed["method"] == "fedasync+balance-rest" and printed["strategy"] == "fedasync"
    assert printed["plugins"] == {"balance": {"floor": 0.1, "power": 3.0, "rest_below": 0.25, "rest_rounds": 5}}
    bad = subprocess.run([sys.executable, "-m", "streamfl.coordinator", "--method", "nope", "--check-config"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--method nope" in bad.stderr and "unknown method" in bad.stderr


# ---- the payload ---------------------------------------------------------------------------------

@pytest.mark.parametrize("settings, needle", [
    ({"plugins": {"p%d" % i: {} for i in range(33)}}, "keys, at most"),
    ({"a": {"b": {"c": {"d": {"e": {"f": 1}}}}}}, "nested deeper"),
    ({"plugins": {"clp": {"lr_rule": "x" * 129}}}, "characters"),
    ({"plugins": {"clp": {"bad key": 1}}}, "not a name"),
    ({"plugins": {"clp": {"n": 2 ** 60}}}, "beyond 2^53"),
    ({"plugins": {"clp": {"n": list(range(33))}}}, "items"),
    ({"plugins": {"clp": {"n": [{"a": 1}]}}}, "expected a number"),
    ({"plugins": {"p%d" % i: {"k%d" % j: 1 for j in range(30)} for i in range(10)}}, "more than 256 values"),
])
def test_a_payload_outside_its_shape_refuses_the_frame(settings, needle):
    frame = encode(GlobalModel(version=2, arch_id=SPEC.arch_id, tensors=TENSORS,
                               extras={KIND: MethodSettings("m", __import__("json").dumps(settings))}))
    with pytest.raises(ProtocolError) as err:
        DECODER.decode(frame)
    assert err.value.reason == "schema" and needle in str(err.value)


# ---- the agent side ------------------------------------------------------------------------------

def test_the_board_applies_the_methods_plugin_settings_and_goes_back_to_its_own(caplog):
    core = make_core(plugins={"clp": {"fisher_samples": 8}})
    with caplog.at_level(logging.INFO, logger="streamfl.agent"):
        core.on_global_model(model(1, {"plugins": {"clp": {"lr_rule": "learned"}}}, method="streamclp", clp=True))
        clp = core.plugin("clp").config
        assert (clp.lr_rule, clp.fisher_samples) == ("learned", 8)   # the board's own other keys stay
        assert "plug-in clp settings from global model v1 (method streamclp): lr_rule: 'paper' -> 'learned'" in caplog.text
        core.train_round()
        core.on_global_model(model(2, {"plugins": {"clp": {"lr_rule": "learned"}}}, method="streamclp", clp=True))
        assert caplog.text.count("plug-in clp settings") == 1          # once per change, not per model
        core.on_global_model(model(3, clp=True))
    assert core.plugin("clp").config.lr_rule == "paper"
    assert "carries no method settings (the coordinator no longer runs method streamclp)" in caplog.text
    assert "plug-in clp settings from global model v3 (this board's own): lr_rule: 'learned' -> 'paper'" in caplog.text


HOSTILE = {
    "plugins": {"clp": {"lr_rule": "bogus", "fisher_samples": -1, "rest_rounds": 1e9, "initial_lr": "fast",
                        "no_such_key": 1, "rest_loss_frac": 0.2},
                "schedule": {"channel_snr_hz": 1e6},
                "no_such_plugin": {"x": 1},
                "fedcurv": [1, 2]},
    "buffer_capacity": 1,
    "mqtt": {"host": "evil"},
    "dvfs": {"policy": "fixed", "policy_options": {"levels": {"cpu0": 0}}, "backend": "none"},
}


def test_hostile_settings_are_refused_key_by_key_in_one_warning_and_training_goes_on(caplog):
    core = make_core(dvfs={"backend": "simulated", "policy": "performance"})
    policy = core.dvfs_policy
    with caplog.at_level(logging.INFO, logger="streamfl.agent"):
        assert core.on_global_model(model(1, HOSTILE, method="evil"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                and "not applied" in r.getMessage()]
    assert len(warnings) == 1, warnings
    text = warnings[0]
    for needle in ("plugins.clp.lr_rule='bogus'", "plugins.clp.fisher_samples=-1", "out of range",
                   "plugins.clp.rest_rounds=1000000000.0", "plugins.clp.initial_lr='fast'",
                   "plugins.clp.no_such_key", "plugins.schedule.channel_snr_hz (this board's own",
                   "plugins.no_such_plugin (no such plug-in", "plugins.fedcurv=[1, 2]",
                   "buffer_capacity (not a setting", "mqtt (not a setting", "dvfs.backend (not a setting",
                   "dvfs.policy='fixed'"):
        assert needle in text, needle
    clp = core.plugin("clp").config
    assert (clp.lr_rule, clp.fisher_samples, clp.rest_loss_frac) == ("paper", 20, 0.2)  # the good key only
    assert core.plugin("schedule").config.channel_snr_hz is None
    assert core.dvfs_policy is policy and core.buffer.capacity == 64
    assert core.train_round().base_version == 1                                       # training goes on
    with caplog.at_level(logging.INFO, logger="streamfl.agent"):
        core.on_global_model(model(2, dict(HOSTILE, mqtt={"host": "other"}), method="evil"))
    again = [r for r in caplog.records if r.levelno == logging.WARNING and "not applied" in r.getMessage()]
    assert len(again) == 1, "a second refusal within a minute is held back"


def test_the_clock_policy_is_the_coordinators_only_where_the_board_handed_its_clocks_over(caplog):
    managed = make_core(dvfs={"backend": "simulated", "policy": "performance"})
    managed.on_global_model(model(1, {"dvfs": {"policy": "powersave"}}))
    assert isinstance(managed.dvfs_policy, PowersavePolicy)
    managed.on_global_model(model(2, {"dvfs": {"policy": "none"}}))     # cap mode: caps at the top
    assert isinstance(managed.dvfs_policy, PerformancePolicy)
    managed.on_global_model(model(3, {"dvfs": {"policy": "powersave"}}))
    managed.on_global_model(model(4))                                   # none sent: the board's own
    assert isinstance(managed.dvfs_policy, PerformancePolicy)
    untouched = make_core()                                             # dvfs.policy none
    policy = untouched.dvfs_policy
    with caplog.at_level(logging.WARNING):
        untouched.on_global_model(model(1, {"dvfs": {"policy": "powersave"}}))
    assert untouched.dvfs_policy is policy
    assert "its operator has not handed its clocks over" in caplog.text
    pinned = make_core(dvfs={"backend": "simulated", "policy": "performance", "mode": "pin"})
    pinned.on_global_model(model(1, {"dvfs": {"policy": "none"}}))
    assert isinstance(pinned.dvfs_policy, PerformancePolicy) and pinned.methods._dvfs.policy == "performance"


def test_a_hyper_parameter_a_plugin_replaces_is_said_once_per_change(caplog):
    core = make_core()
    with caplog.at_level(logging.INFO, logger="streamfl.agent"):
        core.on_global_model(model(1, clp=True, lr=0.05, batch_size=32, dropout=0.0))
        lr, batch = core.hparams["lr"], core.hparams["batch_size"]     # eq. 4-6 from the CLP state
        assert lr < 0.05 and batch != 32
        core.on_global_model(model(2, clp=True, lr=0.05, batch_size=32, dropout=0.0))
        core.on_global_model(model(3, clp=True, lr=0.1, batch_size=32, dropout=0.0))
    said = [r.getMessage() for r in caplog.records if "replaces the hyper-parameter" in r.getMessage()]
    assert len([m for m in said if " lr " in m]) == 2, said                 # v1, then the new 0.1
    assert "plug-in clp replaces the hyper-parameter lr from global model v1: 0.05 -> %r" % lr in said[0]
    assert any("batch_size from global model v1: 32 -> %d" % batch in m for m in said)
    assert any("lr from global model v3: 0.1 ->" in m for m in said)


def test_a_clamped_hyper_parameter_is_said_once_per_change(caplog):
    core = make_core()
    with caplog.at_level(logging.WARNING, logger="streamfl.agent"):
        for version in (1, 2, 3):
            core.on_global_model(model(version, lr=50.0))
        core.on_global_model(model(4, lr=60.0))
    assert caplog.text.count("clamped to 0.5") == 2


# ---- streamfl methods ----------------------------------------------------------------------------

def test_streamfl_methods_lists_every_method_with_when_to_use_it(capsys):
    assert streamfl_main(["methods"]) == 0
    out = capsys.readouterr().out
    names = [line.split()[0] for line in out.splitlines() if line and not line.startswith(" ")]
    assert names == list(methods.named_methods())
    assert "most boards see the same few classes at once" in out


def test_streamfl_methods_show_prints_the_yaml_a_name_amounts_to(capsys, tmp_path):
    assert streamfl_main(["methods", "--show", "fedasync+balance-rest"]) == 0
    coordinator, agent, board = yaml.safe_load_all(capsys.readouterr().out)
    assert coordinator == {"strategy": "fedasync", "plugins": {"balance": {"rest_below": 0.25, "rest_rounds": 5}}}
    assert agent == {} and board == {}
    written = load_config(write(tmp_path, yaml.safe_dump(coordinator)))
    named = load_config(None, {"method": "fedasync+balance-rest"})
    assert (written.strategy, written.plugins) == (named.strategy, named.plugins)
    capsys.readouterr()   # what those loads logged
    assert streamfl_main(["methods", "--show", "streamclp-dvfs"]) == 0
    _, agent, _ = yaml.safe_load_all(capsys.readouterr().out)
    assert agent == split(methods.named_method("streamclp-dvfs")).sent
    assert streamfl_main(["methods", "--show", "fedogd"]) == 0
    assert list(yaml.safe_load_all(capsys.readouterr().out))[2] == {"buffer_capacity": 32, "min_buffer": 16}
    assert streamfl_main(["methods", "--show", "nope"]) == 2


def test_the_choosing_page_is_linked_and_names_the_methods_it_recommends():
    page = (ROOT / "docs" / "choosing-a-method.md").read_text()
    assert "choosing-a-method.md" in (ROOT / "docs" / "methods.md").read_text()
    for name in ("fedasync+balance-rest", "streamclp+balance", "fedteddi-fill", "timeewc", "session-init", "is"):
        assert "`%s`" % name in page, name
