"""The agent's side of the methods: every method's device plug-in, each dormant until needed.

``make_plugins`` builds the core's set at start; ``make_plugin`` builds one again, the same way,
when the core replaces a plug-in gone dormant.

The plug-in classes come from the methods' packages (``streamfl.methods``); settings come from the
agent YAML's ``plugins: {name: {key: value}}``; a name not given runs with its defaults.
"""
from typing import Any, Dict, List, Mapping, Type

from streamfl.agent.plugins.base import (AgentPlugin, ModelDecision, Penalty, ReportContext, RoundContext,
                                         Statistic)
from streamfl.plugins import build_settings


def registered() -> Dict[str, Type[AgentPlugin]]:
    """The methods' agent plug-ins by name, in calling order (``streamfl.methods``)."""
    from streamfl import methods
    return methods.agent_plugins()


def plugin_configs(settings: Mapping[str, Any]) -> Dict[str, Any]:
    """Every registered plug-in's settings dataclass, from ``{name: mapping or dataclass}``;
    ``ValueError`` on an unknown name or a bad key."""
    plugins = registered()
    unknown = sorted(set(settings) - set(plugins))
    if unknown:
        raise ValueError("unknown plug-in %r (known: %s)" % (unknown[0], ", ".join(plugins)))
    return {name: build_settings(cls, name, settings.get(name)) for name, cls in plugins.items()}


def make_plugin(name: str, configs: Mapping[str, Any], seed: int = 0, num_classes: int = 0) -> AgentPlugin:
    """A fresh instance of the registered plug-in ``name`` with its settings from ``configs`` (its
    defaults where they name none), told the device's ``seed`` and the model's ``num_classes``."""
    cls = registered()[name]
    plugin = cls(configs[name]) if name in configs else cls(build_settings(cls, name, None))
    plugin.bind(seed, num_classes)
    return plugin


def make_plugins(configs: Mapping[str, Any], seed: int = 0, num_classes: int = 0) -> List[AgentPlugin]:
    """One instance per registered plug-in, in calling order, each told the device's ``seed`` and
    the model's ``num_classes``."""
    plugins = [cls(configs[name]) if name in configs else cls(build_settings(cls, name, None))
               for name, cls in registered().items()]
    for plugin in plugins:
        plugin.bind(seed, num_classes)
    return plugins


__all__ = ["registered", "plugin_configs", "make_plugin", "make_plugins", "AgentPlugin", "ModelDecision",
           "Penalty", "ReportContext", "RoundContext", "Statistic"]
