"""What the coordinator's and the agent's plug-in settings share: each side builds a plug-in's
``Config`` dataclass from the YAML's ``plugins: {name: {key: value}}`` the same way.

A ``Config`` may declare ``RENAMED: ClassVar[Dict[str, str]]``, old key -> new key, so that files
written before a key was renamed still load: the old key is read as the new one, with one warning
naming both (per plug-in and key, per process); a mapping that gives both is refused.
"""
import logging
from typing import Any, Dict, Mapping, Set, Tuple, Type

from streamfl.config import build
from streamfl.errors import ConfigError

log = logging.getLogger(__name__)

#: (plug-in name, old key) pairs already warned about: a simulated fleet builds every device's
#: settings from the same file, and one warning says it.
_warned: Set[Tuple[str, str, str]] = set()


def renamed_keys(config_cls: Type[Any]) -> Dict[str, str]:
    """``config_cls.RENAMED`` (old key -> new key), empty where it declares none."""
    return dict(getattr(config_cls, "RENAMED", None) or {})


def rename_keys(config_cls: Type[Any], values: Mapping[str, Any], source: str) -> Dict[str, Any]:
    """``values`` with each old key of ``config_cls.RENAMED`` under its new name, warning once
    naming both; ``ConfigError`` naming ``source`` and both keys when both are given."""
    renames = renamed_keys(config_cls)
    out = dict(values)
    for old, new in renames.items():
        if old not in out:
            continue
        if new in out:
            raise ConfigError("%s: keys %r and %r are the same setting (%r is its old name); "
                              "give only %r" % (source, old, new, old, new))
        out[new] = out.pop(old)
        seen = (config_cls.__qualname__, source, old)
        if seen not in _warned:
            _warned.add(seen)
            log.warning("%s: key %r is now called %r; the old name still works, rename it",
                        source, old, new)
    return out


def build_settings(cls: Type[Any], name: str, value: Any) -> Any:
    """``cls.Config`` from a mapping (None: the defaults), or ``value`` if it already is one;
    old key names (``cls.Config.RENAMED``) read as the new ones; ``ValueError`` naming
    ``plugins.<name>`` and the bad key."""
    if isinstance(value, cls.Config):
        return value
    source = "plugins.%s" % name
    try:
        values = value or {}
        if isinstance(values, Mapping):
            values = rename_keys(cls.Config, values, source)
        return build(cls.Config, values, source)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
