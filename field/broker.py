"""A mosquitto from the SHIPPED ``configs/mosquitto/streamfl.conf`` and ``acl``, for tests and the
field lab: what a test of it tests is what ships.

Everything of the two shipped files is kept byte-for-byte but what must differ on a test machine:

- the conf: the paths (``password_file``, ``acl_file``, ``persistence_location``, ``log_dest``,
  ``cafile``, ``certfile``, ``keyfile``) and the ``listener`` line (port, optionally a bind
  address); ``user root`` is appended when run as root (else mosquitto drops to a user that
  cannot read the files here, and warns);
- the ACL: its two example device blocks (``user pi-01``, ``user pi-02``) are replaced by one block
  of the same lines per given device.

It makes, in its folder: a CA and a server certificate (``openssl``, EC P-256 keys: fast to make;
the server's names are 127.0.0.1, localhost, the bind address and ``server_names``), a password
file (``mosquitto_passwd -U``) with one random password per account (``coordinator-probe`` shares
the coordinator's, as the coordinator's default expects), and each password in
``passwords/<account>.txt`` (what ``--password-file`` / ``password_file`` reads).

API (standard library only; no pytest)::

    from field.broker import ShippedBroker          # repo root on sys.path (append it, do not
                                                    # prepend: the root's streamfl/ folder is not
                                                    # the installed package)
    b = ShippedBroker(folder, devices=["pi-a", "pi-b"], port=None, bind="127.0.0.1",
                      accounts=DEFAULT_ACCOUNTS, server_names=())
    b.start(timeout_s=15)        # prepares the files the first time; returns self
    b.host, b.port, b.ca_file    # where clients connect; the CA to trust
    b.password("pi-a"), b.password_file("pi-a")   # an account's password and its file
    b.client_settings("pi-a")    # dict of MqttSettings keyword arguments for that account
    b.stop()                     # SIGTERM: mosquitto saves its persistence db, then exits
    b.restart(down_s=0.0)        # stop, stay down, start on the same port and data
    b.kill()                     # SIGKILL: loses what was not yet autosaved
    b.running, b.pid, b.log_text(), b.conf_path, b.acl_path, b.data_dir
    with ShippedBroker(folder, devices=[...]) as b: ...   # started, stopped on exit

``prepare()`` may be called alone (writes the files without starting); a second ``prepare()`` on
the same folder keeps the certificates and passwords it finds, so a restarted lab keeps its
credentials. ``deployed_conf(shipped_text, values)`` and ``deployed_acl(shipped_text, devices)``
are the two rewrites, for tests that check them: ``streamfl provision``'s own
(``streamfl.provision.broker_files``), so the lab's broker and a provisioned one differ only in
the values.
"""
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional

from streamfl.provision.broker_files import EXAMPLE_DEVICES, deployed_acl, deployed_conf  # noqa: F401
from streamfl.sim.brokers import free_port, wait_port

ROOT = Path(__file__).resolve().parents[1]
#: The shipped broker files this module deploys.
SHIPPED = ROOT / "configs" / "mosquitto"
#: The accounts besides the devices: the coordinator, its start-up probe (read-only on the
#: coordinator status, coordinator/liveness.py), the operator CLI and the predictions dashboard.
DEFAULT_ACCOUNTS = ("coordinator", "coordinator-probe", "operator", "dashboard")
#: Accounts that get another account's password: the probe's, as the coordinator's default
#: (``exclusive.probe_password_file`` null: the coordinator's password file).
SHARED_PASSWORDS = {"coordinator-probe": "coordinator"}
#: The conf options whose values are paths or the listener: the only lines rewritten.
REWRITTEN = ("listener", "cafile", "certfile", "keyfile", "password_file", "acl_file",
             "persistence_location", "log_dest")


class BrokerError(RuntimeError):
    """The broker could not be set up or started (the message says why and where its log is)."""


