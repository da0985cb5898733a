"""What the coordinator's and the agent's plug-in registries share: registration and settings.

Each side keeps its own registry (``streamfl.coordinator.plugins``, ``streamfl.agent.plugins``),
since the sides load different plug-ins; both register a class under its ``name`` and build its
``Config`` dataclass from the YAML's ``plugins: {name: {key: value}}`` the same way.
"""
from typing import Any, Dict, Type, TypeVar

from streamfl.config import build
from streamfl.errors import ConfigError

P = TypeVar("P")


def register_in(registry: Dict[str, Type[P]], cls: Type[P]) -> Type[P]:
    """Add ``cls`` to ``registry`` under ``cls.name`` (once); ``ValueError`` otherwise."""
    name = getattr(cls, "name", "")
    if not name or name in registry:
        raise ValueError("plug-in name %r is empty or already registered" % name)
    registry[name] = cls
    return cls


def build_settings(cls: Type[Any], name: str, value: Any) -> Any:
    """``cls.Config`` from a mapping (None: the defaults), or ``value`` if it already is one;
    ``ValueError`` naming ``plugins.<name>`` and the bad key."""
    if isinstance(value, cls.Config):
        return value
    try:
        return build(cls.Config, value or {}, "plugins.%s" % name)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
