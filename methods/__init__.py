"""The learning methods, one package each, loaded in calling order.

``BUILTIN`` lists the packages shipped here; the order is the plug-ins' calling order on both
sides (a plug-in that reads another, such as CriticalFL reading the CLP probe, comes after it) and
the order named simulator runs are listed in. A method from elsewhere joins after them: a package
of another distribution declares it under the ``streamfl.methods`` entry-point group
(``name = "package:METHOD"``), and a program or a test calls ``register(METHOD)``.

Adding a method takes its package (``__init__.py`` declaring ``METHOD``, the plug-ins, payloads,
presets, docs page) and its name in ``BUILTIN``; docs/architecture.md walks through it.

The named methods (``Method`` values: the strategies' own ``fedasync`` and ``fedavg``, then every
package's presets in calling order) are one registry here, shared by the simulator
(``streamfl sim --methods``), the coordinator (``streamfl-coordinator --method``) and
``streamfl methods``: ``named_methods``, ``named_method``, ``resolve_named``, ``register_named``.
"""
import importlib
import logging
import threading
from typing import Dict, Iterable, List, Optional, Type

from streamfl.errors import ConfigError
from streamfl.methods.base import FEDASYNC, FEDAVG, Figures, Method, MethodPackage, ReportSection

log = logging.getLogger(__name__)

#: The shipped methods' packages (``streamfl.methods.<name>``), in calling order.
BUILTIN = ("clp", "fedcurv", "criticalfl", "sampling", "balance", "schedule", "stewc", "sessions",
           "sfedpo", "importance", "adaptive_lr")

#: The entry-point group other distributions declare their methods under.
ENTRY_POINT_GROUP = "streamfl.methods"

_lock = threading.RLock()
_packages: Dict[str, MethodPackage] = {}
_loaded = False


def _add(package: MethodPackage) -> None:
    """Register ``package``'s payload types (importing its payload module registers them with the
    codec) and keep it; ``ValueError`` on a name taken."""
    if package.name in _packages:
        raise ValueError("method %r is already registered" % package.name)
    if package.payloads is not None:
        package.resolve(package.payloads)
    _packages[package.name] = package


def _load() -> None:
    global _loaded
    with _lock:
        if _loaded:
            return
        _loaded = True
        # The payload a coordinator running a named method sends the boards (not a method).
        importlib.import_module("%s.agent_side" % __name__)
        for name in BUILTIN:
            _add(importlib.import_module("%s.%s" % (__name__, name)).METHOD)
        for point in _entry_points():
            try:
                _add(point.load())
            except Exception as exc:  # another distribution's bug must not stop the fleet
                log.error("method %s from entry point %s not loaded: %s", point.name, point.value, exc)


def _entry_points() -> list:
    """The ``streamfl.methods`` entry points of the installed distributions (Python 3.8 and 3.9,
    which boards on JetPack 5 run, return a dict from ``entry_points()``; 3.10+ select by group)."""
    from importlib.metadata import entry_points
    found = entry_points()
    if hasattr(found, "select"):
        return list(found.select(group=ENTRY_POINT_GROUP))
    return list(found.get(ENTRY_POINT_GROUP, ()))


def register(package: MethodPackage) -> MethodPackage:
    """Add a method from outside this distribution (after the shipped ones); ``ValueError`` if its
    name is taken."""
    _load()
    with _lock:
        _add(package)
    return package


def unregister(name: str) -> None:
    """Remove a method ``register`` added (tests that add a toy method clean up with it)."""
    _load()
    with _lock:
        if name in BUILTIN:
            raise ValueError("method %r ships with streamfl and cannot be removed" % name)
        _packages.pop(name, None)


def packages() -> Dict[str, MethodPackage]:
    """Every method's declaration by name, in calling order."""
    _load()
    with _lock:
        return dict(_packages)


def get(name: str) -> Optional[MethodPackage]:
    """The method called ``name``, None if none is."""
    return packages().get(name)


def coordinator_plugins() -> Dict[str, Type]:
    """``{name: CoordinatorPlugin subclass}`` of the methods with a coordinator side, in calling order."""
    out = {}
    for name, package in packages().items():
        cls = package.coordinator_class()
        if cls is not None:
            out[name] = cls
    return out


