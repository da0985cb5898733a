"""One ``streamfl provision`` run: the fleet file and the output folder's registry in, every file of
the fleet out (``provision``), or a board taken out of the broker's password file, ACL and CRL
(``revoke``).

Output folder::

    README.md              what is here, the commands to run, what to chown
    fleet-state.json       the registry (registry.py)
    ca.crt                 the fleet CA (public); ca/ca.key its key (0600, in a 0700 folder)
    broker/                mosquitto.conf, acl, passwd (password fleets) or crl.pem (certificate
                           fleets), ca.crt, server.crt, server.key, data/, log/
    coordinator/           coordinator.yaml, coordinator-signing.key/.pub, ca.crt, and the
                           coordinator's and its probe's password files or certificates
    operator/              operator-signing.key/.pub, ca.crt, password file or certificate
    dashboard/             ca.crt, password file or certificate (reads predictions only)
    kits/<id>/             one per board (kits.py)

A re-run keeps every key, certificate and password it finds, byte for byte, and makes only what is
missing: new boards, a new server certificate when ``broker.hosts`` changed.
"""
import datetime
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from streamfl.errors import ConfigError
from streamfl.provision import broker_files, coordinator_files, kits, passwords, pki
from streamfl.provision.fleet_file import ROLE_ACCOUNTS, FleetSpec
from streamfl.provision.ownership import (DIR_MODE, PRIVATE_DIR_MODE, PUBLIC_MODE, SECRET_MODE,
                                          MOSQUITTO_USER, Files, chown_broker, chown_commands,
                                          mosquitto_ids, running_as_root, unreachable_by)
from streamfl.provision.registry import ACTIVE, REVOKED, Registry, now_text

log = logging.getLogger(__name__)

#: Each role account's folder and the stem of its credential files there.
ROLE_FILES = {"coordinator": ("coordinator", "mqtt"), "coordinator-probe": ("coordinator", "probe"),
              "operator": ("operator", "mqtt"), "dashboard": ("dashboard", "mqtt")}


@dataclass
class Outcome:
    """What a run did, for the README and the lines printed."""

    out: Path
    fleet: str = ""
    auth: str = ""
    new_boards: List[str] = field(default_factory=list)
    kept_boards: List[str] = field(default_factory=list)
    revoked_now: List[str] = field(default_factory=list)
    revoked: List[str] = field(default_factory=list)
    skipped_revoked: List[str] = field(default_factory=list)
    not_in_file: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    chown: List[str] = field(default_factory=list)
    install_script: bool = False
    files: Optional[Files] = None


class Layout:
    """Where each file of the output folder goes."""

    def __init__(self, out: Path):
        self.out = Path(out).resolve()
        self.ca_dir = self.out / "ca"
        self.ca_key = self.ca_dir / "ca.key"
        self.ca_crt = self.out / "ca.crt"
        self.broker = self.out / "broker"
        self.coordinator = self.out / "coordinator"
        self.operator = self.out / "operator"
        self.dashboard = self.out / "dashboard"
        self.kits = self.out / "kits"

    def kit(self, board_id: str) -> Path:
        return self.kits / board_id

    def role_password(self, account: str) -> Path:
        folder, stem = ROLE_FILES[account]
        return self.out / folder / ("%s-password" % stem)

    def role_cert(self, account: str) -> Tuple[Path, Path]:
        folder, stem = ROLE_FILES[account]
        name = account if stem == "mqtt" else "probe"
        return self.out / folder / (name + ".crt"), self.out / folder / (name + ".key")

    def broker_owned(self, certificate_auth: bool) -> List[Path]:
        """What mosquitto reads or writes once it has dropped to its own user."""
        b = self.broker
        return [b / "server.key", b / "acl", b / ("crl.pem" if certificate_auth else "passwd"),
                b / "data", b / "log"]


