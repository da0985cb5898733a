"""The coordinator's method plug-ins, registered by name; the core builds those a config lists.

Adding a method: one file here with its plug-in class and settings dataclass, one ``register``
line below (order matters: a plug-in comes after those it ``requires``), and, if devices must act
on it, the agent side's file and line (``streamfl.agent.plugins``). docs/architecture.md walks
through an example.
"""
from typing import Any, Dict, List, Mapping, Type

from streamfl.coordinator.plugins.base import (
    Addressed, Aggregation, CoordinatorPlugin, FleetView,
)
from streamfl.coordinator.plugins.adaptive_lr import AdaptiveLrPlugin
from streamfl.coordinator.plugins.balance import BalancePlugin
from streamfl.coordinator.plugins.clp import ClpProbePlugin
from streamfl.coordinator.plugins.criticalfl import CriticalFlPlugin
from streamfl.coordinator.plugins.fedcurv import FedCurvPlugin
from streamfl.coordinator.plugins.importance import ImportancePlugin
from streamfl.coordinator.plugins.sampling import SamplingPlugin
from streamfl.coordinator.plugins.schedule import SchedulePlugin
from streamfl.coordinator.plugins.sessions import SessionsPlugin
from streamfl.coordinator.plugins.sfedpo import SfedpoPlugin
from streamfl.coordinator.plugins.stewc import StEwcPlugin
from streamfl.plugins import build_settings, register_in

#: Registered plug-ins in calling order.
PLUGINS: Dict[str, Type[CoordinatorPlugin]] = {}


def register(cls: Type[CoordinatorPlugin]) -> Type[CoordinatorPlugin]:
    """Add a plug-in class under ``cls.name`` (once)."""
    return register_in(PLUGINS, cls)


register(ClpProbePlugin)
register(FedCurvPlugin)
register(CriticalFlPlugin)
register(SamplingPlugin)
register(BalancePlugin)
register(SchedulePlugin)
register(StEwcPlugin)
register(SessionsPlugin)
register(SfedpoPlugin)
register(ImportancePlugin)
register(AdaptiveLrPlugin)


def plugin_configs(settings: Mapping[str, Any], strategy: str) -> Dict[str, Any]:
    """``{name: settings dataclass}`` in calling order from ``{name: mapping or dataclass}``.

    ``ValueError`` names an unknown plug-in, a bad key (via ``ConfigError``), a missing requirement
    or a strategy the plug-in cannot run under.
    """
    unknown = sorted(set(settings) - set(PLUGINS))
    if unknown:
        raise ValueError("unknown plug-in %r (known: %s)" % (unknown[0], ", ".join(PLUGINS)))
    out: Dict[str, Any] = {}
    for name, cls in PLUGINS.items():
        if name not in settings:
            continue
        value = settings[name]
        config = build_settings(cls, name, value)
        missing = [r for r in cls.requires if r not in settings]
        if missing:
            raise ValueError("plugins.%s needs plug-in %s as well" % (name, ", ".join(missing)))
        cls.check(config, strategy)
        out[name] = config
    return out


def make_plugins(configs: Mapping[str, Any], fleet: FleetView) -> List[CoordinatorPlugin]:
    """Instances for ``plugin_configs``'s output, in calling order."""
    built: Dict[str, CoordinatorPlugin] = {}
    for name, config in configs.items():
        built[name] = PLUGINS[name](config, fleet, dict(built))
    return list(built.values())


__all__ = ["PLUGINS", "register", "plugin_configs", "make_plugins", "CoordinatorPlugin", "Aggregation",
           "Addressed", "FleetView"]
