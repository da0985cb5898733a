"""``streamfl-coordinator``: run the coordinator daemon against an MQTT broker (or an embedded one).

Flags override the YAML config; a configuration error prints one line (naming the flag when a flag
caused it) and exits 2 (so systemd does not restart into it); ``--check-config`` prints the
effective configuration and exits 0, or that line and 2. A state file that cannot be read or is
corrupt (``streamfl.coordinator.persistence``) exits 2 too, naming it. SIGTERM/SIGINT stop
cleanly (state persisted, offline status published) and exit 0. Logs go to stdout for journald. Under systemd
``Type=notify`` it reports READY and pings the watchdog while its worker threads are alive.
Before it connects it looks for another live coordinator of its fleet (``liveness.check_fleet``):
one found, a probe account the broker refuses, or a probe the ACL blinds exits 2; a broker that
cannot be reached is waited for (systemd is told, and its start timeout extended).
"""
import argparse
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import List, Optional, Tuple

import yaml

import streamfl
from streamfl.config import given_flags, load_with_flags, to_dict
from streamfl.errors import ConfigError, StreamflError
from streamfl.logs import setup_logging
from streamfl.notify import SystemdNotifier

log = logging.getLogger("streamfl.coordinator.cli")

DEFAULT_STATE_DIR = "./streamfl-coordinator-state"
#: How long to wait for the first broker connection before reporting READY anyway.
READY_WAIT_S = 10.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamfl-coordinator",
                                description="Asynchronous federated-learning coordinator over MQTT.")
    p.add_argument("--config", type=Path, help="coordinator YAML (see configs/coordinator.example.yaml)")
    p.add_argument("--broker", help="MQTT broker host (overrides mqtt.host)")
    p.add_argument("--port", type=int, help="MQTT broker port (overrides mqtt.port)")
    p.add_argument("--fleet", help="fleet name (overrides fleet)")
    p.add_argument("--state-dir", type=Path, default=Path(DEFAULT_STATE_DIR),
                   help="where model and state persist (default %(default)s)")
    p.add_argument("--run-dir", type=Path,
                   help="the run's folder: metrics.jsonl and summary.json (default: the folder the "
                        "state folder's run already writes to, else a new ./runs/<timestamp>)")
    p.add_argument("--eval-data", help="held-out windows .npz (overrides eval_path)")
    p.add_argument("--method", metavar="NAME",
                   help="run a named method (streamfl methods lists them; overrides method): its "
                        "strategy and plug-ins are laid over the config, its keys winning (each "
                        "key it replaces is logged), and the agents get its side with every "
                        "global model")
    p.add_argument("--tls-ca", help="CA certificate file (enables TLS)")
    p.add_argument("--tls-cert", help="client certificate file")
    p.add_argument("--tls-key", help="client key file")
    p.add_argument("--username", help="MQTT user name")
    p.add_argument("--password-file", help="file whose first line is the MQTT password")
    p.add_argument("--client-id", help="MQTT client id (default coordinator-<fleet>)")
    p.add_argument("--embedded-broker", action="store_true",
                   help="start an embedded MQTT broker on --broker/--port in this process (exit 2 if "
                        "the port is taken)")
    p.add_argument("--take-over", action="store_true", default=None,
                   help="start even if another coordinator of the fleet is online on the broker; it "
                        "steps down (overrides exclusive.take_over; without it such a start exits 2)")
    p.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="default %(default)s")
    p.add_argument("--check-config", action="store_true",
                   help="validate the configuration, print it as YAML and exit")
    p.add_argument("--version", action="version", version="%(prog)s " + streamfl.__version__)
    return p


#: Each flag's argparse ``dest`` -> the config key it overrides.
FLAG_KEYS = {
    "fleet": "fleet", "eval_data": "eval_path", "broker": "mqtt.host", "port": "mqtt.port",
    "tls_ca": "mqtt.tls_ca", "tls_cert": "mqtt.tls_cert", "tls_key": "mqtt.tls_key",
    "username": "mqtt.username", "password_file": "mqtt.password_file",
    "take_over": "exclusive.take_over", "method": "method",
}


def load_from_args(args, notes: Optional[List[Tuple[int, str]]] = None):
    """The CoordinatorConfig from ``--config`` plus flag overrides; an error a flag causes names it.
    What a named method changed goes to ``notes`` (``(level, message)``; None: logged)."""
    from streamfl.coordinator.config import load_config

    def load(overrides):
        said: List[Tuple[int, str]] = []
        config = load_config(args.config, overrides, notes=said)
        if notes is None:
            for level, message in said:
                log.log(level, "%s", message)
        else:
            notes[:] = said  # only the load that succeeded
        return config
    return load_with_flags(load, given_flags(args, FLAG_KEYS))


def _watchdog_loop(server, notifier: SystemdNotifier, stop: threading.Event) -> None:
    while not stop.wait(notifier.watchdog_interval_s):
        if server.healthy():
            notifier.watchdog()
        else:
            log.error("coordinator threads are not healthy: withholding the watchdog ping")


