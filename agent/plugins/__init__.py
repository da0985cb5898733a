"""The agent's method plug-ins, registered by name; every board runs each, dormant until needed.

Adding a method's device side: one file here with its plug-in class and settings dataclass, and one
``register`` line below (order is calling order). Settings come from the agent YAML's
``plugins: {name: {key: value}}``; a name not given runs with its defaults.
"""
from typing import Any, Dict, List, Mapping, Type

from streamfl.agent.plugins.base import AgentPlugin, Penalty, ReportContext, RoundContext, Statistic
from streamfl.agent.plugins.adaptive_lr import AdaptiveLrAgentPlugin
from streamfl.agent.plugins.clp import ClpAgentPlugin
from streamfl.agent.plugins.fedcurv import FedCurvAgentPlugin
from streamfl.agent.plugins.importance import ImportanceAgentPlugin
from streamfl.agent.plugins.schedule import ScheduleAgentPlugin
from streamfl.agent.plugins.sessions import SessionsAgentPlugin
from streamfl.agent.plugins.sfedpo import SfedpoAgentPlugin
from streamfl.agent.plugins.stewc import StEwcAgentPlugin
from streamfl.plugins import build_settings, register_in

#: Registered plug-ins in calling order.
PLUGINS: Dict[str, Type[AgentPlugin]] = {}


def register(cls: Type[AgentPlugin]) -> Type[AgentPlugin]:
    """Add a plug-in class under ``cls.name`` (once)."""
    return register_in(PLUGINS, cls)


register(ClpAgentPlugin)
register(FedCurvAgentPlugin)
register(ScheduleAgentPlugin)
register(StEwcAgentPlugin)
register(SessionsAgentPlugin)
register(SfedpoAgentPlugin)
register(ImportanceAgentPlugin)
register(AdaptiveLrAgentPlugin)


def plugin_configs(settings: Mapping[str, Any]) -> Dict[str, Any]:
    """Every registered plug-in's settings dataclass, from ``{name: mapping or dataclass}``;
    ``ValueError`` on an unknown name or a bad key."""
    unknown = sorted(set(settings) - set(PLUGINS))
    if unknown:
        raise ValueError("unknown plug-in %r (known: %s)" % (unknown[0], ", ".join(PLUGINS)))
    out: Dict[str, Any] = {}
    for name, cls in PLUGINS.items():
        out[name] = build_settings(cls, name, settings.get(name))
    return out


def make_plugins(configs: Mapping[str, Any], seed: int = 0, num_classes: int = 0) -> List[AgentPlugin]:
    """One instance per registered plug-in, in calling order, each told the device's ``seed`` and
    the model's ``num_classes``."""
    plugins = [cls(configs[name]) for name, cls in PLUGINS.items()]
    for plugin in plugins:
        plugin.bind(seed, num_classes)
    return plugins


__all__ = ["PLUGINS", "register", "plugin_configs", "make_plugins", "AgentPlugin", "Penalty",
           "ReportContext", "RoundContext", "Statistic"]
