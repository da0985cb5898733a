"""The agent's configuration: one YAML file into frozen dataclasses, flags override.

Unknown keys and wrong types are ``ConfigError`` naming the key and the file (exit code 2). Secrets
never live in the file: the MQTT password comes from ``mqtt.password_file`` or the environment
variable ``STREAMFL_MQTT_PASSWORD``, read by ``MqttConfig.settings`` with the environment passed in.
"""
import dataclasses
import socket
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

from streamfl.agent.buffer_policies import policies
from streamfl.agent.fleet_control import ControlConfig
from streamfl.agent.hparams import hparam_limits
from streamfl.agent.plugins import plugin_configs
from streamfl.agent.predict_config import PredictConfig
from streamfl.config import FRAME_BYTES_MAX, SEED_MAX, bounded, load, resolve_encoding
from streamfl.errors import ConfigError
from streamfl.dvfs.config import AUTO_BOARD, DvfsConfig, resolve_board_setting
from streamfl.models import REGISTRY, ModelSpec
from streamfl.protocol.signing import parse_public_key
from streamfl.protocol.topics import NAME_RE, sanitize_name
from streamfl.protocol.transport.base import MqttSettings
from streamfl.protocol.transport.config import MqttConfig
from streamfl.sensors.config import SensorConfig

MIB = 1024 * 1024
#: The ``update_encoding`` values (``streamfl.protocol.codec.ENCODINGS`` an update may use).
UPDATE_ENCODINGS = ("float32", "float16", "int8_delta")


def default_device_id() -> str:
    """The board's hostname made into a valid device name (also the MQTT client id)."""
    return sanitize_name(socket.gethostname())


def device_id_origin(cfg: "AgentConfig") -> str:
    """Where ``cfg.device_id`` came from, in words: configured, or derived from the hostname."""
    derived = getattr(cfg, "_derived_from_hostname", None)
    if derived is not None and derived == cfg.device_id:
        return "derived from the hostname %r (no device_id configured)" % socket.gethostname()
    return "configured (device_id / --device-id)"


def derived_device_id_warning(cfg: "AgentConfig") -> Optional[str]:
    """The warning for a device id derived from the hostname (None for a configured one): boards
    flashed from one image share the hostname, and two boards with one id take the broker
    connection from each other (``agent/takeover.py``)."""
    if getattr(cfg, "_derived_from_hostname", None) != cfg.device_id:
        return None
    return ("device id %r is %s: boards flashed from one image share it, and two boards with one "
            "id take the broker connection from each other; set device_id (provisioning writes "
            "it) or --device-id" % (cfg.device_id, device_id_origin(cfg)))