def _run(argv: List[str], cwd: Path) -> None:
    done = subprocess.run(argv, cwd=str(cwd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise BrokerError("%s failed (%d): %s" % (" ".join(argv[:2]), done.returncode,
                                                  done.stdout.decode(errors="replace").strip()))


def _is_ip(name: str) -> bool:
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, name)
            return True
        except OSError:
            pass
    return False


class ShippedBroker:
    """One mosquitto process from the shipped files, in ``folder``; restartable on its port."""

    def __init__(self, folder: Path, devices: Iterable[str] = (), port: Optional[int] = None,
                 bind: Optional[str] = "127.0.0.1", accounts: Iterable[str] = DEFAULT_ACCOUNTS,
                 server_names: Iterable[str] = (), mosquitto: Optional[str] = None):
        self.dir = Path(folder)
        self.devices = list(devices)
        self.accounts = list(dict.fromkeys(list(accounts) + self.devices))
        #: Where clients connect: the bind address, or 127.0.0.1 when it listens everywhere.
        self.host = bind if bind and bind not in ("0.0.0.0", "::") else "127.0.0.1"
        self.bind = bind
        self.port = port or free_port(self.host)
        self.server_names = list(server_names)
        self.mosquitto = mosquitto or shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        self.ca_file = self.dir / "ca.crt"
        self.conf_path = self.dir / "mosquitto.conf"
        self.acl_path = self.dir / "acl"
        self.passwd_path = self.dir / "passwd"
        self.data_dir = self.dir / "data"
        self.log_path = self.dir / "mosquitto.log"
        self.stderr_path = self.dir / "stderr.log"
        self._passwords: Dict[str, str] = {}
        self._proc: Optional[subprocess.Popen] = None
        self._prepared = False

    # ---- files ----------------------------------------------------------------------------------
    def prepare(self) -> "ShippedBroker":
        """Write certificates, passwords, ACL and conf into the folder (keeping existing
        certificates and passwords)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(exist_ok=True)
        self._certificates()
        self._password_file()
        self.acl_path.write_text(deployed_acl((SHIPPED / "acl").read_text(), self.devices))
        self.acl_path.chmod(0o600)  # newer mosquitto releases warn about files others can read
        listener = str(self.port) + (" %s" % self.bind if self.bind else "")
        conf = deployed_conf((SHIPPED / "streamfl.conf").read_text(), {
            "listener": listener, "cafile": str(self.ca_file),
            "certfile": str(self.dir / "server.crt"), "keyfile": str(self.dir / "server.key"),
            "password_file": str(self.passwd_path), "acl_file": str(self.acl_path),
            "persistence_location": "%s/" % self.data_dir, "log_dest": "file %s" % self.log_path})
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            conf += "user root\n"
        self.conf_path.write_text(conf)
        self._prepared = True
        return self

    def _certificates(self) -> None:
        if self.ca_file.exists() and (self.dir / "server.crt").exists():
            return
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        _run(["openssl", "req", "-x509"] + ec + ["-keyout", "ca.key", "-out", "ca.crt", "-days", "30",
             "-subj", "/CN=streamfl field CA"], self.dir)
        _run(["openssl", "req"] + ec + ["-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=localhost"], self.dir)
        names = ["127.0.0.1", "localhost"] + ([self.bind] if self.bind else []) + self.server_names
        alt = ",".join(("IP:%s" if _is_ip(n) else "DNS:%s") % n for n in dict.fromkeys(names))
        (self.dir / "server.ext").write_text("subjectAltName=%s\n" % alt)
        _run(["openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
              "-CAcreateserial", "-out", "server.crt", "-days", "30", "-extfile", "server.ext"], self.dir)
        (self.dir / "server.key").chmod(0o600)

    def _password_file(self) -> None:
        folder = self.dir / "passwords"
        folder.mkdir(exist_ok=True)
        shared = [a for a in self.accounts if SHARED_PASSWORDS.get(a) in self.accounts]
        for account in [a for a in self.accounts if a not in shared] + shared:
            path = folder / ("%s.txt" % account)
            if path.exists():
                self._passwords[account] = path.read_text().splitlines()[0]
            else:
                self._passwords[account] = (self._passwords[SHARED_PASSWORDS[account]]
                                            if account in shared else secrets.token_urlsafe(12))
                path.write_text(self._passwords[account] + "\n")
                path.chmod(0o600)
        self.passwd_path.write_text("".join("%s:%s\n" % (a, self._passwords[a]) for a in self.accounts))
        self.passwd_path.chmod(0o600)
        _run(["mosquitto_passwd", "-U", str(self.passwd_path)], self.dir)  # hashes it in place

    def password(self, account: str) -> str:
        if not self._prepared:
            self.prepare()
        return self._passwords[account]

    def password_file(self, account: str) -> Path:
        """The file holding ``account``'s password (first line), for ``--password-file``."""
        self.password(account)
        return self.dir / "passwords" / ("%s.txt" % account)

    def client_settings(self, account: str) -> Dict[str, object]:
        """Keyword arguments of ``MqttSettings`` for a client logged in as ``account``."""
        return {"host": self.host, "port": self.port, "tls_ca": self.ca_file, "username": account,
                "password": self.password(account)}

    def log_text(self) -> str:
        """mosquitto's log file and what it wrote to stderr, as text."""
        return "".join(p.read_text(errors="replace") for p in (self.log_path, self.stderr_path)
                       if p.exists())

    # ---- process --------------------------------------------------------------------------------
    def argv(self) -> List[str]:
        return [self.mosquitto, "-c", str(self.conf_path)]

    def start(self, timeout_s: float = 15.0) -> "ShippedBroker":
        """Start mosquitto (preparing the files the first time) and wait until it accepts TCP."""
        if self.running:
            return self
        if not self._prepared:
            self.prepare()
        with open(self.stderr_path, "ab") as err:
            self._proc = subprocess.Popen(self.argv(), stdout=err, stderr=subprocess.STDOUT,
                                          cwd=str(self.dir))
        deadline = time.monotonic() + timeout_s
        while not wait_port(self.host, self.port, 0.2):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise BrokerError("mosquitto did not start on %s:%d:\n%s" % (
                    self.host, self.port, self.log_text()[-2000:]))
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM (mosquitto saves its persistence db), then SIGKILL past ``timeout_s``."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL: what mosquitto held in memory since its last autosave is lost."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def restart(self, down_s: float = 0.0, timeout_s: float = 15.0) -> None:
        """Stop (SIGTERM), stay down ``down_s`` seconds, start again on the same port and data."""
        self.stop()
        time.sleep(down_s)
        self.start(timeout_s)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self.running else None

    def __enter__(self) -> "ShippedBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
