"""The messages streamfl devices and coordinator exchange (docs/architecture.md), as plain dataclasses.

Tensors are ``Dict[str, numpy.ndarray]`` keyed by the model's state-dict names, so the protocol needs
no torch. Every field that is not a tensor travels in the frame's JSON header; the codec
(``streamfl.protocol.codec``) turns these objects into frames and back.
"""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

import numpy as np

Tensors = Dict[str, np.ndarray]

#: Wire format version of the JSON header schema; bump on incompatible change.
PROTOCOL_VERSION = 1


@dataclass
class Hello:
    """Published retained on the device's status topic on every connect: who the device is."""

    device_id: str
    board: str
    software_version: str
    arch_id: str
    buffer_capacity: int
    dvfs_levels: Dict[str, List[int]] = field(default_factory=dict)
    online: bool = True
    #: A random id of the agent process, new at every start: a Hello from an instance the device
    #: had before another took its place means two processes (two boards) share this device id
    #: (``coordinator/registry.py``). "" = not said (agents before it; optional on the wire).
    instance: str = ""


@dataclass
class Offline:
    """The device's (or coordinator's) last will and clean-exit status: it is gone."""

    device_id: str
    reason: str = "lost"


@dataclass
class CoordinatorStatus:
    """Retained on the coordinator status topic: online with the current version, or offline (will)."""

    online: bool
    version: int = 0
    #: The run whose versions these are (see ``GlobalModel.run_id``).
    run_id: str = ""
    #: Who says it, so that another coordinator of the fleet can name it (``coordinator/
    #: liveness.py``): its MQTT client id, host, process id, start (wall clock, s), a random id of
    #: the process, and the ``instance`` of the coordinator it took over ("" for none).
    client_id: str = ""
    host: str = ""
    pid: int = 0
    started_s: float = 0.0
    instance: str = ""
    took_over: str = ""


@dataclass
class GlobalModel:
    """The retained global model at ``version``, with the knobs devices should train with."""

    version: int
    arch_id: str
    tensors: Tensors
    hparams: Dict[str, float] = field(default_factory=dict)
    #: Plug-ins' typed payloads by kind (``streamfl.protocol.extras``), e.g. a method's state.
    extras: Dict[str, Any] = field(default_factory=dict)
    #: The coordinator run (its state folder) that made this version: versions are compared only
    #: within one run, so a coordinator restarted on a fresh state is followed, not ignored.
    #: "" = unknown (the simulator, older coordinators): plain version order.
    run_id: str = ""


@dataclass
class Update:
    """A device's model after local training from ``base_version`` (full tensors, not a delta)."""

    device_id: str
    update_id: str
    base_version: int
    arch_id: str
    tensors: Tensors
    num_samples: int
    class_counts: Dict[int, int]
    loss: float
    seconds_per_sample: float
    round_index: int = 0
    created_s: float = 0.0
    energy_j: Optional[float] = None
    clock_levels: Dict[str, int] = field(default_factory=dict)
    #: Plug-ins' round statistics by kind (``streamfl.protocol.extras``), e.g. the Fisher trace.
    extras: Dict[str, Any] = field(default_factory=dict)


@dataclass
class DeltaUpdate(Update):
    """An ``Update`` decoded from an ``int8_delta`` frame: ``tensors`` hold the change from global
    model ``base_version`` as the device held it. The coordinator adds its own copy of that
    version before anything reads them (``coordinator/deltas.py``); never encoded (not a wire type)."""


@dataclass
class Command:
    """Coordinator to one device: ``kind`` is one of ``COMMAND_KINDS`` or a plug-in's own kind
    (``COMMAND_KIND_RE``); ``params`` its arguments. A device ignores a kind nothing on it handles."""

    kind: str
    params: Dict[str, Any] = field(default_factory=dict)
    #: The coordinator run that sent it and a number that grows with every command of that run:
    #: an agent drops a command of another run or one it has seen (a replay). "" = unstamped.
    run_id: str = ""
    seq: int = 0


@dataclass
class CommandReply:
    """Coordinator to the operators: what became of the operator command stamped ``seq`` (its
    ``Command.seq``). ``ok`` False with ``error`` when nothing handles its kind or it failed;
    ``result`` is what the command asked for (``status``: the fleet's figures), JSON values."""

    kind: str
    seq: int
    ok: bool
    #: Who acted on it: ``coordinator`` for its own kinds, else the plug-ins' names.
    handled_by: List[str] = field(default_factory=list)
    error: str = ""
    result: Dict[str, Any] = field(default_factory=dict)
    run_id: str = ""


