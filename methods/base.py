"""What a learning method is to the framework: one package that declares its parts.

A method's package (``streamfl/methods/<name>/``) holds everything of the method: the coordinator
and agent plug-ins, its payload types with their bounds, its maths, its named simulator runs, its
report section and its docs page (``README.md``). Its ``__init__.py`` declares a ``MethodPackage``
called ``METHOD`` naming those parts; the registry (``streamfl.methods``) loads the declaration,
registers the payload types with the codec and the buffer policies with the agent, and hands the
plug-in classes to the cores, which never name a method. Parts are named relative to the package
(``"coordinator:ClpProbePlugin"``), so declaring a method imports none of its code.
"""
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Tuple

#: ``coordinator`` settings of a named run under each built-in strategy.
FEDASYNC: Dict[str, Any] = {"strategy": "fedasync"}
FEDAVG: Dict[str, Any] = {"strategy": "fedavg"}


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
