"""The coordinator's configuration: frozen dataclasses loaded from YAML, overridden by CLI flags.

Every key is documented in ``configs/coordinator.example.yaml``; unknown keys and wrong types are
``ConfigError`` (exit code 2; docs/configuration.md). Secrets (the MQTT password) come only from
a file.

A named method (``method: NAME`` or ``--method NAME``, ``streamfl methods``) is resolved on load
(``resolve_method``): its coordinator keys and plug-ins are laid over the file, the way the
simulator lays a method over a scenario, so a name means on a fleet what it meant in the results.
The method's keys win: a key of the file that the method sets is replaced (a WARNING, old ->
new), a default it changes is said at INFO, and plug-ins the file lists beyond the method's do not
run (a WARNING). Everything the method does not name (hparams, the plug-ins' other settings,
admission, MQTT, ...) is the file's. To change a key the method sets, write the method out
(``streamfl methods --show NAME``) and leave ``method`` unset.
"""
import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from streamfl.config import (FRAME_BYTES_MAX, SEED_MAX, bounded, build, merge, read_values,
                             resolve_encoding, to_dict)
from streamfl.coordinator.plugins import plugin_configs
from streamfl.coordinator.admission import AdmissionConfig
from streamfl.coordinator.fleet import FleetTableConfig
from streamfl.coordinator.intake import IntakeConfig
from streamfl.coordinator.monitor.config import MonitorConfig
from streamfl.coordinator.liveness import ExclusiveConfig
from streamfl.coordinator.operator_gate import OperatorConfig
from streamfl.coordinator.fleet_control import FleetControlConfig
from streamfl.coordinator.strategies import STALENESS_NAMES, STRATEGY_NAMES
from streamfl.coordinator.strategies.fedavg import COMBINE_NAMES
from streamfl.errors import ConfigError
from streamfl.models import ModelSpec
from streamfl.protocol.topics import validate_name
from streamfl.protocol.transport.config import MqttConfig

log = logging.getLogger(__name__)

#: The ``model_encoding`` values (``streamfl.protocol.codec.ENCODINGS`` a global model may use).
MODEL_ENCODINGS = ("float32", "float16", "int8")


