"""What building the agent needs, checked before it is built, so that a configuration that loads but
would crash the start (a buffer larger than memory, a missing TLS file) is one ``ConfigError``
naming the key (exit 2: systemd does not restart into it) under ``--check-config`` and at start.

Memory is judged against ``MemAvailable`` in /proc/meminfo (a cgroup limit such as systemd's
MemoryMax= is not read); where it cannot be read, only ``max_buffer_bytes`` bounds the buffer.

``identity_warnings`` finds what loads and starts but cannot work under the shipped broker set-up:
an MQTT user name (or client certificate CN) other than the device id. The shipped ACL
(``configs/mosquitto/acl``) lets a device write only the topics named by its user name, and
mosquitto drops a denied publish without telling the client (MQTT 3.1.1 has no negative PUBACK),
so such an agent would train and send forever while the coordinator hears nothing. It is a
warning, not an error: a broker with another ACL may map names differently.
"""
import logging
import os
from pathlib import Path
from typing import Callable, List, Optional

from streamfl.errors import ConfigError, StreamflError

log = logging.getLogger(__name__)

#: Bytes of memory per model parameter while training: the weights, their gradients, the optimizer's
#: momentum and the global model kept beside the local one, float32 each.
TRAINING_BYTES_PER_PARAM = 4 * 4
#: ``torch_threads`` above this many per CPU is refused: beyond the core count threads only
#: contend, and far beyond it (100000) the process dies starting them. 4 leaves room for a config
#: shared by boards with different core counts.
MAX_THREADS_PER_CPU = 4


def buffer_bytes(cfg) -> int:
    """Bytes the window buffer allocates: float32 windows [T, C] and one int64 label each."""
    return cfg.buffer_capacity * (cfg.sensor.window_len * cfg.sensor.channels * 4 + 8)


def model_parameters(spec) -> Optional[int]:
    """Parameters of ``spec``'s model, counted on torch's meta device (nothing allocated); None
    where this torch cannot (before 2.0)."""
    import torch

    from streamfl.models import REGISTRY
    try:
        with torch.device("meta"):
            model = REGISTRY[spec.name](spec, 0.0)
    except (AttributeError, TypeError, RuntimeError) as exc:
        log.debug("cannot size the model without building it: %s", exc)
        return None
    return sum(p.numel() for p in model.parameters())


def available_memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> Optional[int]:
    """``MemAvailable`` in bytes, or None where the file or the line is missing."""
    try:
        text = meminfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name == "MemAvailable" and rest.split():
            return int(rest.split()[0]) * 1024
    return None


def _mib(n_bytes: float) -> str:
    """``n_bytes`` in MiB, GiB or TiB, whichever reads best."""
    for unit, power in (("TiB", 40), ("GiB", 30)):
        if n_bytes >= 2 ** power:
            return "%.1f %s" % (n_bytes / 2.0 ** power, unit)
    return "%.1f MiB" % (n_bytes / 2.0 ** 20)


