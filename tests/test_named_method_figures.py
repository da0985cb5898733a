"""A named method runs on a fleet what its published figures measured (the field-lab finding on --method streamclp-dvfs).

Every named method whose figures are published says where they come from (``Method.figures``:
the scenario file and ``--set`` flags of the run, the table of docs/results.md, the keys that are
the run's setting rather than the method's). For each, the settings of the scenario's run of the
method (``streamfl.sim.methods.run_settings``, what the simulator builds every run from) and those
of ``--method NAME`` on a fleet (the coordinator's own loader, ``load_config``, and the boards'
``MethodSettingsGate`` over a board's default config) must agree: the strategy, the coordinator
plug-ins and each one's settings, the boards' plug-in settings and the clock policy the
coordinator sends. A fleet that ran ``streamclp-dvfs`` with the probe's defaults (m = 10,
sigma = 0.01) where the figures' run had m = 50, sigma = 0.002 flipped the CLP flag 40 times in
2.7 minutes; this is the check that would have said so.
"""
import dataclasses
from pathlib import Path
from typing import Any, Dict, List

import pytest

from streamfl import methods
from streamfl.agent.method_settings import MethodSettingsGate
from streamfl.agent.plugins import registered as agent_plugins
from streamfl.config import build, to_dict
from streamfl.dvfs.config import DvfsConfig
from streamfl.coordinator.config import load_config
from streamfl.coordinator.plugins import registered as coordinator_plugins
from streamfl.methods.agent_side import board_keys, method_settings
from streamfl.methods.base import Figures, Method
from streamfl.method_list import show
from streamfl.plugins import build_settings
from streamfl.sim.methods import run_settings
from streamfl.sim.scenario import load_scenario, parse_sets

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results.md"
#: The board the clocks are judged on (one with a power profile: clp_level efficient needs it).
BOARD = "jetson-orin-nano"


def _published() -> List[Method]:
    return [m for m in methods.named_methods().values() if m.figures is not None]


def _without(values: Dict[str, Any], prefix: str, drop) -> Dict[str, Any]:
    return {key: value for key, value in values.items() if "%s.%s" % (prefix, key) not in drop}


def differences(method: Method) -> List[str]:
    """Where ``--method NAME`` on a fleet differs from the run behind ``method``'s figures."""
    figures = method.figures
    scenario = load_scenario(ROOT / figures.scenario, sets=parse_sets(list(figures.sets)))
    coordinator_values, agent_values = run_settings(scenario, method)
    setting = set(figures.setting_keys)
    out: List[str] = []

    # The coordinator: the scenario's run through the coordinator's loader, and the fleet's.
    ran = load_config(None, coordinator_values, notes=[])
    fleet = load_config(None, {"method": method.name}, notes=[])
    if ran.strategy != fleet.strategy:
        out.append("strategy: the figures' run %r, the fleet %r" % (ran.strategy, fleet.strategy))
    if set(ran.plugins) != set(fleet.plugins):
        out.append("plug-ins: the figures' run %s, the fleet %s" % (sorted(ran.plugins), sorted(fleet.plugins)))
    for name in sorted(set(ran.plugins) & set(fleet.plugins)):
        want = _without(to_dict(ran.plugins[name]), "plugins." + name, setting)
        got = _without(to_dict(fleet.plugins[name]), "plugins." + name, setting)
        for key in sorted(want):
            if want[key] != got.get(key):
                out.append("plugins.%s.%s: the figures' run %r, the fleet %r" % (name, key, want[key], got.get(key)))

    # The boards: a board with its default config, given what the coordinator sends.
    classes = agent_plugins()
    # A board whose operator handed its clocks over (its own policy not none), in cap mode.
    clocks = build(DvfsConfig, {"backend": "simulated", "board": BOARD, "policy": "performance"}, "dvfs")
    gate = MethodSettingsGate({name: build_settings(cls, name, None) for name, cls in classes.items()}, clocks)
    refused: List[str] = []
    board = gate.judge(method_settings(method), refused)
    if refused:
        out.append("refused on a board: %s" % "; ".join(refused))
    names = set(method.plugins) | set((method.agent.get("plugins") or {}))
    for name in sorted(names & set(classes)):
        cls = classes[name]
        own = set(board_keys(cls.Config))
        want = build_settings(cls, name, (agent_values.get("plugins") or {}).get(name))
        want_d = _without(to_dict(want), "agent.plugins." + name, setting)
        got_d = to_dict(board.plugins[name])
        for key in sorted(want_d):
            if key not in own and want_d[key] != got_d.get(key):
                out.append("agent.plugins.%s.%s: the figures' run %r, the fleet %r"
                           % (name, key, want_d[key], got_d.get(key)))

    # The clocks (a method without a policy leaves each board's own, as the scenario's for every
    # method). A method's "none" is "clocks left alone": on a board in cap mode, every cap at the
    # top (performance), the governor running the clocks.
    if method.dvfs_policy is not None:
        ran_policy = method.dvfs_policy
        ran_options = dict((agent_values.get("dvfs") or {}).get("policy_options") or {})
        if ran_policy == "none":
            ran_policy, ran_options = "performance", {}
        got = board.dvfs
        if got is None or got.policy != ran_policy or dict(got.policy_options) != ran_options:
            out.append("dvfs: the figures' run %s %r, the fleet %s %r" % (
                ran_policy, ran_options, getattr(got, "policy", None), getattr(got, "policy_options", None)))
    return out


