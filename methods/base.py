"""What a learning method is to the framework: one package that declares its parts.

A method's package (``streamfl/methods/<name>/``) holds everything of the method: the coordinator
and agent plug-ins, its payload types with their bounds, its maths, its named simulator runs, its
report section and its docs page (``README.md``). Its ``__init__.py`` declares a ``MethodPackage``
called ``METHOD`` naming those parts; the registry (``streamfl.methods``) loads the declaration,
registers the payload types with the codec and the buffer policies with the agent, and hands the
plug-in classes to the cores, which never name a method. Parts are named relative to the package
(``"coordinator:ClpProbePlugin"``), so declaring a method imports none of its code.
"""
import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

#: ``coordinator`` settings of a named run under each built-in strategy.
FEDASYNC: Dict[str, Any] = {"strategy": "fedasync"}
FEDAVG: Dict[str, Any] = {"strategy": "fedavg"}


@dataclass(frozen=True)
class Figures:
    """Where a named method's published figures come from: the scenario file and the ``--set``
    flags of the run that made them (as the Makefile's ``eval-*`` target runs it), the table of
    docs/results.md they fill, and which of that run's settings of the method's plug-ins belong
    to the run's setting rather than to the method (a fleet keeps its own), with why.

    ``tests/test_named_method_figures.py`` builds the plug-in settings of that run and those of
    ``--method NAME`` through the coordinator's config loader and the boards' settings gate, and
    fails where they differ outside ``setting_keys``; ``streamfl methods --show NAME`` prints it."""

    #: The run's scenario, relative to the repository (``configs/scenarios/NAME.yaml``).
    scenario: str
    #: The run's ``--set KEY=VALUE`` flags (``streamfl sim``), the tuned rate's among them.
    sets: Tuple[str, ...] = ()
    #: The heading of the table in docs/results.md that holds the figures.
    table: str = ""
    #: Dotted keys the run set for its setting, not the method's: ``plugins.P.K`` (coordinator
    #: plug-in ``P``) or ``agent.plugins.P.K`` (the boards' plug-in ``P``). Not carried to a fleet.
    setting_keys: Tuple[str, ...] = ()
    #: Why ``setting_keys`` are the setting's (one sentence; ``streamfl methods --show`` prints it).
    why: str = ""
    #: Other tables where the name ran with other settings of its plug-ins, and which (the name
    #: carries ``table``'s); "" where there are none.
    elsewhere: str = ""


def _layered(under: Mapping[str, Any], over: Mapping[str, Any], where: str) -> Dict[str, Any]:
    """``over`` laid over ``under``, mapping by mapping; ``ValueError`` where both set one key (a
    method's measured settings and its own never name the same key)."""
    out = {key: dict(value) if isinstance(value, Mapping) else value for key, value in over.items()}
    for key, value in under.items():
        at = "%s.%s" % (where, key) if where else key
        if isinstance(value, Mapping) and isinstance(out.get(key, {}), Mapping):
            out[key] = _layered(value, out.get(key, {}), at)
        elif key in out:
            raise ValueError("%s is set twice: in the method's own settings and in its measured ones" % at)
        else:
            out[key] = value
    return out


def settings_text(values: Mapping[str, Any], prefix: str = "") -> str:
    """``plugins.clp.trace_window: 50, ...`` for a nested mapping (``streamfl methods --show``)."""
    out = []
    for key, value in values.items():
        at = "%s.%s" % (prefix, key) if prefix else key
        out.append(settings_text(value, at) if isinstance(value, Mapping) else "%s: %s" % (at, value))
    return ", ".join(part for part in out if part)


def _without(values: Mapping[str, Any], drop: Mapping[str, Any]) -> Dict[str, Any]:
    """``values`` less the leaves ``drop`` names (mappings left empty stay, as plug-ins switched on)."""
    out: Dict[str, Any] = {}
    for key, value in values.items():
        if key in drop and isinstance(drop[key], Mapping) and isinstance(value, Mapping):
            out[key] = _without(value, drop[key])
        elif key not in drop:
            out[key] = value
    return out


