"""A simulator scenario: one YAML file naming the data, the streams, the devices and the methods.

Loaded with the project's config loader, so an unknown key or a wrong type is a ``ConfigError``
naming the file and the key. The model's input shape and class count come from the dataset, so a
scenario names only the architecture (``model.name``, ``model.hidden``).
"""
import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from streamfl.config import build, parse_value, read_yaml
from streamfl.errors import ConfigError
from streamfl.sim.pretrain import PretrainConfig


@dataclass(frozen=True)
class DataConfig:
    """Which dataset, how much of it is held out for evaluation, how it is split over devices."""

    #: synthetic | watch | mnist | digits | npz (``path``), see ``streamfl.sim.datasets``.
    dataset: str = "synthetic"
    path: Optional[str] = None
    n_windows: Optional[int] = None
    #: Share of the dataset kept back for the global model's accuracy.
    holdout: float = 0.2
    #: Held-out windows come from subjects no device has (true for subject-partitioned real data).
    holdout_by_subject: bool = False
    #: subject | dirichlet | shards | iid (``streamfl.sim.partition``).
    partition: str = "subject"
    beta: float = 0.5
    shards_per_device: int = 2
    #: [lo, hi]: each device then keeps a random subset of lo..hi of its classes (class-incomplete
    #: users, AdaCLP sec. 5.1; ``streamfl.sim.partition.keep_class_subsets``); None keeps all.
    classes_per_device: Optional[Tuple[int, int]] = None

    def __post_init__(self) -> None:
        if not 0.0 < self.holdout < 1.0:
            raise ValueError("data.holdout must be in (0, 1), got %r" % self.holdout)
        cpd = self.classes_per_device
        if cpd is not None and (len(cpd) != 2 or not 1 <= cpd[0] <= cpd[1]):
            raise ValueError("data.classes_per_device must be [lo, hi] with 1 <= lo <= hi, got %r"
                             % (list(cpd),))


@dataclass(frozen=True)
class StreamConfig:
    """How each device's classes arrive over virtual time (``streamfl.sim.streams.make_streams``)."""

    kind: str = "iid"
    windows_per_s: float = 2.0
    #: The kind's own parameters (period lengths, Dirichlet beta, label overlap, ...).
    params: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.windows_per_s > 0:
            raise ValueError("stream.windows_per_s must be > 0, got %r" % self.windows_per_s)


@dataclass(frozen=True)
class ModelChoice:
    """The architecture; its input shape and classes are the dataset's."""

    name: str = "cnn1d"
    hidden: int = 64


@dataclass(frozen=True)
class Scenario:
    """Everything one ``streamfl sim`` run needs besides the methods' own settings."""

    name: str = "scenario"
    duration_s: float = 600.0
    #: Stop a run early after this many aggregations (None: run for ``duration_s``).
    max_aggregations: Optional[int] = None
    model: ModelChoice = field(default_factory=ModelChoice)
    data: DataConfig = field(default_factory=DataConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    #: Device groups: each a mapping of ``streamfl.sim.device.DeviceSpec`` keys plus ``count``.
    devices: Tuple[Dict[str, Any], ...] = ({"count": 4},)
    methods: Tuple[str, ...] = ("fedasync",)
    seeds: int = 1
    #: Evaluate the global model every this many virtual seconds.
    eval_every_s: float = 10.0
    #: Held-out windows used per evaluation (None: all of them).
    eval_windows: Optional[int] = 1000
    thresholds: Tuple[float, ...] = (0.5, 0.7, 0.8)
    #: AgentConfig keys for every device (buffer_capacity, min_buffer, round_interval_s, ...).
    #: The training hyper-parameters are not among them: as on real boards, devices train with
    #: the ``hparams`` the coordinator broadcasts with each model (``coordinator.hparams``).
    agent: Dict[str, Any] = field(default_factory=dict)
    #: CoordinatorConfig keys (alpha, staleness, hparams, fedavg, ...); a method's own win.
    coordinator: Dict[str, Any] = field(default_factory=dict)
    #: Settings of the coordinator plug-ins a method switches on, by plug-in name (e.g.
    #: ``clp: {window_m: 50}``); they apply only to methods that list the plug-in, and a method's
    #: own settings win. Device-side plug-in settings go under ``agent.plugins``.
    plugins: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    #: Learning rate per method name, e.g. a sweep's best (``streamfl tune``): the coordinator's
    #: ``hparams.lr`` and, for the CLP regulators, eta0 = lr_max (their starting rate is the
    #: baselines' rate, as in the shipped scenarios). Methods not named keep the scenario's.
    method_lr: Dict[str, float] = field(default_factory=dict)
    #: Clock policy of every device unless the method sets one.
    dvfs_policy: str = "none"
    #: Virtual seconds between coordinator ticks (FedAvg's deadline checks, plug-ins' timers).
    tick_s: float = 1.0
    #: Train version 0 beforehand on some classes, once per seed (``streamfl.sim.pretrain``):
    #: a model shipped pre-trained, as FedTeddi's new-class frames start from.
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)

    def __post_init__(self) -> None:
        if not self.duration_s > 0:
            raise ValueError("duration_s must be > 0, got %r" % self.duration_s)
        if self.seeds < 1:
            raise ValueError("seeds must be at least 1, got %r" % self.seeds)
        if not self.eval_every_s > 0 or not self.tick_s > 0:
            raise ValueError("eval_every_s and tick_s must be > 0")
        if not self.methods:
            raise ValueError("methods: name at least one method")
        if not self.devices:
            raise ValueError("devices: name at least one device group")
        for group in self.devices:
            if not isinstance(group, dict):
                raise ValueError("devices: each group must be a mapping, got %r" % (group,))
            count = group.get("count", 1)
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError("devices: count must be an integer >= 1, got %r" % (count,))
        for spec_error in _device_spec_errors(self.devices):
            raise ValueError(spec_error)
        from streamfl.coordinator.plugins import registered
        PLUGINS = registered()
        unknown = sorted(set(self.plugins) - set(PLUGINS))
        if unknown:
            raise ValueError("plugins: unknown plug-in %r (known: %s)" % (unknown[0], ", ".join(PLUGINS)))
        for name, lr in self.method_lr.items():
            if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0.0 < lr <= 10.0:
                raise ValueError("method_lr.%s: a learning rate in (0, 10], got %r" % (name, lr))
        if any(not 0.0 < t <= 1.0 for t in self.thresholds):
            raise ValueError("thresholds must be accuracies in (0, 1], got %r" % (self.thresholds,))

    @property
    def num_devices(self) -> int:
        return sum(int(g.get("count", 1)) for g in self.devices)