@pytest.mark.parametrize("name", [m.name for m in _published()])
def test_a_named_method_runs_on_a_fleet_what_its_figures_measured(name):
    assert differences(methods.named_method(name)) == []


def test_every_shipped_method_with_a_verdict_says_where_its_figures_come_from():
    headings = {line.lstrip("#").strip() for line in RESULTS.read_text().splitlines() if line.startswith("#")}
    shipped = list(methods.BASELINES) + [p for name in methods.BUILTIN
                                         for p in methods.get(name).preset_list()]
    missing = [m.name for m in shipped if m.when and m.figures is None]
    assert missing == [], "methods with a 'when' from the results but no figures: %s" % missing
    for method in shipped:
        figures = method.figures
        if figures is None:
            continue
        assert (ROOT / figures.scenario).is_file(), (method.name, figures.scenario)
        assert figures.table in headings, (method.name, figures.table)
        assert bool(figures.setting_keys) == bool(figures.why), method.name
        shown = show(method)   # streamfl methods --show NAME
        shown = shown.replace("\n# ", " ")
        assert figures.scenario in shown and figures.table in shown, method.name
        for key in figures.setting_keys:
            side, _, rest = key.partition("plugins.")
            plugin, _, field = rest.partition(".")
            classes = agent_plugins() if side == "agent." else coordinator_plugins()
            assert side in ("", "agent.") and plugin in classes, (method.name, key)
            assert field in {f.name for f in dataclasses.fields(classes[plugin].Config)}, (method.name, key)


def test_the_check_fails_on_a_method_without_its_figures_settings():
    """``streamclp-dvfs`` as it was before its name carried the probe: the check must say so."""
    shipped = methods.named_method("streamclp-dvfs")
    old = dataclasses.replace(shipped.scenario_side(), name="streamclp-dvfs-before-48")
    methods.register_named(old)
    try:
        found = differences(old)
    finally:
        methods.named_methods().pop(old.name)
    assert "plugins.clp.trace_window: the figures' run 50, the fleet 10" in found
    assert "plugins.clp.growth_threshold: the figures' run 0.002, the fleet 0.01" in found


def test_a_scenario_run_takes_the_measured_settings_from_its_scenario():
    """The simulator's runs keep measuring what they measured: a scenario that sets no probe runs
    the probe's defaults, the figures' scenario its own (the same as the name carries)."""
    method = methods.named_method("streamclp-dvfs")
    smoke = load_scenario(ROOT / "configs" / "scenarios" / "smoke.yaml")
    assert run_settings(smoke, method)[0]["plugins"]["clp"] == {}
    paper = load_scenario(ROOT / method.figures.scenario)
    probe = run_settings(paper, method)[0]["plugins"]["clp"]
    assert {k: probe[k] for k in ("trace_window", "growth_threshold")} == method.measured["plugins"]["clp"]
    with pytest.raises(ValueError, match="set twice"):
        Method("x", "x", plugins={"clp": {"trace_window": 10}}, measured={"plugins": {"clp": {"trace_window": 50}}})
    with pytest.raises(ValueError, match="does not run"):
        Method("x", "x", plugins={}, measured={"plugins": {"clp": {"trace_window": 50}}})
    assert isinstance(method.figures, Figures)