@dataclass(frozen=True)
class Method:
    """A named method: the ``CoordinatorConfig`` keys it sets, the coordinator plug-ins it switches
    on with their settings, ``AgentConfig`` keys and the clock policy. The simulator runs it by
    name (``streamfl sim --methods NAME``), and so does a fleet (``streamfl-coordinator --method
    NAME``: the coordinator side becomes the coordinator's config, and the agent side reaches the
    boards with every global model, ``streamfl.methods.agent_side``). A method package lists its
    own in ``presets``."""

    name: str
    description: str
    coordinator: Dict[str, Any] = field(default_factory=dict)
    plugins: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    agent: Dict[str, Any] = field(default_factory=dict)
    #: None keeps the scenario's ``dvfs_policy`` (on a fleet: each board's own).
    dvfs_policy: Optional[str] = None
    #: One line on when to use it, from what was measured (``streamfl methods`` lists it); every
    #: shipped run says it, a run from elsewhere may leave it empty.
    when: str = ""
    #: The settings the run behind the method's published figures (``figures``) gave its
    #: plug-ins through its scenario: ``{"plugins": {name: {key: value}}, "agent": {"plugins":
    #: ...}}``. They are the method's: on construction they are laid under ``plugins`` and
    #: ``agent`` (a key there and here is an error), so a fleet (``--method NAME``) runs what the
    #: figures measured. A simulator run takes them from its scenario instead (``scenario_side``):
    #: a scenario is a setting, its ``plugins:`` say how the methods are set for it, and the
    #: figures' own scenario sets these (tests/test_named_method_figures.py checks it), so no
    #: table changes what it measured.
    measured: Dict[str, Any] = field(default_factory=dict)
    #: Where the published figures come from (None: the method has none).
    figures: Optional[Figures] = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.measured) - {"plugins", "agent"})
        if unknown:
            raise ValueError("method %s: measured settings are plugins and agent, not %s" % (self.name, unknown[0]))
        for plugin in self.measured.get("plugins") or {}:
            if plugin not in self.plugins:
                raise ValueError("method %s: measured settings of plug-in %s, which it does not run"
                                 % (self.name, plugin))
        if self.measured:
            object.__setattr__(self, "plugins", _layered(self.measured.get("plugins") or {}, self.plugins,
                                                         "%s: plugins" % self.name))
            object.__setattr__(self, "agent", _layered(self.measured.get("agent") or {}, self.agent,
                                                       "%s: agent" % self.name))

    def scenario_side(self) -> "Method":
        """The method as a simulator scenario runs it: ``measured``'s settings left to the
        scenario (the method's own settings still win over the scenario's)."""
        if not self.measured:
            return self
        return dataclasses.replace(
            self, plugins=_without(self.plugins, self.measured.get("plugins") or {}),
            agent=_without(self.agent, self.measured.get("agent") or {}), measured={})


@dataclass(frozen=True)
class ReportSection:
    """A method's section of ``streamfl report``: ``streamfl report DIR --section NAME`` calls
    ``render(dirs, methods, option, reference=..., labels=..., overview=...)`` and prints what it
    returns.

    ``render`` gets the run folders, the methods to show (None: all) and the section's option
    string (``--option``; "" where none was given), and by keyword the report's ``--reference``
    method, ``--labels`` (None: the folders' names) and ``--overview`` flag, which it may ignore."""

    name: str
    help: str
    #: ``"module:function"`` relative to the method's package.
    render: str
    #: True if the section compares several run folders (else it takes exactly one).
    many_runs: bool = False


@dataclass(frozen=True)
class MethodPackage:
    """A method's declaration: its name (the plug-ins' key under ``plugins:`` in both YAMLs) and
    where its parts live, as ``"module:Name"`` or ``"module"`` relative to ``package``."""

    #: The plug-ins' registry name on both sides.
    name: str
    #: One line for listings: what the method does.
    summary: str
    #: The Python package holding the parts (``__name__`` of the declaring ``__init__``).
    package: str
    #: ``"module:Class"`` of the ``CoordinatorPlugin``; None if the method has no coordinator side.
    coordinator: Optional[str] = None
    #: ``"module:Class"`` of the ``AgentPlugin``; None if devices need nothing of their own.
    agent: Optional[str] = None
    #: Module whose import registers the method's payload types with the codec.
    payloads: Optional[str] = None
    #: ``"module:Class"`` of buffer replacement policies the method lends the agent.
    buffer_policies: Tuple[str, ...] = ()
    #: Module with ``PRESETS``, the method's named simulator runs (``Method`` values).
    presets: Optional[str] = None
    #: The method's sections of ``streamfl report``.
    reports: Tuple[ReportSection, ...] = ()
    #: Module of the method's simulator hooks, each optional: ``device_settings(device)`` (its
    #: agent plug-in's settings from a simulated device's facts, a ``streamfl.sim.device.DeviceModel``,
    #: under the scenario's own) and ``tuned_lr_settings(lr)`` (its agent plug-in's settings for a
    #: learning rate ``streamfl tune`` found, over everything else). ``{}``: nothing to set.
    sim: Optional[str] = None

    def resolve(self, ref: str) -> Any:
        """The object ``ref`` (``"module:Name"``, ``"module"``, or ``":Name"`` for a name of the
        package itself) names, imported on demand."""
        module, _, attr = ref.partition(":")
        loaded = importlib.import_module("%s.%s" % (self.package, module) if module else self.package)
        return getattr(loaded, attr) if attr else loaded

    def coordinator_class(self) -> Optional[type]:
        return None if self.coordinator is None else self.resolve(self.coordinator)

    def agent_class(self) -> Optional[type]:
        return None if self.agent is None else self.resolve(self.agent)

    def preset_list(self) -> Tuple[Method, ...]:
        return () if self.presets is None else tuple(self.resolve(self.presets).PRESETS)

    def report(self, name: str) -> Optional[Callable[..., str]]:
        """The render function of the report section ``name``, None if the method has none."""
        section = next((s for s in self.reports if s.name == name), None)
        return None if section is None else self.resolve(section.render)