class Provisioner:
    """Makes (``provision``) or changes (``revoke``) one output folder."""

    def __init__(self, out: Path, shipped_dir: Optional[Path] = None):
        self.layout = Layout(out)
        self.shipped = broker_files.shipped_dir(shipped_dir)
        self.files = Files(self.layout.out)
        self.registry = Registry.load(self.layout.out)

    # ---- provision ---------------------------------------------------------------------------
    def provision(self, spec: FleetSpec) -> Outcome:
        L, reg = self.layout, self.registry
        cert_auth = spec.auth == "certificate"
        self._check_registry(spec)
        outcome = Outcome(L.out, spec.fleet, spec.auth, files=self.files)
        for folder in (L.out, L.broker, L.coordinator, L.operator, L.dashboard, L.kits):
            self.files.folder(folder, DIR_MODE)
        self.files.folder(L.ca_dir, PRIVATE_DIR_MODE)
        for folder in (L.broker / "data", L.broker / "log"):
            self.files.folder(folder, PRIVATE_DIR_MODE)
        ca_key, ca_cert = self._ca(spec)
        ca_pem = pki.cert_pem(ca_cert)
        self._server(spec, ca_key, ca_cert, outcome)
        for folder in (L.broker, L.coordinator, L.operator, L.dashboard):
            self.files.always(folder / "ca.crt", ca_pem, PUBLIC_MODE)
        secrets: Dict[str, str] = {}
        for account in ROLE_ACCOUNTS:
            secrets.update(self._credentials(account, self._role_paths(account, cert_auth),
                                             cert_auth, ca_key, ca_cert, spec))
        wanted = [b.id for b in spec.boards]
        for board in spec.boards:
            record = reg.board(board.id)
            if record is not None and record.get("state") == REVOKED:
                outcome.skipped_revoked.append(board.id)
                continue
            self.files.folder(L.kit(board.id), PRIVATE_DIR_MODE)
            made = self._credentials(board.id, self._kit_paths(board.id, cert_auth), cert_auth,
                                     ca_key, ca_cert, spec)
            secrets.update(made)
            info = {"kind": board.kind}
            if cert_auth:
                cert = pki.load_cert((L.kit(board.id) / kits.CERT_FILE).read_bytes())
                info.update(serial=str(cert.serial_number), sha256=pki.fingerprint(cert))
            if record is None:
                reg.add_board(board.id, info)
                outcome.new_boards.append(board.id)
            else:
                if record.get("kind") != board.kind:
                    outcome.notes.append("%s: kind %s -> %s (its credentials are kept)" % (
                        board.id, record.get("kind"), board.kind))
                record.update(info)
                outcome.kept_boards.append(board.id)
        outcome.not_in_file = [b for b in reg.active_boards() if b not in wanted]
        for board_id in outcome.not_in_file:  # still issued: keep it in the broker's files
            if not cert_auth:
                path = L.kit(board_id) / kits.PASSWORD_FILE
                if path.exists():
                    secrets[board_id] = _first_line(path)
        outcome.revoked = reg.revoked_boards()
        coordinator_key, coordinator_public = coordinator_files.signing_pair(
            L.coordinator, coordinator_files.COORDINATOR_KEY)
        operator_key, operator_public = coordinator_files.signing_pair(
            L.operator, coordinator_files.OPERATOR_KEY)
        self._broker_files(spec, cert_auth, secrets, ca_key, ca_cert)
        self._coordinator_yaml(spec, cert_auth, coordinator_key, operator_public)
        script = kits.install_script()
        outcome.install_script = script is not None
        boards = {b.id: b for b in spec.boards}
        for board_id in reg.active_boards():
            if board_id in boards:
                self._kit(spec, boards[board_id], cert_auth, ca_pem, coordinator_public, script)
        reg.set("fleet", spec.fleet)
        reg.set("auth", spec.auth)
        reg.set("broker", {"hosts": list(spec.hosts), "port": spec.port, "bind": spec.bind})
        reg.set("coordinator_public_key", coordinator_public)
        reg.set("operator_public_key", operator_public)
        reg.set("accounts", {a: {"state": ACTIVE} for a in ROLE_ACCOUNTS})
        if not reg.get("created"):
            reg.set("created", now_text())
        changed = sorted(p.parent.name for p in self.files.changed if p.name == kits.AGENT_YAML)
        if changed:
            outcome.notes.append("the agent.yaml of %d kit(s) changed (%s): install them on their "
                                 "boards again" % (len(changed), ", ".join(changed)))
        self._ownership(cert_auth, outcome)
        reg.save()
        return outcome

    def _check_registry(self, spec: FleetSpec) -> None:
        reg = self.registry
        for key, value in (("fleet", spec.fleet), ("auth", spec.auth)):
            old = reg.get(key)
            if old is not None and old != value:
                raise ConfigError("%s: %s is %r, but %s was provisioned for %s %r: a folder holds one "
                                  "fleet (provision %r into another --out)" % (
                                      spec.source, key, value, self.layout.out, key, old, value))

    def _ca(self, spec: FleetSpec):
        L = self.layout
        if L.ca_key.exists() != L.ca_crt.exists():
            raise ConfigError("%s and %s must both be there or both be missing: the CA cannot be "
                              "half re-made (every board trusts it)" % (L.ca_key, L.ca_crt))
        if not L.ca_key.exists():
            key, cert = pki.make_ca(spec.fleet, spec.days["ca_days"])
            self.files.once(L.ca_key, pki.key_pem(key), SECRET_MODE)
            self.files.once(L.ca_crt, pki.cert_pem(cert), PUBLIC_MODE)
            return key, cert
        key = pki.load_key(self.files.once(L.ca_key, b"", SECRET_MODE))
        cert = pki.load_cert(self.files.once(L.ca_crt, b"", PUBLIC_MODE))
        return key, cert

    def _server(self, spec: FleetSpec, ca_key, ca_cert, outcome: Outcome) -> None:
        crt, key = self.layout.broker / "server.crt", self.layout.broker / "server.key"
        if crt.exists() and key.exists():
            cert = pki.load_cert(crt.read_bytes())
            if sorted(pki.server_hosts(cert)) == sorted(spec.hosts) and cert.issuer == ca_cert.subject:
                self.files.once(crt, b"", PUBLIC_MODE)
                self.files.once(key, b"", SECRET_MODE)
                return
            outcome.notes.append("broker.hosts changed (%s -> %s): a new server certificate; "
                                 "the boards keep theirs (they trust the CA)" % (
                                     ", ".join(pki.server_hosts(cert)), ", ".join(spec.hosts)))
            crt.unlink()
            key.unlink()
        skey, scert = pki.issue_server(ca_key, ca_cert, list(spec.hosts), spec.days["server_days"])
        self.files.once(key, pki.key_pem(skey), SECRET_MODE)
        self.files.once(crt, pki.cert_pem(scert), PUBLIC_MODE)

    def _role_paths(self, account: str, cert_auth: bool) -> Dict[str, Path]:
        if cert_auth:
            crt, key = self.layout.role_cert(account)
            return {"cert": crt, "key": key}
        return {"password": self.layout.role_password(account)}

    def _kit_paths(self, board_id: str, cert_auth: bool) -> Dict[str, Path]:
        kit = self.layout.kit(board_id)
        if cert_auth:
            return {"cert": kit / kits.CERT_FILE, "key": kit / kits.KEY_FILE}
        return {"password": kit / kits.PASSWORD_FILE}

    def _credentials(self, account: str, paths: Dict[str, Path], cert_auth: bool, ca_key, ca_cert,
                     spec: FleetSpec) -> Dict[str, str]:
        """The account's password file or certificate and key (made once); ``{account: password}``
        for password fleets."""
        if not cert_auth:
            text = self.files.once(paths["password"],
                                   lambda: (passwords.new_password() + "\n").encode("ascii"),
                                   SECRET_MODE)
            return {account: text.decode("ascii").splitlines()[0]}
        if paths["cert"].exists() != paths["key"].exists():
            raise ConfigError("%s and %s must both be there or both be missing" % (
                paths["cert"], paths["key"]))
        if not paths["cert"].exists():
            key, cert = pki.issue_client(ca_key, ca_cert, account, spec.days["client_days"])
            self.files.once(paths["key"], pki.key_pem(key), SECRET_MODE)
            self.files.once(paths["cert"], pki.cert_pem(cert), PUBLIC_MODE)
        else:
            self.files.once(paths["key"], b"", SECRET_MODE)
            cert = pki.load_cert(self.files.once(paths["cert"], b"", PUBLIC_MODE))
            if pki.common_name(cert) != account:
                raise ConfigError("%s names %r, not %r" % (paths["cert"], pki.common_name(cert), account))
        return {}

    def _broker_files(self, spec: FleetSpec, cert_auth: bool, secrets: Dict[str, str], ca_key,
                      ca_cert) -> None:
        b = self.layout.broker
        shipped_conf = (self.shipped / "streamfl.conf").read_text(encoding="utf-8")
        conf = broker_files.fleet_conf(shipped_conf, b, spec.port, spec.bind, cert_auth, spec.fleet)
        self.files.always(b / "mosquitto.conf", conf.encode("utf-8"), PUBLIC_MODE)
        self._write_acl(spec.fleet)
        if cert_auth:
            self._write_crl(ca_key, ca_cert, spec.days["crl_days"])
        else:
            path = b / "passwd"
            previous = path.read_text(encoding="utf-8") if path.exists() else ""
            self.files.always(path, passwords.password_file(secrets, previous).encode("utf-8"),
                              SECRET_MODE)

    def _write_acl(self, fleet: str) -> None:
        shipped_acl = (self.shipped / "acl").read_text(encoding="utf-8")
        acl = broker_files.fleet_acl(shipped_acl, self.registry.active_boards(), fleet)
        self.files.always(self.layout.broker / "acl", acl.encode("utf-8"), SECRET_MODE)

    def _write_crl(self, ca_key, ca_cert, days: int) -> None:
        revoked = []
        for board_id in self.registry.revoked_boards():
            record = self.registry.board(board_id)
            if record.get("serial"):
                when = datetime.datetime.fromisoformat(record["revoked"])
                revoked.append((int(record["serial"]), when))
        path = self.layout.broker / "crl.pem"
        # kept while it revokes the same boards and has more than a tenth of its lifetime left
        renew = datetime.timedelta(days=max(1, days // 10))
        if path.exists() and pki.crl_serials(path.read_bytes(), ca_cert, renew) == {s for s, _ in revoked}:
            self.files.once(path, b"", SECRET_MODE)  # the same list: kept as it is
        else:
            self.files.always(path, pki.make_crl(ca_key, ca_cert, revoked, days), SECRET_MODE)
        self.registry.set("crl_days", days)

    def _coordinator_yaml(self, spec: FleetSpec, cert_auth: bool, signing_key: Path,
                          operator_public: str) -> None:
        L = self.layout
        ca = L.coordinator / "ca.crt"
        if cert_auth:
            crt, key = L.role_cert("coordinator")
            pcrt, pkey = L.role_cert("coordinator-probe")
            creds = {"tls_cert": str(crt), "tls_key": str(key)}
            probe = {"probe_username": "coordinator-probe", "probe_tls_cert": str(pcrt),
                     "probe_tls_key": str(pkey)}
        else:
            creds = {"password_file": str(L.role_password("coordinator"))}
            probe = {"probe_username": "coordinator-probe",
                     "probe_password_file": str(L.role_password("coordinator-probe"))}
        mqtt = coordinator_files.mqtt_section(spec.hosts[0], spec.port, ca, "coordinator", creds)
        values = coordinator_files.coordinator_yaml(spec.fleet, spec.model, spec.coordinator, mqtt,
                                                    probe, signing_key, [operator_public])
        path = L.coordinator / "coordinator.yaml"
        header = ("streamfl-coordinator config of fleet %s, written by 'streamfl provision' from %s.\n"
                  "Run: streamfl-coordinator --config %s --state-dir DIR --run-dir DIR"
                  % (spec.fleet, spec.source, path))
        self.files.always(path, coordinator_files.dump(header, values), PUBLIC_MODE)
        coordinator_files.check_coordinator_yaml(path)

    def _kit(self, spec: FleetSpec, board, cert_auth: bool, ca_pem: bytes, coordinator_public: str,
             script: Optional[bytes]) -> None:
        kit = self.layout.kit(board.id)
        self.files.always(kit / kits.CA_FILE, ca_pem, PUBLIC_MODE)
        values = kits.agent_yaml(spec.fleet, board.id, board.kind, spec.hosts[0], spec.port,
                                 cert_auth, coordinator_public, spec.model, spec.agent, board.agent)
        header = ("streamfl-agent config of board %s (%s), fleet %s, written by 'streamfl "
                  "provision'.\nInstalled as %s by install_board.sh; the files it names are this "
                  "kit's, installed beside it." % (board.id, board.kind, spec.fleet,
                                                   kits.BOARD_DIR / kits.AGENT_YAML))
        path = kit / kits.AGENT_YAML
        self.files.always(path, coordinator_files.dump(header, values), 0o644)
        kits.check_agent_yaml(path, board.id)
        described = {kits.AGENT_YAML: "this board's agent configuration",
                     kits.CA_FILE: "the fleet CA (verifies the broker)"}
        if cert_auth:
            described[kits.CERT_FILE] = "this board's client certificate (CN %s)" % board.id
            described[kits.KEY_FILE] = "its private key (mode 0640 when installed)"
        else:
            described[kits.PASSWORD_FILE] = "this board's MQTT password (mode 0640 when installed)"
        if script is not None:
            self.files.always(kit / kits.INSTALL_SCRIPT, script, 0o755)
        self.files.always(kit / "README.txt",
                          kits.readme(board.id, board.kind, spec.fleet, described).encode("utf-8"),
                          PUBLIC_MODE)

    def _ownership(self, cert_auth: bool, outcome: Outcome) -> None:
        owned = self.layout.broker_owned(cert_auth)
        ids = mosquitto_ids()
        if running_as_root() and ids is not None:
            chown_broker(owned, ids)
            blocked = unreachable_by(self.layout.broker / "mosquitto.conf", *ids)
            if blocked is not None:
                outcome.notes.append(
                    "the %s user cannot enter %s: a mosquitto started as root could not read its "
                    "files there (chmod o+x %s, or provision into another folder)"
                    % (MOSQUITTO_USER, blocked, blocked))
            return
        outcome.chown = chown_commands(owned)

    # ---- revoke --------------------------------------------------------------------------------
    def revoke(self, board_ids: List[str], reason: str = "") -> Outcome:
        reg, L = self.registry, self.layout
        if not reg.exists:
            raise ConfigError("--revoke: %s has no %s: provision the fleet there first" % (
                L.out, reg.path.name))
        outcome = Outcome(L.out, reg.get("fleet", ""), reg.get("auth", ""), files=self.files)
        for board_id in board_ids:
            reg.revoke(board_id, reason)
            outcome.revoked_now.append(board_id)
        self._write_acl(reg.get("fleet"))
        if reg.get("auth") == "certificate":
            ca_key = pki.load_key(L.ca_key.read_bytes())
            ca_cert = pki.load_cert(L.ca_crt.read_bytes())
            self._write_crl(ca_key, ca_cert, int(reg.get("crl_days") or 3650))
        else:
            path = L.broker / "passwd"
            kept = [line for user, line in passwords.parse_file(path.read_text()).items()
                    if user not in board_ids]
            self.files.always(path, "".join(line + "\n" for line in kept).encode("utf-8"),
                              SECRET_MODE)
        outcome.revoked = reg.revoked_boards()
        self._ownership(reg.get("auth") == "certificate", outcome)
        reg.save()
        return outcome


def _first_line(path: Path) -> str:
    return path.read_text(encoding="utf-8").splitlines()[0]


__all__ = ["Provisioner", "Outcome", "Layout"]
