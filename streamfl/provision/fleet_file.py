"""The fleet file: what ``streamfl provision`` makes credentials and kits for, validated key by key.

::

    fleet: farm1                      # the topic namespace of every board and the coordinator
    broker:
      hosts: [broker.local, 192.168.1.10]   # the server certificate's names; boards use the first
      port: 8883                      # default 8883
      bind: null                      # listener address; null = every interface
    auth: password                    # password (default) or certificate (client certificates)
    boards:                           # listed, or groups of a count and a prefix, or both
      - {id: pi-01, kind: raspberry-pi-5}
      - {count: 30, prefix: pi-, kind: raspberry-pi-5, start: 2}   # pi-02 ... pi-31
    model: {name: lstm, hidden: 128}  # optional: laid into the coordinator's and every board's YAML
    agent: {round_interval_s: 5.0}    # optional: every board's agent.yaml (a board entry may add
                                      # its own agent: section)
    coordinator: {strategy: fedasync} # optional: the coordinator's YAML
    certificates: {ca_days: 7300, server_days: 3650, client_days: 3650, crl_days: 3650}

A wrong value is a ``ConfigError`` naming the file and the key (``boards[3].kind``), exit code 2.
Keys that provisioning writes itself (ids, broker, TLS, accounts, keys) may not be set in the
``agent:`` and ``coordinator:`` sections.
"""
import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from streamfl.config import read_yaml
from streamfl.errors import ConfigError
from streamfl.protocol.topics import validate_name

#: The accounts besides the boards, each with its block in the shipped ACL: a board may not take
#: one of their names.
ROLE_ACCOUNTS = ("coordinator", "coordinator-probe", "operator", "dashboard")
AUTH_MODES = ("password", "certificate")
DEFAULT_PORT = 8883
#: Certificate lifetimes in days. 20 years for the CA, 10 for what it signs: boards in the field
#: are not re-keyed on a calendar (revocation handles a lost key). The CRL lasts as long, since
#: mosquitto refuses every client once its next update has passed.
DEFAULT_DAYS = {"ca_days": 7300, "server_days": 3650, "client_days": 3650, "crl_days": 3650}
#: The most boards one fleet file may make (a typo such as count: 30000 is caught).
MAX_BOARDS = 10000
#: Agent keys that provisioning writes into every kit's agent.yaml.
AGENT_OWNED = ("fleet", "device_id", "board", "coordinator_public_key", "model")
#: Coordinator keys that provisioning writes into its YAML.
COORDINATOR_OWNED = ("fleet", "signing_key_file", "model")
#: Their ``mqtt:`` keys (both), and the coordinator's ``operator.public_keys`` and probe account.
MQTT_OWNED = ("host", "port", "tls_ca", "tls_cert", "tls_key", "username", "password_file")
EXCLUSIVE_OWNED = ("probe_username", "probe_password_file", "probe_tls_cert", "probe_tls_key")
_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


@dataclass(frozen=True)
class Board:
    """One board: its device id (MQTT user name, certificate CN), profile and own agent keys."""

    id: str
    kind: str
    agent: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FleetSpec:
    """A validated fleet file."""

    fleet: str
    hosts: Tuple[str, ...]
    port: int
    bind: Optional[str]
    auth: str
    boards: Tuple[Board, ...]
    model: Dict[str, Any] = field(default_factory=dict)
    agent: Dict[str, Any] = field(default_factory=dict)
    coordinator: Dict[str, Any] = field(default_factory=dict)
    days: Dict[str, int] = field(default_factory=lambda: dict(DEFAULT_DAYS))
    source: str = "fleet file"


def _fail(source: str, key: str, why: str) -> ConfigError:
    return ConfigError("%s: %s: %s" % (source, key, why))


def _mapping(value: Any, source: str, key: str) -> Dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _fail(source, key, "must be a mapping, got %r" % (value,))
    return dict(value)


