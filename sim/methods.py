"""Named methods: an aggregation strategy, a list of plug-ins with their settings, a clock policy.

The simulator runs several methods on identical streams, devices and seeds and compares them.
A method's behaviour lives in its package (``streamfl.methods``), which lists its own named runs
(``presets``); here they are collected, beside the two strategies' own runs. ``plugins`` maps each
coordinator plug-in to switch on to its settings (the devices' plug-ins follow the coordinator's
models); methods compose by listing several plug-ins.
"""
from typing import Dict, Iterable, List

from streamfl import methods as method_packages
from streamfl.errors import ConfigError
from streamfl.methods.base import FEDASYNC, FEDAVG, Method

METHODS: Dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add ``method`` to the registry (a name may be registered once)."""
    if method.name in METHODS:
        raise ValueError("method %r is already registered" % method.name)
    METHODS[method.name] = method
    return method


def _refresh() -> None:
    """Add the named runs of methods registered since (``streamfl.methods.register``)."""
    for preset in method_packages.presets():
        if preset.name not in METHODS:
            register(preset)


def get_method(name: str) -> Method:
    """The method called ``name``; ``ConfigError`` listing the known ones otherwise."""
    if name not in METHODS:
        _refresh()
    try:
        return METHODS[name]
    except KeyError:
        raise ConfigError("unknown method %r (known: %s)" % (name, ", ".join(sorted(METHODS)))) from None


def resolve(names: Iterable[str]) -> List[Method]:
    """Methods by name, in order, without repeats; ``ConfigError`` on an unknown name."""
    out: List[Method] = []
    for name in names:
        method = get_method(name.strip())
        if method not in out:
            out.append(method)
    if not out:
        raise ConfigError("no method named")
    return out


register(Method("fedasync", "FedAsync: every update mixed in as it arrives, weighted by staleness "
                            "(Xie et al. 2019)", coordinator=FEDASYNC))
register(Method("fedavg", "synchronous FedAvg: sample-weighted average of one update per device per "
                          "round, rounds bounded by a deadline (McMahan et al. 2017)",
                coordinator=FEDAVG))
_refresh()

__all__ = ["Method", "METHODS", "register", "get_method", "resolve"]