def _device_spec_errors(groups) -> list:
    """Each group's keys checked as a ``DeviceSpec`` now, not when a run first builds it."""
    from streamfl.sim.device import DeviceSpec
    errors = []
    for k, group in enumerate(groups):
        try:
            build(DeviceSpec, {key: v for key, v in group.items() if key != "count"}, "devices[%d]" % k)
        except ConfigError as exc:
            errors.append(str(exc))
    return errors


def parse_sets(items: Sequence[str]) -> List[Tuple[str, Any]]:
    """``KEY=VALUE`` strings (``--set``) as ``(dotted key, value)``, each value read as YAML
    (``streamfl.config.parse_value``: ``1e9`` is a number, as in a scenario file)."""
    out = []
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError("--set %r: expected KEY=VALUE with a dotted KEY (stream.params.beta=0.3)"
                              % item)
        out.append((key, parse_value(text, "--set %s" % key)))
    return out


def apply_sets(values: Dict[str, Any], sets: Sequence[Tuple[str, Any]]) -> Dict[str, Any]:
    """A deep copy of ``values`` with each dotted key set; a number indexes a list (devices.2.speed)."""
    values = copy.deepcopy(values)
    for key, value in sets:
        parts = key.split(".")
        node: Any = values
        for depth, part in enumerate(parts):
            last = depth == len(parts) - 1
            where = ".".join(parts[:depth + 1])
            if isinstance(node, list):
                if not part.lstrip("-").isdigit() or not -len(node) <= int(part) < len(node):
                    raise ConfigError("--set %s: %s is a list of %d, index it 0..%d"
                                      % (key, ".".join(parts[:depth]), len(node), len(node) - 1))
                part = int(part)
            elif not isinstance(node, dict):
                raise ConfigError("--set %s: %s is not a mapping" % (key, ".".join(parts[:depth])))
            if last:
                node[part] = value
            else:
                if isinstance(node, dict) and node.get(part) is None:
                    node[part] = {}
                node = node[part]
                if not isinstance(node, (dict, list)):
                    raise ConfigError("--set %s: %s is %r, not a mapping or list" % (key, where, node))
    return values


def load_scenario(path: Path, overrides: Optional[Dict[str, Any]] = None,
                  sets: Sequence[Tuple[str, Any]] = ()) -> Scenario:
    """``Scenario`` from YAML, then ``overrides`` (flags), then ``sets`` (``parse_sets``); a
    ``ConfigError`` names file and key. A ``None`` override is a flag not given; a set may be null."""
    path = Path(path)
    values = read_yaml(path)
    values.setdefault("name", path.stem)
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if isinstance(value, dict) and isinstance(values.get(key), dict):
            values[key] = dict(values[key], **value)
        else:
            values[key] = value
    return build(Scenario, apply_sets(values, sets), str(path))


def scenario_from_dict(values: Dict[str, Any], source: str = "scenario") -> Scenario:
    """``Scenario`` from a mapping (tests and benchmarks build scenarios in code)."""
    return build(Scenario, values, source)


def with_overrides(scenario: Scenario, **changes: Any) -> Scenario:
    """A copy with some top-level fields replaced, checked like a file."""
    try:
        return dataclasses.replace(scenario, **changes)
    except (TypeError, ValueError) as exc:
        raise ConfigError("scenario %s: %s" % (scenario.name, exc)) from exc