@dataclass(frozen=True)
class HParams:
    """Training knobs shipped to devices in every GlobalModel (``hparams``)."""

    #: Learning rate sent to the devices with every global model (plug-ins such as clp may refine
    #: it).
    lr: float = bounded(0.01, 0, 10.0, lo_open=True)
    #: Minibatch size (windows) sent to the devices with every global model.
    batch_size: int = bounded(32, 1, 65536)
    #: SGD steps per local round, sent to the devices with every global model.
    local_steps: int = bounded(20, 1, 100000)
    #: Dropout probability during local training, in [0, 1), sent with every global model.
    dropout: float = bounded(0.0, 0.0, 1.0, hi_open=True)
    #: The learning rate sent with version v is ``lr * lr_decay_per_version ** v``: an exponential
    #: decay per aggregation (FedTeddi trains at 0.01 x 0.9992 a round); 1 keeps ``lr``.
    lr_decay_per_version: float = bounded(1.0, 0.0, 1.0, lo_open=True)

    def __post_init__(self) -> None:
        if not 0 < self.lr < float("inf"):
            raise ValueError("hparams.lr must be finite and > 0, got %r" % self.lr)
        if self.batch_size < 1 or self.local_steps < 1:
            raise ValueError("hparams.batch_size and hparams.local_steps must be >= 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError("hparams.dropout must be in [0, 1), got %r" % self.dropout)
        if not 0.0 < self.lr_decay_per_version <= 1.0:
            raise ValueError("hparams.lr_decay_per_version must be in (0, 1], got %r"
                             % (self.lr_decay_per_version,))

    def as_dict(self, version: int = 0) -> Dict[str, float]:
        """What the devices get with global version ``version`` (the learning rate decayed to it)."""
        lr = self.lr * self.lr_decay_per_version ** max(0, int(version))  # exact lr at decay 1
        return {"lr": lr, "batch_size": self.batch_size, "local_steps": self.local_steps,
                "dropout": self.dropout}


@dataclass(frozen=True)
class FedAvgConfig:
    """Synchronous FedAvg rounds: wait for all online devices, at most ``deadline_s`` seconds.

    clients_per_round: close a round once this many devices reported (null: every device online
      at round start); plug-ins such as CriticalFL or client sampling set it as they go.
    combine: ``mean`` (sample-weighted, McMahan et al.), or robust to a minority of hostile
      devices: ``median`` (coordinate-wise) or ``trimmed_mean`` (drops ``trim_ratio`` of the
      values at each end per coordinate; 0.1 tolerates one bad device in ten).
    """

    #: Seconds a round waits for the devices online at its start; at the deadline it aggregates if
    #: min_updates arrived, else the deadline restarts.
    deadline_s: float = bounded(30.0, 0, 86400.0, lo_open=True)
    #: Updates a round needs before it may aggregate.
    min_updates: int = bounded(1, 1, 10 ** 6)
    clients_per_round: Optional[int] = bounded(None, 1, 10 ** 6)
    combine: str = "mean"
    #: combine: trimmed_mean only: the share of values dropped at each end per coordinate, in [0,
    #: 0.5).
    trim_ratio: float = bounded(0.1, 0.0, 0.5, hi_open=True)

    def __post_init__(self) -> None:
        if not self.deadline_s > 0:
            raise ValueError("fedavg.deadline_s must be > 0, got %r" % self.deadline_s)
        if self.min_updates < 1:
            raise ValueError("fedavg.min_updates must be >= 1, got %r" % self.min_updates)
        if self.clients_per_round is not None and self.clients_per_round < 1:
            raise ValueError("fedavg.clients_per_round must be >= 1 or null, got %r"
                             % (self.clients_per_round,))
        if self.combine not in COMBINE_NAMES:
            raise ValueError("fedavg.combine must be one of %s, got %r" % (", ".join(COMBINE_NAMES), self.combine))
        if not 0.0 <= self.trim_ratio < 0.5:
            raise ValueError("fedavg.trim_ratio must be in [0, 0.5), got %r" % (self.trim_ratio,))


@dataclass(frozen=True)
class CoordinatorConfig:
    """Everything the coordinator needs besides the state and run directories."""

    #: Fleet name: the topic prefix streamfl/v1/<fleet>/... ([A-Za-z0-9_.-], 1-64 characters).
    fleet: str = "default"
    model: ModelSpec = field(default_factory=ModelSpec)
    #: Aggregation: fedasync (one new version per update) or fedavg (synchronous rounds, see
    #: fedavg).
    strategy: str = "fedasync"
    #: FedAsync mixing weight; public implementations use 0.6-0.9 (Xie et al. 2019, FedAsync).
    alpha: float = bounded(0.6, 0.0, 1.0, lo_open=True)
    #: FedAsync's staleness function s(t - tau) that scales alpha: constant, polynomial ((1 +
    #: staleness)^-a) or hinge (1 up to b versions, then falling with a).
    staleness: str = "polynomial"
    #: Staleness parameters; null = the paper's default (polynomial a=0.5; hinge a=10, b=4).
    staleness_a: Optional[float] = bounded(None, 0.0, 100.0)
    #: Hinge staleness grace period b, in versions; null = 4 (the paper's default). Ignored by the
    #: other functions.
    staleness_b: Optional[float] = bounded(None, 0.0, 1e6)
    #: FedAsync drops updates older than this many versions; null = never.
    max_staleness: Optional[int] = bounded(None, 0, 10 ** 9)
    fedavg: FedAvgConfig = field(default_factory=FedAvgConfig)
    hparams: HParams = field(default_factory=HParams)
    #: The methods' plug-ins to run, each with its settings: ``{name: {key: value}}`` (an empty
    #: mapping takes the defaults); none by default, i.e. plain FedAsync/FedAvg. Built into each
    #: plug-in's settings dataclass on load, in calling order (``streamfl.coordinator.plugins``).
    plugins: Dict[str, Any] = field(default_factory=dict)
    #: Past global versions kept in memory, as the base models that updates are measured against; an
    #: older base falls back to the current model.
    history_size: int = bounded(10, 1, 1000)
    #: How many recent update ids are remembered to drop resent duplicates.
    dedup_window: int = bounded(4096, 1, 10 ** 7)
    #: Held-out dataset the coordinator evaluates each version on (.npz: X float32 [N, T, C], y
    #: int64 [N], subject int64 [N], classes str [K]; ``streamfl dataset`` makes one from
    #: recordings); null = no evaluation.
    eval_path: Optional[str] = None
    #: Evaluate the global model at version 0 and every this many versions (accuracy and loss go to
    #: metrics.jsonl).
    eval_every_versions: int = bounded(5, 1, 10 ** 9)
    #: Windows per forward pass of the held-out evaluation.
    eval_batch_size: int = bounded(512, 1, 65536)
    #: A version is published only once it is durable in the state folder, and saved at most this
    #: often: the model topic lags the newest aggregation by up to this much plus one save
    #: (0.5 s: fresh enough for rounds of seconds, few enough fsyncs at hundreds of updates/s).
    persist_interval_s: float = bounded(0.5, 0.0, 3600.0)
    #: Minimum seconds between two global-model publishes (0 = as fast as saving and sending allow).
    publish_min_interval_s: float = bounded(0.0, 0.0, 3600.0)
    #: The journal of received updates (``coordinator/intake.py``): each valid update is saved
    #: durably before MQTT acknowledges it, and what no saved state covers yet is handed back to
    #: the core at start, so a kill -9 loses nothing the broker acknowledged.
    intake: IntakeConfig = field(default_factory=IntakeConfig)
    #: Without held-out data (``eval_path``), log versions/s and devices online this often.
    progress_interval_s: float = bounded(60.0, 0.0, 86400.0, lo_open=True)
    #: How updates are bounded before mixing (known senders, value cap, adaptive norm bound).
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    #: The Ed25519 private key (PEM, from ``streamfl-coordinator keygen``) that signs every global
    #: model and command; null = unsigned (agents that pin a key then refuse them).
    signing_key_file: Optional[str] = None
    #: Who may command the coordinator (``streamfl operator``): pinned operator keys, how fresh a
    #: command must be, how many a minute (``coordinator/operator_gate.py``).
    operator: OperatorConfig = field(default_factory=OperatorConfig)
    #: Fleet control (``streamfl operator pause|resume|logs|set``): how long boards have to answer
    #: (``coordinator/fleet_control.py``).
    fleet_control: FleetControlConfig = field(default_factory=FleetControlConfig)
    #: One coordinator per fleet: refuse to start beside a live one, or take over from it
    #: (``coordinator/liveness.py``; ``--take-over``).
    exclusive: ExclusiveConfig = field(default_factory=ExclusiveConfig)
    #: Seed of the version-0 model (same seed and model = the same initial weights everywhere).
    seed: int = bounded(0, 0, SEED_MAX)
    #: Start a fresh run from a pre-trained model instead of the seed's random weights: a
    #: safetensors file of ``model:``'s tensors (another run's ``model.safetensors``, an agent's
    #: ``checkpoint.safetensors``), checked when the coordinator starts (architecture, tensor
    #: names and shapes, finite values). A state folder that already holds a run keeps its own
    #: model. null = the seed's weights.
    initial_model_file: Optional[str] = None
    #: How published global models go on the wire (docs/deployment.md, "Smaller messages"):
    #: ``float32``; ``float16`` (half the bytes); ``int8``, blockwise int8 weights (about 3.2-3.8x
    #: fewer bytes; boards train from the rounded model, and their ``int8_delta`` updates are
    #: added to the exact one, so the rounding never accumulates in the global model).
    model_encoding: str = "float32"
    #: Deprecated: ``model_encoding: float16`` (true still works, with a warning).
    float16: bool = False
    #: Largest frame accepted from the broker (an update), in bytes (64 MiB); larger ones are
    #: rejected.
    max_frame_bytes: int = bounded(64 * 2 ** 20, 1024, FRAME_BYTES_MAX)
    mqtt: MqttConfig = field(default_factory=MqttConfig)
    #: A named method to run (``streamfl methods`` lists them): its strategy and plug-ins are laid
    #: over this file on load, the method's keys winning (``resolve_method``), and the boards get
    #: its agent side with every global model. null = the file alone.
    method: Optional[str] = None
    #: What the boards get of ``method`` with every global model (derived on load).
    method_settings: Optional[Any] = field(default=None, init=False, compare=False, repr=False)
    #: The live fleet table's bounds: how often telemetry is logged, rows, series, and the
    #: plausible range of what devices report (``coordinator/fleet.py``).
    fleet_view: FleetTableConfig = field(default_factory=FleetTableConfig)
    #: The live dashboard, ``/metrics`` for Prometheus and the JSON API of ``streamfl status``,
    #: served on localhost by default (``coordinator/monitor/``).
    monitor: MonitorConfig = field(default_factory=MonitorConfig)

    def __post_init__(self) -> None:
        try:
            validate_name(self.fleet, "fleet")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        if self.strategy not in STRATEGY_NAMES:
            raise ValueError("strategy must be one of %s, got %r" % (
                ", ".join(STRATEGY_NAMES), self.strategy))
        if self.staleness not in STALENESS_NAMES:
            raise ValueError("staleness must be one of %s, got %r" % (
                ", ".join(STALENESS_NAMES), self.staleness))
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError("alpha must be in (0, 1], got %r" % self.alpha)
        for key in ("staleness_a", "staleness_b"):
            value = getattr(self, key)
            if value is not None and not value >= 0:  # NaN too
                raise ValueError("%s must be >= 0, got %r" % (key, value))
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError("max_staleness must be >= 0 or null, got %r" % self.max_staleness)
        for key in ("history_size", "dedup_window", "eval_every_versions", "eval_batch_size",
                    "max_frame_bytes"):
            if getattr(self, key) < 1:
                raise ValueError("%s must be >= 1, got %r" % (key, getattr(self, key)))
        if not (self.persist_interval_s >= 0 and self.publish_min_interval_s >= 0):  # NaN too
            raise ValueError("persist_interval_s and publish_min_interval_s must be >= 0")
        if not self.progress_interval_s > 0:
            raise ValueError("progress_interval_s must be > 0, got %r" % (self.progress_interval_s,))
        object.__setattr__(self, "model_encoding", resolve_encoding(
            "model_encoding", self.model_encoding, MODEL_ENCODINGS, "float16", self.float16))
        object.__setattr__(self, "plugins", plugin_configs(self.plugins, self.strategy))
        if self.method is not None:
            object.__setattr__(self, "method_settings", _method_settings(self))
        if self.signing_key_file is not None:
            from streamfl.protocol.signing import load_private_key
            try:
                load_private_key(self.signing_key_file)
            except ConfigError as exc:
                raise ValueError("signing_key_file: %s" % exc) from None



def load_config(path: Optional[Path] = None, overrides: Optional[Mapping[str, Any]] = None,
                section: Optional[str] = None,
                notes: Optional[List[Tuple[int, str]]] = None) -> CoordinatorConfig:
    """Load the YAML ``path`` (optionally one ``section``), apply flag ``overrides``, then lay the
    named ``method`` over them (``resolve_method``).

    ``overrides`` may nest, e.g. ``{"fleet": "lab", "mqtt": {"host": "broker"}}``; None means "flag not
    given". Raises ``ConfigError`` naming the file and key on any problem. What the method changed
    goes to ``notes`` as ``(logging level, message)``, or is logged when ``notes`` is None.
    """
    values, source = read_values(path, section, "coordinator config")
    said: List[Tuple[int, str]] = []
    values = resolve_method(merge(values, overrides or {}), said, source)
    config = build(CoordinatorConfig, values, source)
    if notes is None:
        for level, message in said:
            log.log(level, "%s", message)
    else:
        notes.extend(said)
    return config


# ---- named methods ------------------------------------------------------------------------------

#: A key a mapping does not hold (None is a value).
_MISSING = object()


def resolve_method(values: Mapping[str, Any], notes: List[Tuple[int, str]],
                   source: str = "coordinator config") -> Dict[str, Any]:
    """``values`` (a coordinator file with its flags merged in) with its named ``method``'s
    coordinator keys and plug-ins laid over them (module docstring), and what that changed in
    ``notes`` as ``(logging level, message)``; ``values`` unchanged without a method.
    ``ConfigError`` naming ``source`` for an unknown method."""
    from streamfl.methods import named_method
    from streamfl.methods.agent_side import split
    name = values.get("method")
    if name is None:
        return dict(values)
    if not isinstance(name, str):
        raise ConfigError("%s: key 'method': expected a method name, got %r" % (source, name))
    try:
        method = named_method(name)
    except ConfigError as exc:
        raise ConfigError("%s: key 'method': %s" % (source, exc)) from None
    out = merge(values)
    for path, value in _leaves(method.coordinator):
        _overlay(out, path, value, ".".join(path), _default_of(CoordinatorConfig, path),
                 method.name, notes)
    mine = values.get("plugins") or {}
    if not isinstance(mine, Mapping):
        raise ConfigError("%s: key 'plugins': expected a mapping, got %r" % (source, mine))
    plugins: Dict[str, Any] = {}
    for plugin, settings in method.plugins.items():
        held = mine.get(plugin) or {}
        plugins[plugin] = dict(held) if isinstance(held, Mapping) else held
        if plugin not in mine:
            notes.append((logging.INFO, "method %s runs plug-in %s" % (method.name, plugin)))
        for key, value in settings.items():
            _overlay(plugins, (plugin, key), value, "plugins.%s.%s" % (plugin, key),
                     _plugin_default(plugin, key), method.name, notes)
    dropped = [plugin for plugin in mine if plugin not in method.plugins]
    if dropped:
        notes.append((logging.WARNING, "method %s runs the plug-ins %s; plugins.%s of the file do "
                      "not run (list the plug-ins without a method to compose them)" % (
                          method.name, ", ".join(method.plugins) or "(none)", ", plugins.".join(dropped))))
    out["plugins"] = plugins
    side = split(method)
    if side.board:
        notes.append((logging.WARNING, "method %s needs %s in every agent's YAML: a board's own "
                      "settings, never sent" % (method.name, _flat(side.board))))
    if side.sent:
        notes.append((logging.INFO, "method %s: the boards get %s with every global model"
                      % (method.name, _flat(side.sent))))
    return out


def _overlay(out: Dict[str, Any], path: Tuple[str, ...], value: Any, label: str, default: Any,
             method: str, notes: List[Tuple[int, str]]) -> None:
    """Set ``path`` of ``out`` to the method's ``value``, noting (as ``label``) what it replaced:
    the file's value (WARNING) or the default (INFO)."""
    node = out
    for part in path[:-1]:
        inner = node.get(part)
        node[part] = dict(inner) if isinstance(inner, Mapping) else {}
        node = node[part]
    old = node.get(path[-1], _MISSING)
    if old is _MISSING:
        if default is not _MISSING and default != value:
            notes.append((logging.INFO, "method %s sets %s: %r (default) -> %r"
                          % (method, label, default, value)))
    elif old != value:
        notes.append((logging.WARNING, "method %s sets %s: %r (the file's) -> %r"
                      % (method, label, old, value)))
    node[path[-1]] = value


def _leaves(values: Mapping[str, Any], prefix: Tuple[str, ...] = ()):
    """``(path, value)`` of every non-mapping value of a nested mapping."""
    for key, value in values.items():
        if isinstance(value, Mapping):
            yield from _leaves(value, prefix + (key,))
        else:
            yield prefix + (key,), value


def _default_of(cls: type, path: Tuple[str, ...]) -> Any:
    """The default of the dataclass field at ``path`` (``_MISSING`` if there is none)."""
    for i, part in enumerate(path):
        found = next((f for f in dataclasses.fields(cls) if f.name == part), None)
        if found is None:
            return _MISSING
        if found.default is not dataclasses.MISSING:
            value = found.default
        elif found.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            value = found.default_factory()  # type: ignore[misc]
        else:
            return _MISSING
        if i == len(path) - 1:
            return to_dict(value) if dataclasses.is_dataclass(value) else value
        if not dataclasses.is_dataclass(value):
            return _MISSING
        cls = type(value)
    return _MISSING


def _plugin_default(plugin: str, key: str) -> Any:
    from streamfl.coordinator.plugins import registered
    cls = registered().get(plugin)
    return _MISSING if cls is None else _default_of(cls.Config, (key,))


def _flat(values: Mapping[str, Any]) -> str:
    """``a.b: 1, c: x`` for a nested mapping."""
    return ", ".join("%s: %s" % (".".join(path), value) for path, value in _leaves(values)) or "nothing"


def _plain(value: Any) -> Any:
    """A config value as a YAML file would give it (tuples as lists, dataclasses as mappings)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_dict(value)
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _method_settings(config: "CoordinatorConfig") -> Any:
    """The ``method_settings`` extra of ``config.method``, once ``config`` is checked to run the
    method's coordinator side (a config built without ``load_config`` must have laid it over
    itself); ``ValueError`` naming the first difference."""
    from streamfl.errors import ProtocolError
    from streamfl.methods import named_method
    from streamfl.methods.agent_side import method_settings
    from streamfl.plugins import renamed_keys
    try:
        method = named_method(config.method)
    except ConfigError as exc:
        raise ValueError("method: %s" % exc) from None
    wrong = []
    for path, value in _leaves(method.coordinator):
        node: Any = config
        for part in path:
            node = getattr(node, part, _MISSING)
        if _plain(node) != _plain(value):
            wrong.append("%s is %r, the method's %r" % (".".join(path), _plain(node), value))
    if set(config.plugins) != set(method.plugins):
        wrong.append("plugins are %s, the method's %s" % (sorted(config.plugins), sorted(method.plugins)))
    else:
        for plugin, settings in method.plugins.items():
            held = config.plugins[plugin]
            for key, value in settings.items():
                attr = renamed_keys(type(held)).get(key, key)
                if _plain(getattr(held, attr, _MISSING)) != _plain(value):
                    wrong.append("plugins.%s.%s is %r, the method's %r" % (
                        plugin, key, _plain(getattr(held, attr, None)), value))
    if wrong:
        raise ValueError("method %s: %s (load the file with load_config, which lays the method "
                         "over it)" % (method.name, "; ".join(wrong)))
    try:
        return method_settings(method)
    except ProtocolError as exc:
        raise ValueError("method %s: its agent side cannot be sent: %s" % (method.name, exc)) from None