@dataclass(frozen=True)
class AgentConfig:
    """Everything one board's agent needs; see configs/agent.example.yaml for each key's meaning."""

    #: Fleet name: the topic namespace streamfl/v1/<fleet>/... shared with the coordinator (1-64
    #: characters from A-Z a-z 0-9 _ . -).
    fleet: str = "default"
    #: This board's name in the fleet, also its MQTT client id and (shipped ACL) broker user name:
    #: unique per broker. None = the sanitized hostname (filled in by ``__post_init__``, with a
    #: WARNING at start: boards flashed from one image share it); provisioning writes it.
    device_id: Optional[str] = None
    #: The board profile (configs/boards/<name>.yaml: jetson-nano, jetson-xavier-nx,
    #: jetson-agx-orin, jetson-orin-nano, jetson-orin-nano-super, raspberry-pi-4, raspberry-pi-5,
    #: generic-linux), or ``auto``: detect it from /proc/device-tree/model (else generic-linux).
    #: The one board setting: DVFS levels and power come from it and Hello shows its name to the
    #: coordinator. ``dvfs.profile_path`` replaces the profile (Hello then shows the file's name).
    #: Old labels (orin-nano, rpi4, generic, ...) and ``dvfs.board`` still load, with a warning.
    board: str = AUTO_BOARD
    model: ModelSpec = field(default_factory=ModelSpec)
    sensor: SensorConfig = field(default_factory=SensorConfig)
    mqtt: MqttConfig = field(default_factory=MqttConfig)
    dvfs: DvfsConfig = field(default_factory=DvfsConfig)
    #: Predictions on live windows, published on MQTT and a local socket (docs/predictions.md).
    predict: PredictConfig = field(default_factory=PredictConfig)
    #: Fleet control (docs/deployment.md, "Fleet control"): the log lines kept for ``streamfl
    #: operator logs``.
    control: ControlConfig = field(default_factory=ControlConfig)
    #: None = chosen by the CLI (/var/lib/streamfl-agent, else ~/.local/state/streamfl-agent).
    state_dir: Optional[Path] = None
    #: Windows the training buffer holds; its memory (capacity x window_len x channels x 4 bytes) is
    #: allocated at start.
    buffer_capacity: int = bounded(2048, 1, 10 ** 8)
    #: Which windows a full buffer keeps (``streamfl.agent.buffer_policies``): ``fifo``, the most
    #: recent ones, or ``reservoir``, a uniform sample of the whole stream.
    buffer_policy: str = "fifo"
    #: The most bytes the window buffer may take (capacity x window_len x channels x 4 + 8 per
    #: label), checked before it is allocated (``streamfl.agent.preflight``), as is the memory
    #: this board has free. 1 GiB: ~400 times the default buffer, half of a 2 GiB board.
    max_buffer_bytes: int = bounded(1024 * MIB, 1, 2 ** 40)
    #: Windows the buffer must hold before this board trains its first round.
    min_buffer: int = bounded(64, 1, 10 ** 8)
    #: Seconds between round starts (a "train" command starts one at once).
    round_interval_s: float = bounded(5.0, 0.0, 86400.0, lo_open=True)
    #: SGD steps per local round; the coordinator's hparams in each global model override it.
    local_steps: int = bounded(20, 1, 100000)
    #: SGD learning rate of a local round; the coordinator's hparams override it.
    lr: float = bounded(0.01, 0.0, 10.0, lo_open=True)
    #: Windows per minibatch of a local round; the coordinator's hparams override it.
    batch_size: int = bounded(32, 1, 65536)
    #: Dropout probability while training, in [0, 1); the coordinator's hparams override it.
    dropout: float = bounded(0.0, 0.0, 1.0, hi_open=True)
    #: SGD momentum of the local optimizer, in [0, 1) (0: plain SGD); local only, never sent.
    momentum: float = bounded(0.0, 0.0, 1.0, hi_open=True)
    #: Settings of the methods' plug-ins by name (``streamfl.agent.plugins``); every registered
    #: plug-in runs, dormant until the coordinator's global model asks for it; a name not given
    #: takes its defaults. Built into each plug-in's settings dataclass on load.
    plugins: Dict[str, Any] = field(default_factory=dict)
    #: CPU threads torch may use; 1 leaves the other cores to the board's own work, 0 = torch's
    #: default.
    torch_threads: int = bounded(1, 0, 1024)
    #: Updates kept on disk while the broker is unreachable; beyond this the oldest is dropped.
    outbox_max_items: int = bounded(200, 1, 10 ** 6)
    #: Bytes the on-disk outbox may hold (256 MiB); beyond this the oldest update is dropped.
    outbox_max_bytes: int = bounded(256 * MIB, 1024, 2 ** 40)
    #: Seconds between telemetry messages (QoS 0); 5 s shows a round's power in a dashboard.
    telemetry_interval_s: float = bounded(5.0, 0.0, 86400.0)
    #: Seconds without a global model (since start or the last one) before a WARNING naming the
    #: model topic, repeated every 10 times as long; 0 = never. A board on the wrong fleet or
    #: broker otherwise waits silently; 60 s is 12 rounds at the default interval.
    model_wait_warn_s: float = bounded(60.0, 0.0, 604800.0)
    #: Seconds without a word from the coordinator (no new global model, no command, its retained
    #: status not turning online) before one WARNING saying what the agent does meanwhile (it
    #: keeps training from the model it holds; its updates wait in the broker or the outbox), and
    #: one line when it is heard again (``agent/coordinator_watch.py``); 0 = never. 120 s: a
    #: FedAsync coordinator answers every round (5 s) with a new version, a restart takes
    #: seconds, so two minutes of silence is an outage; never less than 3 round intervals.
    coordinator_silence_warn_s: float = bounded(120.0, 0.0, 604800.0)
    #: Another board with this device id (``agent/takeover.py``): a connection the broker closes
    #: within this many seconds of accepting it counts towards the take-over cycle. 10 s: a clone
    #: reconnects within the reconnect delay (1 s), a cut link takes the keep-alive (30 s+).
    duplicate_id_short_connection_s: float = bounded(10.0, 0.1, 3600.0)
    #: This many such short connections within ``duplicate_id_window_s`` are reported as another
    #: board with this id (an ERROR, the ``duplicate_id_takeovers`` counter) and backed off from.
    #: 3: one drop is a hiccup, three in a row at the reconnect pace are the cycle.
    duplicate_id_connections: int = bounded(3, 1, 1000)
    #: The window (seconds) within which ``duplicate_id_connections`` short connections count;
    #: 60 s holds a take-over cycle of up to 20 s per connection.
    duplicate_id_window_s: float = bounded(60.0, 1.0, 86400.0)
    #: The longest wait (seconds) before reconnecting while another board takes this id's
    #: connection: the wait doubles at every take-over from 2 s to this. 300 s: the broker sees one
    #: take-over per 5 minutes, and the board holding the connection works meanwhile. Normal
    #: reconnects resume after a connection held twice this long.
    duplicate_id_backoff_max_s: float = bounded(300.0, 1.0, 86400.0)
    #: Seconds a round waits for the global model it asks for before starting from the model held
    #: (agent/model_feed.py): one download of the model, 17 s for 2 MB at 1 Mbit/s on cellular.
    model_fetch_timeout_s: float = bounded(30.0, 0.1, 3600.0)
    #: Save the local model every this many rounds (and at exit); 0 = only at exit.
    checkpoint_every_rounds: int = bounded(1, 0, 10 ** 6)
    #: How update tensors go on the wire (docs/deployment.md, "Smaller messages"): ``float32``;
    #: ``float16`` (half the bytes); ``int8_delta``, the change from the global model the round
    #: trained from in blockwise int8 (about 3.2-3.8x fewer bytes than float32; the coordinator adds
    #: its copy of that model, which it keeps for ``history_size`` versions). A round whose base
    #: model was replaced before it was sent goes as float16.
    update_encoding: str = "float32"
    #: Deprecated: ``update_encoding: float16`` (true still works, with a warning).
    float16_updates: bool = False
    #: Largest frame accepted from the broker (a global model or command), in bytes (64 MiB).
    max_frame_bytes: int = bounded(64 * MIB, 1024, FRAME_BYTES_MAX)
    #: None = derived from the device id (stable across restarts, different per device).
    seed: Optional[int] = bounded(None, 0, SEED_MAX)
    #: The coordinator's public key (``ed25519:<base64>``, printed by ``streamfl-coordinator
    #: keygen``). Set, the agent obeys only global models and commands signed with it; unset
    #: (trial set-ups), anyone who may publish on the model or command topic is believed.
    coordinator_public_key: Optional[str] = None
    #: ``{hyper-parameter: [low, high]}``: how hard a coordinator may drive this board; merged
    #: over ``streamfl.agent.hparams.DEFAULT_HPARAM_LIMITS`` (lr, batch_size, local_steps, dropout).
    hparam_limits: Dict[str, Any] = field(default_factory=dict)
    #: The most rounds one ``skip`` command may idle the board (100 rounds: ~8 minutes at 5 s).
    max_skip_rounds: int = bounded(100, 0, 10000)
    #: Follow a global model without a run identity after one of a named run. Off: every
    #: ``streamfl-coordinator`` names its run, so an unnamed model after a named one is a forgery
    #: or a leftover, refused (``agent/model_gate.py``); on only for a coordinator that stamps none.
    accept_unnamed_runs: bool = False
    #: Seconds within which coming back to a run this agent left means two coordinators publish on
    #: the fleet (one WARNING naming both runs, then only counted). 300 s: two live coordinators
    #: alternate every few seconds, while a coordinator moved back after a reset takes minutes.
    run_alternation_window_s: float = bounded(300.0, 0.0, 86400.0)
    #: After a round diverges, the next waits for a global model other than the one it diverged
    #: on, or this many round intervals without one (``agent/divergence.py``): 10, a tenth of
    #: the energy of retrying every round, while a new model is followed at once.
    diverged_retry_rounds: int = bounded(10, 1, 10000)

    def __post_init__(self) -> None:
        if not NAME_RE.match(self.fleet or ""):
            raise ValueError("fleet %r is invalid: use 1-64 characters from A-Z a-z 0-9 _ . -"
                             % (self.fleet,))
        if self.device_id is None:
            object.__setattr__(self, "device_id", default_device_id())
            # Not a field: remembers that the id is the hostname (``device_id_origin``).
            object.__setattr__(self, "_derived_from_hostname", self.device_id)
        elif not NAME_RE.match(self.device_id):
            raise ValueError("device_id %r is invalid: use 1-64 characters from A-Z a-z 0-9 _ . -"
                             % (self.device_id,))
        if self.seed is None:
            object.__setattr__(self, "seed", zlib.crc32(self.device_id.encode("utf-8")) & 0x7FFFFFFF)
        self._resolve_board()
        self._resolve_update_encoding()
        checks = [
            ("buffer_capacity", self.buffer_capacity >= 1, "must be at least 1"),
            ("buffer_policy", self.buffer_policy in policies(),
             "must be one of %s, got %r" % (", ".join(policies()), self.buffer_policy)),
            ("min_buffer", 1 <= self.min_buffer <= self.buffer_capacity,
             "must be in 1..buffer_capacity (%d)" % self.buffer_capacity),
            ("round_interval_s", self.round_interval_s >= 0, "must be >= 0"),
            ("local_steps", self.local_steps >= 1, "must be at least 1"),
            ("lr", 0 < self.lr < float("inf"), "must be finite and > 0"),
            ("batch_size", self.batch_size >= 1, "must be at least 1"),
            ("dropout", 0 <= self.dropout < 1, "must be in [0, 1)"),
            ("momentum", 0 <= self.momentum < 1, "must be in [0, 1)"),
            ("torch_threads", self.torch_threads >= 0, "must be >= 0 (0 = torch's default)"),
            ("outbox_max_items", self.outbox_max_items >= 1, "must be at least 1"),
            ("outbox_max_bytes", self.outbox_max_bytes >= 1024, "must be at least 1024"),
            ("telemetry_interval_s", self.telemetry_interval_s >= 0, "must be >= 0 (0 = off)"),
            ("max_buffer_bytes", self.max_buffer_bytes >= 1, "must be at least 1"),
            ("model_wait_warn_s", self.model_wait_warn_s >= 0, "must be >= 0 (0 = never)"),
            ("coordinator_silence_warn_s", self.coordinator_silence_warn_s >= 0,
             "must be >= 0 (0 = never)"),
            ("checkpoint_every_rounds", self.checkpoint_every_rounds >= 0,
             "must be >= 0 (0 = only at exit)"),
            ("max_frame_bytes", self.max_frame_bytes >= 1024, "must be at least 1024"),
            ("max_skip_rounds", self.max_skip_rounds >= 0, "must be >= 0"),
            ("diverged_retry_rounds", self.diverged_retry_rounds >= 1, "must be at least 1"),
            ("run_alternation_window_s", 0 <= self.run_alternation_window_s <= 86400,
             "must be in [0, 86400] (0 = never report alternating runs)"),
        ]
        for key, ok, why in checks:
            if not ok:
                raise ValueError("%s %s, got %r" % (key, why, getattr(self, key)))
        object.__setattr__(self, "plugins", plugin_configs(self.plugins))
        hparam_limits(self.hparam_limits)  # ValueError naming the key
        if self.coordinator_public_key is not None:
            try:
                parse_public_key(self.coordinator_public_key)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        m, s = self.model, self.sensor
        if m.name not in REGISTRY:
            raise ValueError("model name %r is unknown (known: %s)" % (m.name, ", ".join(sorted(REGISTRY))))
        if s.channels != m.in_channels or s.window_len != m.window_len:
            raise ValueError("sensor windows are [%d, %d] (window_len, channels) but the model takes "
                             "[%d, %d]" % (s.window_len, s.channels, m.window_len, m.in_channels))
        if s.num_classes > m.num_classes:
            raise ValueError("sensor num_classes (%d) exceeds model num_classes (%d)"
                             % (s.num_classes, m.num_classes))
        names = self.predict.class_names
        if names and len(names) != m.num_classes:
            raise ValueError("predict.class_names has %d names, the model has %d classes"
                             % (len(names), m.num_classes))

    def _resolve_update_encoding(self) -> None:
        """``update_encoding`` checked, with the deprecated ``float16_updates: true`` folded in."""
        object.__setattr__(self, "update_encoding", resolve_encoding(
            "update_encoding", self.update_encoding, UPDATE_ENCODINGS, "float16_updates",
            self.float16_updates))

    def _resolve_board(self) -> None:
        """One board setting (``streamfl.dvfs.config``): the top-level ``board``, with the
        deprecated ``dvfs.board`` read where it is auto; the DVFS section gets the resolved name."""
        board = resolve_board_setting(self.board, self.dvfs.board)
        object.__setattr__(self, "board", board)
        profile = None if board == AUTO_BOARD else board
        if self.dvfs.board != profile:  # the copy checks its policy with the board's power model
            object.__setattr__(self, "dvfs", dataclasses.replace(self.dvfs, board=profile))
        elif profile is None:  # a policy that waited for a board name fails here, naming why
            self.dvfs.check_policy()

    def mqtt_settings(self, environ: Optional[Mapping[str, str]] = None) -> MqttSettings:
        """Transport settings with this device's id as the MQTT client id."""
        return self.mqtt.settings(self.device_id, environ)



def load_agent_config(path: Optional[Path] = None,
                      overrides: Optional[Mapping[str, Any]] = None) -> AgentConfig:
    """Load the agent config from an optional YAML file, then merge nested flag ``overrides``.

    ``overrides`` is shaped like the file (``{"mqtt": {"host": ...}}``); ``None`` means "not given".
    """
    return load(AgentConfig, path, overrides)

