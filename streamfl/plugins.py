"""What the coordinator's and the agent's plug-in settings share: each side builds a plug-in's
``Config`` dataclass from the YAML's ``plugins: {name: {key: value}}`` the same way."""
from typing import Any, Type

from streamfl.config import build
from streamfl.errors import ConfigError


def build_settings(cls: Type[Any], name: str, value: Any) -> Any:
    """``cls.Config`` from a mapping (None: the defaults), or ``value`` if it already is one;
    ``ValueError`` naming ``plugins.<name>`` and the bad key."""
    if isinstance(value, cls.Config):
        return value
    try:
        return build(cls.Config, value or {}, "plugins.%s" % name)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