#: The kinds every agent core handles: train now, skip rounds, override hyper-parameters.
COMMAND_KINDS = ("train", "skip", "override")
#: Fleet control (docs/deployment.md, "Fleet control"): an operator's command the coordinator
#: relays to boards, each of which answers with a ``DeviceReply`` on its ``reply`` topic. The
#: agent's runtime handles them (``agent/fleet_control.py``), not its core.
FLEET_CONTROL_KINDS = ("pause", "resume", "logs", "set")
#: What any command kind must look like (plug-ins name their own).
COMMAND_KIND_RE = r"^[a-z][a-z0-9_.-]{0,63}$"


@dataclass
class Telemetry:
    """Periodic, best-effort (QoS 0) device health: buffer fill, clocks, power, temperatures, and
    the methods' cheap round statistics when the device does not train (``extras``, field-only)."""

    device_id: str
    time_s: float
    buffer_fill: int
    buffer_capacity: int
    rounds: int = 0
    power_w: Optional[float] = None
    #: Watts per rail as the board's monitor labels them (``VDD_IN``, ``VDD_CPU_GPU_CV``, ...).
    rails_w: Dict[str, float] = field(default_factory=dict)
    #: Which power meter gave ``power_w`` and ``rails_w`` (``PowerMeter.kind``: ``ina3221-hwmon``,
    #: ``jtop``, ``rapl``, ``rpi5-pmic``, ``modeled``, ...; "" = not said, as older agents send
    #: it) and whether it measures (``PowerMeter.measured``: False for a board profile's power
    #: model; None = not said), so that no view shows modelled watts as measured ones.
    power_meter: str = ""
    power_measured: Optional[bool] = None
    clocks_khz: Dict[str, int] = field(default_factory=dict)
    temperatures_c: Dict[str, float] = field(default_factory=dict)
    #: Agent plug-ins' typed reports (``streamfl.protocol.extras``), without tensor groups: what a
    #: skipping device tells the coordinator's scheduler (e.g. its class distribution).
    extras: Dict[str, Any] = field(default_factory=dict)
    #: Rounds whose training diverged since the agent started (none of them sent an update), and
    #: while rounds diverge the last one's cause: its pulls' largest lr * curvature, lr, loss and
    #: base version (``agent/divergence.py``); "" otherwise.
    diverged_rounds: int = 0
    divergence: str = ""
    #: Predictions on live windows (docs/predictions.md): per second over the last telemetry
    #: interval, the latest one's confidence (softmax maximum, 0..1), and the windows dropped from
    #: the full prediction queue since the agent started; None, None, 0 while predictions are off.
    predictions_per_s: Optional[float] = None
    prediction_confidence: Optional[float] = None
    predictions_dropped: int = 0
    #: Broker take-overs of this device id the agent counted as another board's since it started
    #: (``agent/takeover.py``): 0 unless two boards share the id.
    duplicate_id_takeovers: int = 0
    #: True while an operator's ``pause`` holds this board's rounds (``agent/fleet_control.py``):
    #: it still ingests windows and serves predictions, and starts no round until ``resume``.
    paused: bool = False
    #: The filesystem of the agent's state folder (checkpoint, outbox, clock originals): bytes
    #: free to the agent's user and its size (``shutil.disk_usage``); None = not read (older
    #: agents, or it could not be read).
    state_disk_free_bytes: Optional[int] = None
    state_disk_size_bytes: Optional[int] = None


@dataclass
class DeviceReply:
    """Device to coordinator: what became of the fleet-control ``Command`` stamped ``(run_id,
    seq)`` the coordinator sent this device. ``ok`` False with ``error`` (the reason) when the
    board refused it; ``result`` is the answer (``logs``: its recent lines; ``set``: the old and new
    value), JSON values the coordinator checks per kind (``protocol/control.py``)."""

    device_id: str
    kind: str
    seq: int
    ok: bool
    error: str = ""
    result: Dict[str, Any] = field(default_factory=dict)
    run_id: str = ""


Message = Union[Hello, Offline, CoordinatorStatus, GlobalModel, Update, Command, Telemetry, CommandReply,
                DeviceReply]

#: Wire names of the message types, used as the ``type`` field of a frame header.
MESSAGE_TYPES = {
    "hello": Hello,
    "offline": Offline,
    "coordinator_status": CoordinatorStatus,
    "global_model": GlobalModel,
    "update": Update,
    "command": Command,
    "telemetry": Telemetry,
    "command_reply": CommandReply,
    "device_reply": DeviceReply,
}
TYPE_NAMES = {cls: name for name, cls in MESSAGE_TYPES.items()}