def check_startup(cfg, available_bytes: Optional[Callable[[], Optional[int]]] = None,
                  cpu_count: Optional[int] = None) -> None:
    """Raise ``ConfigError`` naming the key of the first value this board cannot start with."""
    available = (available_bytes or available_memory_bytes)()
    cpus = cpu_count or os.cpu_count() or 1
    buf = buffer_bytes(cfg)
    if buf > cfg.max_buffer_bytes:
        raise ConfigError("buffer_capacity %d needs %s for windows of [%d, %d], more than "
                          "max_buffer_bytes (%s): lower buffer_capacity or raise max_buffer_bytes" % (
                              cfg.buffer_capacity, _mib(buf), cfg.sensor.window_len,
                              cfg.sensor.channels, _mib(cfg.max_buffer_bytes)))
    params = model_parameters(cfg.model)
    model = params * TRAINING_BYTES_PER_PARAM if params is not None else 0
    if available is not None:
        if buf > available:
            raise ConfigError("buffer_capacity %d needs %s, more than the %s of memory available"
                              % (cfg.buffer_capacity, _mib(buf), _mib(available)))
        if model > available:
            raise ConfigError("model.hidden %d: the %s model (%d parameters) needs about %s to "
                              "train, more than the %s of memory available" % (
                                  cfg.model.hidden, cfg.model.name, params, _mib(model),
                                  _mib(available)))
        if buf + model > available:
            raise ConfigError("buffer_capacity %d (%s) and model.hidden %d (about %s) together "
                              "need more than the %s of memory available" % (
                                  cfg.buffer_capacity, _mib(buf), cfg.model.hidden, _mib(model),
                                  _mib(available)))
    if cfg.torch_threads > MAX_THREADS_PER_CPU * cpus:
        raise ConfigError("torch_threads %d: this board has %d CPUs (at most %d threads)"
                          % (cfg.torch_threads, cpus, MAX_THREADS_PER_CPU * cpus))
    for key in ("tls_ca", "tls_cert", "tls_key"):
        path = getattr(cfg.mqtt, key)
        if path is not None and not Path(path).is_file():
            raise ConfigError("mqtt.%s: TLS file %s does not exist" % (key, path))
    if cfg.sensor.kind == "replay" and not Path(cfg.sensor.path).is_file():
        raise ConfigError("sensor.path: dataset file %s does not exist" % cfg.sensor.path)
    _check_board(cfg.dvfs)


def _check_board(dcfg) -> None:
    """A named board profile or profile file must load (detection waits for the start); with
    backend none only the top-level ``board`` (what Hello names the board) must be a profile."""
    from streamfl.dvfs.factory import board_profile
    from streamfl.dvfs.profiles import load_profile
    try:
        if dcfg.backend != "none" and dcfg.profile_path:
            key = "dvfs.profile_path"
            board_profile(dcfg)
        elif dcfg.board:  # the agent config's top-level board, resolved into the dvfs section
            key = "board"
            load_profile(dcfg.board)
    except StreamflError as exc:
        raise ConfigError("%s: %s" % (key, exc)) from None


def certificate_common_name(path) -> Optional[str]:
    """The subject CN of the PEM certificate at ``path``; None where there is none or the file
    cannot be read (loading the TLS files reports that)."""
    try:
        from cryptography import x509
        from cryptography.x509.oid import NameOID
        cert = x509.load_pem_x509_certificate(Path(path).read_bytes())
        names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    except (OSError, ValueError, TypeError, ImportError) as exc:
        log.debug("cannot read the CN of %s: %s", path, exc)
        return None
    return str(names[0].value) if names else None


def identity_warnings(cfg) -> List[str]:
    """Why the broker's identity ACL would drop this agent's publishes: its ``mqtt.username``, or
    without one its client certificate's CN (the user name under mosquitto's
    ``use_identity_as_username``), differs from its ``device_id``. Empty when they agree or
    neither is set."""
    acl = ("under the shipped identity ACL (configs/mosquitto/acl: a device writes only the topics "
           "of its own user name) the broker silently drops this agent's status, updates and "
           "telemetry; make the two equal (device_id / --device-id, or the broker account)")
    username = cfg.mqtt.username
    if username:
        if username != cfg.device_id:
            return ["MQTT user name %r differs from device_id %r: %s" % (username, cfg.device_id, acl)]
        return []
    if cfg.mqtt.tls_cert is not None:
        cn = certificate_common_name(cfg.mqtt.tls_cert)
        if cn is not None and cn != cfg.device_id:
            return ["client certificate %s is for %r (CN), not device_id %r: where the broker takes "
                    "the CN as the user name (use_identity_as_username, the README's certificate "
                    "set-up) %s" % (cfg.mqtt.tls_cert, cn, cfg.device_id, acl)]
    return []