def _unknown(values: Mapping[str, Any], allowed, source: str, prefix: str) -> None:
    extra = sorted(set(values) - set(allowed))
    if extra:
        raise _fail(source, prefix + str(extra[0]), "unknown key (known: %s)" % ", ".join(allowed))


def _int(value: Any, source: str, key: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _fail(source, key, "must be an integer in %d..%d, got %r" % (lo, hi, value))
    return value


def check_host(host: Any, source: str, key: str) -> str:
    """A host name or an IP address, else ``ConfigError`` naming ``key``."""
    if not isinstance(host, str) or not host:
        raise _fail(source, key, "must be a host name or an IP address, got %r" % (host,))
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    if len(host) > 253 or not all(_HOST_LABEL.match(label) for label in labels):
        raise _fail(source, key, "%r is neither an IP address nor a host name" % (host,))
    return host


def _profiles() -> Tuple[str, ...]:
    from streamfl.dvfs.profiles import PROFILE_NAMES
    return PROFILE_NAMES


def _kind(value: Any, source: str, key: str) -> str:
    if value not in _profiles():
        raise _fail(source, key, "must be a board profile (%s), got %r"
                    % (", ".join(_profiles()), value))
    return value


def _board_id(value: Any, source: str, key: str) -> str:
    try:
        validate_name(value, "device id")
    except ConfigError as exc:
        raise _fail(source, key, str(exc)) from None
    if value in ROLE_ACCOUNTS:
        raise _fail(source, key, "%r is the broker account of the %s, not a board's (the ACL "
                    "would give the board that role)" % (value, value))
    return value


def _boards(value: Any, source: str) -> List[Board]:
    entries = [value] if isinstance(value, Mapping) else value
    if not isinstance(entries, list) or not entries:
        raise _fail(source, "boards", "must be a list of {id, kind} entries and {count, prefix, "
                    "kind} groups, or one group, got %r" % (value,))
    boards: List[Board] = []
    where: Dict[str, str] = {}
    for n, entry in enumerate(entries):
        key = "boards[%d]" % n if not isinstance(value, Mapping) else "boards"
        entry = _mapping(entry, source, key)
        agent = _agent_section(entry.get("agent"), source, key + ".agent")
        if "count" in entry:
            _unknown(entry, ("count", "prefix", "kind", "start", "digits", "agent"), source, key + ".")
            count = _int(entry["count"], source, key + ".count", 1, MAX_BOARDS)
            prefix = entry.get("prefix", "")
            if not isinstance(prefix, str):
                raise _fail(source, key + ".prefix", "must be a string, got %r" % (prefix,))
            start = _int(entry.get("start", 1), source, key + ".start", 0, 10 ** 9)
            digits = _int(entry.get("digits", max(2, len(str(start + count - 1)))), source,
                          key + ".digits", 1, 12)
            if "kind" not in entry:
                raise _fail(source, key + ".kind", "missing: the board profile of the group")
            kind = _kind(entry["kind"], source, key + ".kind")
            ids = ["%s%0*d" % (prefix, digits, start + i) for i in range(count)]
            made = [(i, key + ".prefix") for i in ids]
        else:
            _unknown(entry, ("id", "kind", "agent"), source, key + ".")
            for needed in ("id", "kind"):
                if needed not in entry:
                    raise _fail(source, "%s.%s" % (key, needed), "missing")
            kind = _kind(entry["kind"], source, key + ".kind")
            made = [(entry["id"], key + ".id")]
        for board_id, at in made:
            _board_id(board_id, source, at)
            if board_id in where:
                raise _fail(source, at, "device id %r is also %s: ids must be unique per broker"
                            % (board_id, where[board_id]))
            where[board_id] = at
            boards.append(Board(board_id, kind, agent))
    if len(boards) > MAX_BOARDS:
        raise _fail(source, "boards", "%d boards: at most %d per fleet file" % (len(boards), MAX_BOARDS))
    return boards


def _owned(section: Dict[str, Any], owned, source: str, prefix: str) -> None:
    for key in owned:
        if key in section:
            raise _fail(source, prefix + key, "written by streamfl provision (%s)" % (
                "set model: at the top level" if key == "model" else "it is the fleet's"))


def _agent_section(value: Any, source: str, key: str) -> Dict[str, Any]:
    section = _mapping(value, source, key)
    _owned(section, AGENT_OWNED, source, key + ".")
    _owned(_mapping(section.get("mqtt"), source, key + ".mqtt"), MQTT_OWNED, source, key + ".mqtt.")
    return section


def _coordinator_section(value: Any, source: str) -> Dict[str, Any]:
    section = _mapping(value, source, "coordinator")
    _owned(section, COORDINATOR_OWNED, source, "coordinator.")
    _owned(_mapping(section.get("mqtt"), source, "coordinator.mqtt"), MQTT_OWNED, source,
           "coordinator.mqtt.")
    _owned(_mapping(section.get("exclusive"), source, "coordinator.exclusive"), EXCLUSIVE_OWNED,
           source, "coordinator.exclusive.")
    operator = _mapping(section.get("operator"), source, "coordinator.operator")
    if "public_keys" in operator:
        raise _fail(source, "coordinator.operator.public_keys",
                    "written by streamfl provision (the operator key it makes)")
    return section


def parse(values: Mapping[str, Any], source: str = "fleet file",
          port: Optional[int] = None) -> FleetSpec:
    """A ``FleetSpec`` from the file's mapping; ``port`` (a flag) replaces ``broker.port``."""
    values = _mapping(values, source, "(top level)")
    _unknown(values, ("fleet", "broker", "auth", "boards", "model", "agent", "coordinator",
                      "certificates"), source, "")
    if "fleet" not in values:
        raise _fail(source, "fleet", "missing: the fleet's name")
    try:
        fleet = validate_name(values["fleet"], "fleet")
    except ConfigError as exc:
        raise _fail(source, "fleet", str(exc)) from None
    broker = _mapping(values.get("broker"), source, "broker")
    _unknown(broker, ("hosts", "port", "bind"), source, "broker.")
    hosts = broker.get("hosts")
    if isinstance(hosts, str):
        hosts = [hosts]
    if not isinstance(hosts, list) or not hosts:
        raise _fail(source, "broker.hosts", "missing: the broker's host names or addresses (the "
                    "boards connect to the first)")
    hosts = [check_host(h, source, "broker.hosts[%d]" % i) for i, h in enumerate(hosts)]
    hosts = list(dict.fromkeys(hosts))
    port = port if port is not None else broker.get("port", DEFAULT_PORT)
    port = _int(port, source, "broker.port", 1, 65535)
    bind = broker.get("bind")
    if bind is not None:
        try:
            ipaddress.ip_address(bind)
        except ValueError:
            raise _fail(source, "broker.bind", "must be an IP address or null, got %r" % (bind,)) from None
    auth = values.get("auth", "password")
    if auth not in AUTH_MODES:
        raise _fail(source, "auth", "must be one of %s, got %r" % (", ".join(AUTH_MODES), auth))
    if "boards" not in values:
        raise _fail(source, "boards", "missing: the boards to make kits for")
    boards = _boards(values["boards"], source)
    certificates = _mapping(values.get("certificates"), source, "certificates")
    _unknown(certificates, tuple(DEFAULT_DAYS), source, "certificates.")
    days = dict(DEFAULT_DAYS)
    for key, default in DEFAULT_DAYS.items():
        days[key] = _int(certificates.get(key, default), source, "certificates." + key, 1, 36500)
    return FleetSpec(fleet=fleet, hosts=tuple(hosts), port=port, bind=bind, auth=auth,
                     boards=tuple(boards), model=_mapping(values.get("model"), source, "model"),
                     agent=_agent_section(values.get("agent"), source, "agent"),
                     coordinator=_coordinator_section(values.get("coordinator"), source),
                     days=days, source=source)


def load(path: Path, port: Optional[int] = None) -> FleetSpec:
    """The fleet file at ``path`` (``ConfigError`` if unreadable or wrong)."""
    return parse(read_yaml(path), str(path), port)
