"""Named methods for the simulator: an aggregation strategy, a list of plug-ins with their
settings, a clock policy, and how a scenario's run lays one over the scenario.

The simulator runs several methods on identical streams, devices and seeds and compares them. The
registry of named methods lives in ``streamfl.methods`` (shared with the coordinator's
``--method`` and ``streamfl methods``); this module re-exports it under the names the simulator
has always used. ``METHODS`` is the registry's own dict, kept up to date as methods register.

``run_settings`` is the one place a scenario's run of a method gets its settings (the runtime
builds every run from it, and tests/test_named_method_figures.py compares it with what
``--method NAME`` runs on a fleet): the method's plug-ins with the scenario's ``plugins:`` under
the method's own settings, the settings the method measured its figures with
(``Method.measured``) left to the scenario, and a tuned rate (``method_lr``) over both.
"""
from typing import Any, Dict, Tuple

from streamfl.config import merge
from streamfl import methods as method_packages
from streamfl.methods import named_method as get_method
from streamfl.methods import named_methods, register_named as register, resolve_named as resolve
from streamfl.methods.base import Method

METHODS = named_methods()


def plugin_settings(hook: str, *args: Any) -> Dict[str, Any]:
    """``{"plugins": {name: settings}}`` from every method package whose simulator hooks
    (``MethodPackage.sim``) define ``hook``, called with ``args``; empty settings are left out."""
    out = {}
    for name, package in method_packages.packages().items():
        fn = None if package.sim is None else getattr(package.resolve(package.sim), hook, None)
        settings = {} if fn is None else fn(*args)
        if settings:
            out[name] = settings
    return {"plugins": out} if out else {}


def run_settings(scenario: Any, method: Method) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """``(coordinator values, agent values)`` of ``scenario``'s run of ``method``: the
    ``CoordinatorConfig`` and ``AgentConfig`` keys it sets over the configs' defaults, before the
    run's own keys (fleet, seed, model, sensor) and each device's facts."""
    side = method.scenario_side()
    plugins = {name: merge(scenario.plugins.get(name, {}), settings)
               for name, settings in side.plugins.items()}
    lr = scenario.method_lr.get(method.name)
    coordinator = merge(scenario.coordinator, method.coordinator, {"plugins": plugins},
                        {} if lr is None else {"hparams": {"lr": lr}})
    # A tuned rate is the coordinator's lr and whatever rate settings the methods' agent
    # plug-ins keep of their own (``tuned_lr_settings``), over the scenario's and the method's.
    agent = merge(scenario.agent, side.agent, {} if lr is None else plugin_settings("tuned_lr_settings", lr))
    return coordinator, agent


__all__ = ["Method", "METHODS", "register", "get_method", "resolve", "run_settings"]