def keygen(argv: List[str]) -> int:
    """``streamfl-coordinator keygen``: the Ed25519 key pair that signs models and commands."""
    p = argparse.ArgumentParser(
        prog="streamfl-coordinator keygen",
        description="Make the key pair that signs global models and commands. The private key stays "
                    "with the coordinator (signing_key_file); the public key goes into every agent's "
                    "config (coordinator_public_key).")
    p.add_argument("--out", type=Path, default=Path("."), help="folder for the two files (default .)")
    p.add_argument("--name", default="coordinator-signing",
                   help="file name stem: NAME.key and NAME.pub (default %(default)s)")
    args = p.parse_args(argv)
    from streamfl.protocol.signing import generate_key_pair
    try:
        key_path, pub_path, public = generate_key_pair(args.out, args.name)
    except ConfigError as exc:
        print("streamfl-coordinator keygen: %s" % exc, file=sys.stderr)
        return exc.exit_code
    print("private key: %s (mode 0600; coordinator YAML: signing_key_file: %s)" % (key_path, key_path))
    print("public key:  %s" % pub_path)
    print("every agent's YAML:\ncoordinator_public_key: %s" % public)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["keygen"]:
        return keygen(argv[1:])
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, environ=os.environ)
    notes: List[Tuple[int, str]] = []
    try:
        config = load_from_args(args, notes)
        settings = config.mqtt.settings(args.client_id or "coordinator-%s" % config.fleet, os.environ)
    except ConfigError as exc:
        print("streamfl-coordinator: configuration error: %s" % exc, file=sys.stderr)
        return exc.exit_code
    if args.check_config:  # what the method changed as comments: the output stays YAML
        sys.stdout.write("".join("# %s\n" % message for _, message in notes))
        sys.stdout.write(yaml.safe_dump(to_dict(config), sort_keys=False))
        return 0
    for level, message in notes:
        log.log(level, "%s", message)
    # None: the run's folder the state folder remembers, else a new runs/<timestamp> (run_record.py).
    run_dir = args.run_dir

    import torch  # only after config errors have had their fast exit
    torch.set_num_threads(1)
    from streamfl.coordinator.server import CoordinatorServer
    from streamfl.protocol.transport.paho import PahoTransport

    broker = None
    server = None
    try:
        if args.embedded_broker:
            from streamfl.coordinator.broker import EmbeddedBroker
            broker = EmbeddedBroker(settings.host, settings.port)
            broker.start()
        server = CoordinatorServer(config, PahoTransport(settings), args.state_dir, run_dir)
        if broker is None:  # an embedded broker just started holds no other coordinator's status
            from streamfl.coordinator.liveness import check_fleet
            # It waits for an unreachable broker (publishing nothing before it knows it is alone);
            # systemd hears why and gives the start more time.
            wait_notifier = SystemdNotifier.from_environ(os.environ)
            extend_us = int((2 * config.exclusive.connect_wait_s + 30.0) * 1e6)
            other = check_fleet(settings, config.fleet, server.status_message(online=True),
                                config.exclusive, environ=os.environ,
                                on_wait=lambda message: wait_notifier.notify(
                                    "STATUS=%s\nEXTEND_TIMEOUT_USEC=%d" % (message, extend_us)))
            server.took_over = other.instance if other is not None else ""
    except ConfigError as exc:
        print("streamfl-coordinator: configuration error: %s" % exc, file=sys.stderr)
        if broker is not None:
            broker.stop()
        return exc.exit_code
    except StreamflError as exc:
        print("streamfl-coordinator: %s" % exc, file=sys.stderr)
        if broker is not None:
            broker.stop()
        return getattr(exc, "exit_code", 1)

    def on_signal(signum, _frame):
        log.info("signal %d: stopping", signum)
        server.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("coordinator for fleet %s, broker %s:%d, state %s, run %s", config.fleet, settings.host,
             settings.port, args.state_dir, server.run_dir)
    stop_watchdog = threading.Event()
    notifier = SystemdNotifier.from_environ(os.environ)
    try:
        server.start()
        server.transport.wait_connected(READY_WAIT_S)
        notifier.ready("version %d" % server.core.version)
        if notifier.watchdog_interval_s:
            threading.Thread(target=_watchdog_loop, args=(server, notifier, stop_watchdog),
                             name="watchdog", daemon=True).start()
        server.run()
    finally:
        notifier.stopping()
        stop_watchdog.set()
        server.stop()
        if broker is not None:
            broker.stop()
    if server.taken_over_by is not None:  # exit 2: systemd must not restart into a fight over the fleet
        from streamfl.coordinator.liveness import describe
        print("streamfl-coordinator: another coordinator keeps fleet %s (%s): this one stepped down"
              % (config.fleet, describe(server.taken_over_by)), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
