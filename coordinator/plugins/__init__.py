"""The coordinator's side of the methods: the plug-ins a config lists, built in calling order.

The plug-in classes come from the methods' packages (``streamfl.methods``); this module validates
their settings and builds them, naming none.
"""
from typing import Any, Dict, List, Mapping, Type

from streamfl.coordinator.plugins.base import (
    Addressed, Aggregation, CoordinatorPlugin, FleetView, MethodState,
)
from streamfl.plugins import build_settings


def registered() -> Dict[str, Type[CoordinatorPlugin]]:
    """The methods' coordinator plug-ins by name, in calling order (``streamfl.methods``)."""
    from streamfl import methods
    return methods.coordinator_plugins()


def plugin_configs(settings: Mapping[str, Any], strategy: str) -> Dict[str, Any]:
    """``{name: settings dataclass}`` in calling order from ``{name: mapping or dataclass}``.

    ``ValueError`` names an unknown plug-in, a bad key (via ``ConfigError``), a missing requirement
    or a strategy the plug-in cannot run under.
    """
    plugins = registered()
    unknown = sorted(set(settings) - set(plugins))
    if unknown:
        raise ValueError("unknown plug-in %r (known: %s)" % (unknown[0], ", ".join(plugins)))
    out: Dict[str, Any] = {}
    for name, cls in plugins.items():
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
    plugins = registered()
    built: Dict[str, CoordinatorPlugin] = {}
    for name, config in configs.items():
        built[name] = plugins[name](config, fleet, dict(built))
    return list(built.values())


__all__ = ["registered", "plugin_configs", "make_plugins", "CoordinatorPlugin", "Aggregation",
           "Addressed", "FleetView", "MethodState"]