def agent_plugins() -> Dict[str, Type]:
    """``{name: AgentPlugin subclass}`` of the methods with a device side, in calling order."""
    out = {}
    for name, package in packages().items():
        cls = package.agent_class()
        if cls is not None:
            out[name] = cls
    return out


def buffer_policies() -> Dict[str, Type]:
    """``{name: ReplacementPolicy subclass}`` the methods lend the agent's buffer."""
    out = {}
    for package in packages().values():
        for ref in package.buffer_policies:
            cls = package.resolve(ref)
            out[cls.name] = cls
    return out


def presets() -> List[Method]:
    """Every method's named simulator runs, in calling order."""
    return [preset for package in packages().values() for preset in package.preset_list()]


def report_sections() -> Dict[str, ReportSection]:
    """``{section name: ReportSection}`` over every method (``streamfl report --section``)."""
    return {section.name: section for package in packages().values() for section in package.reports}


def report_renderer(section: str):
    """The render function of report section ``section``; ``KeyError`` if no method has it."""
    for package in packages().values():
        found = package.report(section)
        if found is not None:
            return found
    raise KeyError(section)


# ---- named methods --------------------------------------------------------------------------

#: The aggregation strategies' own named runs, listed before the methods' presets.
BASELINES = (
    Method("fedasync", "FedAsync: every update mixed in as it arrives, weighted by staleness "
                       "(Xie et al. 2019)", coordinator=FEDASYNC,
           when="the reference for an asynchronous fleet and the fallback where no measured method "
                "fits yours; on the AdaCLP-regime runs (40 boards training back to back) only "
                "class-balanced mixing beat it by more than the spread over seeds",
           figures=Figures("configs/scenarios/adaclp-paper-extreme.yaml", sets=("method_lr.fedasync=0.4",),
                           table="Extreme setting, smartwatch data")),
    Method("fedavg", "synchronous FedAvg: sample-weighted average of one update per device per "
                     "round, rounds bounded by a deadline (McMahan et al. 2017)", coordinator=FEDAVG,
           when="synchronous rounds under a deadline: the best average over periods in ST-EWC's "
                "runs; 22 points behind FedAsync in the 30 s AdaCLP-regime run (3 seeds, each at its "
                "best rate: too few rounds)",
           figures=Figures("configs/scenarios/stewc-domain-incremental.yaml", table="MNIST-5k (PermutedMNIST)")),
)

#: Every named method by name, in listing order (``named_methods`` keeps it up to date).
_named: Dict[str, Method] = {}


def register_named(method: Method) -> Method:
    """Add a named method (a name may be registered once; ``ValueError`` otherwise)."""
    with _lock:
        if method.name in _named:
            raise ValueError("method %r is already registered" % method.name)
        _named[method.name] = method
    return method


def named_methods() -> Dict[str, Method]:
    """Every named method by name: the strategies' own runs, then each method package's presets
    in calling order, with those of methods registered since. The same dict on every call."""
    with _lock:
        for method in BASELINES + tuple(presets()):
            if method.name not in _named:
                _named[method.name] = method
        return _named


def named_method(name: str) -> Method:
    """The named method ``name``; ``ConfigError`` listing the known ones otherwise."""
    known = named_methods()
    try:
        return known[name]
    except (KeyError, TypeError):
        raise ConfigError("unknown method %r (known: %s)" % (name, ", ".join(sorted(known)))) from None


def resolve_named(names: Iterable[str]) -> List[Method]:
    """Named methods, in order, without repeats; ``ConfigError`` on an unknown name or none."""
    out: List[Method] = []
    for name in names:
        method = named_method(name.strip())
        if method not in out:
            out.append(method)
    if not out:
        raise ConfigError("no method named")
    return out


__all__ = ["BUILTIN", "ENTRY_POINT_GROUP", "Method", "MethodPackage", "ReportSection", "register",
           "unregister", "packages", "get", "coordinator_plugins", "agent_plugins", "buffer_policies",
           "presets", "report_sections", "report_renderer", "BASELINES", "register_named",
           "named_methods", "named_method", "resolve_named"]
