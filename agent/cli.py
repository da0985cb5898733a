"""``streamfl-agent``: run one board's agent (usually as the systemd service streamfl-agent).

Flags override the YAML file. A configuration error prints one line on stderr and exits with code 2
so systemd does not restart into it (RestartPreventExitStatus=2), and so does a value this board
cannot start with (``streamfl.agent.preflight``: a buffer larger than memory, a missing TLS file),
checked by ``--check-config`` too; an error a flag causes names the flag. An MQTT user name other
than the device id is a warning at start and under ``--check-config`` (the shipped ACL would drop
every publish: ``preflight.identity_warnings``). A state folder it cannot write or a checkpoint it
cannot read exits 2 as well, naming the path (``streamfl.agent.state``). SIGTERM/SIGINT stop
cleanly (exit 0). Logs go to stdout, which journald captures.

The state directory (checkpoint, outbox) defaults to /var/lib/streamfl-agent when this user may
write there (the systemd unit's StateDirectory=), else ~/.local/state/streamfl-agent.
"""
import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import yaml

import streamfl
from streamfl.agent.cli_common import PROG, SYSTEM_STATE_DIR, default_state_dir, fail
from streamfl.agent.preflight import check_startup, identity_warnings
from streamfl.config import given_flags, load_with_flags, nest, to_dict
from streamfl.errors import ConfigError, StreamflError
from streamfl.logs import setup_logging

log = logging.getLogger("streamfl.agent.cli")


def build_parser() -> argparse.ArgumentParser:
    """The command line; every flag defaults to None so that only given flags override the file."""
    p = argparse.ArgumentParser(
        prog=PROG, description="streamfl on-device learning agent.",
        epilog="Clocks (see '%s dvfs --help'): '%s dvfs status' shows this board's clocks, the "
               "levels a running agent has set, and measured power; '%s dvfs restore' puts back "
               "clocks a killed agent left changed; '%s dvfs probe' times training and measures "
               "watts at each clock level into a board profile file." % ((PROG,) * 4))
    p.add_argument("--config", type=Path, help="agent YAML file (see configs/agent.example.yaml)")
    p.add_argument("--broker", help="MQTT broker host name or address (mqtt.host)")
    p.add_argument("--port", type=int, help="MQTT broker port (mqtt.port, default 1883)")
    p.add_argument("--fleet", help="fleet name, the topic namespace (default: default)")
    p.add_argument("--device-id", help="device id and MQTT client id (default: sanitized hostname)")
    p.add_argument("--board", help="board profile (configs/boards names, e.g. jetson-orin-nano, "
                                   "raspberry-pi-4), or auto to detect it; also what the "
                                   "coordinator shows (board)")
    p.add_argument("--state-dir", type=Path,
                   help="checkpoint and outbox folder (default: %s if writable, else "
                        "~/.local/state/streamfl-agent)" % SYSTEM_STATE_DIR)
    p.add_argument("--tls-ca", type=Path, help="CA certificate file; enables TLS")
    p.add_argument("--tls-cert", type=Path, help="client certificate file (with --tls-key)")
    p.add_argument("--tls-key", type=Path, help="client private key file")
    p.add_argument("--username", help="MQTT user name")
    p.add_argument("--password-file", type=Path,
                   help="file holding the MQTT password (or set STREAMFL_MQTT_PASSWORD)")
    p.add_argument("--sensor", help="sensor kind: synthetic, replay, iio or mqtt (sensor.kind)")
    p.add_argument("--sensor-path", help="dataset .npz for the replay sensor (sensor.path)")
    p.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"])
    p.add_argument("--check-config", action="store_true",
                   help="validate the configuration and what this board needs to start with it "
                        "(memory, files), print it as YAML and exit")
    p.add_argument("--version", action="version", version="%(prog)s " + streamfl.__version__)
    return p


#: Each flag's argparse ``dest`` -> the config key it overrides.
FLAG_KEYS = {
    "fleet": "fleet", "device_id": "device_id", "board": "board", "state_dir": "state_dir",
    "broker": "mqtt.host", "port": "mqtt.port", "tls_ca": "mqtt.tls_ca", "tls_cert": "mqtt.tls_cert",
    "tls_key": "mqtt.tls_key", "username": "mqtt.username", "password_file": "mqtt.password_file",
    "sensor": "sensor.kind", "sensor_path": "sensor.path",
}


def overrides_from_args(args: argparse.Namespace) -> Dict[str, Any]:
    """The given flags' values shaped like the YAML file (``{"mqtt": {"port": 1999}}``)."""
    return nest({key: value for key, (_, value) in given_flags(args, FLAG_KEYS).items()})


def load_from_args(args: argparse.Namespace):
    """The ``AgentConfig`` of ``--config`` and the flags; an error a flag causes names the flag."""
    from streamfl.agent.config import load_agent_config
    return load_with_flags(lambda overrides: load_agent_config(args.config, overrides),
                           given_flags(args, FLAG_KEYS))


def main(argv: Optional[List[str]] = None, environ: Optional[Mapping[str, str]] = None) -> int:
    """Parse flags, load the config, and run the agent until SIGTERM/SIGINT; the exit code."""
    environ = os.environ if environ is None else environ
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["dvfs"]:
        from streamfl.agent.dvfs_cli import main as dvfs_main
        return dvfs_main(argv[1:], environ)
    args = build_parser().parse_args(argv)
    try:
        cfg = load_from_args(args)
        settings = cfg.mqtt_settings(environ)
        check_startup(cfg)
    except ConfigError as exc:
        return fail(exc, ConfigError.exit_code)
    if args.check_config:
        for warning in _id_warnings(cfg):
            sys.stderr.write("%s: warning: %s\n" % (PROG, warning))
        data = to_dict(cfg)
        data["dvfs"].pop("board", None)  # the top-level board, copied in (deprecated as a key)
        # A YAML comment, so the output still loads: where the id (the MQTT client id) came from.
        sys.stdout.write("# device_id %s: %s\n" % (cfg.device_id, _id_origin(args, cfg)))
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False))
        return 0
    setup_logging(args.log_level, environ=environ)
    state_dir = cfg.state_dir or default_state_dir()
    try:
        return _run(cfg, settings, state_dir, environ)
    except ConfigError as exc:
        return fail(exc, ConfigError.exit_code)
    except StreamflError as exc:  # a state file it cannot read (StateFileError) exits 2 as well
        return fail(exc, getattr(exc, "exit_code", 1))


def _id_origin(args: argparse.Namespace, cfg) -> str:
    """Where the device id came from: --device-id, the config file, or the hostname."""
    from streamfl.agent.config import device_id_origin
    if args.device_id is not None:
        return "from --device-id"
    origin = device_id_origin(cfg)
    return "from %s" % args.config if origin.startswith("configured") and args.config else origin


def _id_warnings(cfg) -> List[str]:
    """The identity warnings of start and ``--check-config``: an id derived from the hostname
    (boards flashed from one image share it), a broker user name other than the id."""
    from streamfl.agent.config import derived_device_id_warning
    derived = derived_device_id_warning(cfg)
    return ([derived] if derived else []) + identity_warnings(cfg)


def _dvfs(cfg, state_dir: Path):
    """The agent's clock control; a board whose clocks cannot be read trains without it."""
    from streamfl.agent.dvfs import AgentDvfs
    from streamfl.dvfs.base import DvfsError
    from streamfl.dvfs.sysfs_io import SysfsFiles
    try:
        return AgentDvfs.from_config(cfg.dvfs, state_dir)
    except DvfsError as exc:
        log.error("DVFS unavailable (%s): training without clock control or energy", exc)
        dvfs = AgentDvfs.disabled(state_dir, SysfsFiles(Path(cfg.dvfs.sysfs_root)))
        dvfs.board = AgentDvfs.board_name(cfg.dvfs)  # Hello still names the board
        return dvfs


def _run(cfg, settings, state_dir: Path, environ: Mapping[str, str]) -> int:
    from streamfl.agent.daemon import AgentDaemon
    from streamfl.notify import SystemdNotifier
    from streamfl.protocol.transport.paho import PahoTransport
    from streamfl.sensors import make_source

    transport = PahoTransport(settings)
    source = make_source(cfg.sensor, cfg.device_id, transport=transport, fleet=cfg.fleet)
    daemon = AgentDaemon(cfg, transport, source, state_dir,
                         notifier=SystemdNotifier.from_environ(environ), dvfs=_dvfs(cfg, state_dir))

    def on_signal(signum, frame):
        log.info("received %s, stopping", signal.Signals(signum).name)
        daemon.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("streamfl-agent %s: device %s, fleet %s, broker %s:%d, sensor %s, state %s",
             streamfl.__version__, cfg.device_id, cfg.fleet, settings.host, settings.port,
             cfg.sensor.kind, state_dir)
    for warning in _id_warnings(cfg):
        log.warning("%s", warning)
    daemon.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
