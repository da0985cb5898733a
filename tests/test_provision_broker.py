"""The hardened broker starts from ``streamfl provision``'s output with no hand edit: the real
mosquitto on the generated config (on a free loopback port), a board account connects over TLS
and publishes its update topic, one board cannot write another's, a wrong password is refused, and
a board revoked (``--revoke``, then the reload a user does: SIGHUP) is refused; for password and
certificate fleets.

As root, mosquitto drops to the ``mosquitto`` user, which must be able to enter the output folder:
the test's folder is made under /tmp and opened to others for that (pytest's own are 0700), as a
user provisioning as root must do (the run says so when it is not).
"""
import os
import shutil
import shlex
import signal
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest
import yaml

from polling import wait_for, wait_until
from streamfl.cli import main
from streamfl.sim.brokers import free_port, wait_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120),
              pytest.mark.skipif(not shutil.which("mosquitto") and not Path("/usr/sbin/mosquitto").exists(),
                                 reason="needs mosquitto")]

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
FLEET = "farm"
BOARDS = ("pi-01", "pi-02", "pi-03")
#: Long enough for a message the broker let through to arrive after the control that followed it.
QUIET_S = 0.5


@pytest.fixture
def folder(open_folder):
    return open_folder


class Client:
    """A paho client logged in with an account's provisioned files."""

    def __init__(self, out: Path, account: str, files: Dict[str, Path], port: int):
        import paho.mqtt.client as mqtt
        self.got: List[str] = []
        self.rc: Optional[int] = None
        self.connected = threading.Event()
        self.done = threading.Event()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=account)
        self.client.tls_set(ca_certs=str(out / "ca.crt"), certfile=_s(files.get("cert")),
                            keyfile=_s(files.get("key")), cert_reqs=ssl.CERT_REQUIRED)
        if "password" in files:
            self.client.username_pw_set(account, files["password"].read_text().splitlines()[0])
        self.client.on_connect = self._on_connect
        self.client.on_message = lambda c, u, m: self.got.append(m.topic)
        self.client.on_disconnect = lambda *a: self.done.set()
        self.port = port

    def _on_connect(self, client, userdata, flags, reason, properties):
        self.rc = reason.value if hasattr(reason, "value") else int(reason)
        (self.connected if self.rc == 0 else self.done).set()

    def start(self) -> "Client":
        try:
            self.client.connect("127.0.0.1", self.port, keepalive=10)
        except (ssl.SSLError, OSError) as exc:  # a revoked certificate: the handshake fails
            self.rc = -1
            self.error = exc
            self.done.set()
            return self
        self.client.loop_start()
        wait_for(lambda: self.connected.is_set() or self.done.is_set(), 10)
        return self

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _s(path: Optional[Path]) -> Optional[str]:
    return None if path is None else str(path)


def _files(out: Path, account: str, auth: str) -> Dict[str, Path]:
    if account in BOARDS:
        kit = out / "kits" / account
        return ({"cert": kit / "client.crt", "key": kit / "client.key"} if auth == "certificate"
                else {"password": kit / "mqtt-password"})
    folder = out / "coordinator"
    return ({"cert": folder / "coordinator.crt", "key": folder / "coordinator.key"}
            if auth == "certificate" else {"password": folder / "mqtt-password"})


@pytest.mark.parametrize("auth", ["password", "certificate"])
def test_the_provisioned_broker_starts_and_keeps_boards_apart(folder, auth):
    port = free_port("127.0.0.1")
    fleet_file = folder / "fleet.yaml"
    fleet_file.write_text(yaml.safe_dump({
        "fleet": FLEET, "broker": {"hosts": ["127.0.0.1"], "port": 8883, "bind": "127.0.0.1"},
        "auth": auth, "boards": [{"id": b, "kind": "raspberry-pi-5"} for b in BOARDS]}))
    out = folder / "out"
    assert main(["provision", str(fleet_file), "--out", str(out), "--port", str(port)]) == 0
    conf = out / "broker" / "mosquitto.conf"
    log_file = out / "broker" / "log" / "mosquitto.log"
    broker = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)
    clients: List[Client] = []

    def log_text() -> str:
        return log_file.read_text(errors="replace") if log_file.exists() else ""

    def connect(account: str) -> Client:
        c = Client(out, account, _files(out, account, auth), port).start()
        clients.append(c)
        return c
    try:
        assert wait_port("127.0.0.1", port, 10), "mosquitto did not start:\n%s" % log_text()
        coordinator = connect("coordinator")
        assert coordinator.rc == 0, log_text()
        coordinator.client.subscribe("streamfl/v1/%s/device/+/update" % FLEET, qos=1)
        time.sleep(0.3)
        a = connect("pi-01")
        assert a.rc == 0, log_text()
        own = "streamfl/v1/%s/device/pi-01/update" % FLEET
        other = "streamfl/v1/%s/device/pi-02/update" % FLEET
        a.client.publish(own, b"first", qos=1).wait_for_publish(5)
        wait_until(lambda: own in coordinator.got, 10, "pi-01's update at the coordinator")
        a.client.publish(other, b"forged", qos=1).wait_for_publish(5)
        a.client.publish(own, b"control", qos=1).wait_for_publish(5)
        wait_until(lambda: coordinator.got.count(own) == 2, 10, "the control update")
        time.sleep(QUIET_S)
        assert other not in coordinator.got
        if auth == "password":  # a wrong password
            (folder / "wrong").write_text("not-the-password\n")
            wrong = Client(out, "pi-02", {"password": folder / "wrong"}, port).start()
            clients.append(wrong)
            assert wrong.rc not in (0, None)
        c = connect("pi-03")
        assert c.rc == 0
        assert main(["provision", "--revoke", "pi-03", "--out", str(out)]) == 0
        broker.send_signal(signal.SIGHUP)  # what the run tells the user to do
        wait_until(lambda: "Reloading config" in log_text(), 10, "the broker's reload")
        if auth == "password":  # the reload drops the revoked board's live connection
            wait_until(c.done.is_set, 10, "pi-03's connection dropped")
        again = connect("pi-03")
        # refused: a CONNACK that says so (password), or a TLS handshake the broker ends (a
        # revoked certificate: under TLS 1.3 the client hears it only when it reads)
        wait_until(again.done.is_set, 10, "the revoked board's refusal")
        assert not again.connected.is_set(), "a revoked board connected again:\n%s" % log_text()
        if auth == "certificate":
            assert "certificate verify failed" in log_text()
        assert connect("pi-02").rc == 0  # the others are untouched
        # the operator's command line that the output's README gives logs in (no coordinator
        # runs here, so nobody answers: it times out, after the broker took its login)
        line = next(x for x in (out / "README.md").read_text().splitlines()
                    if x.startswith("streamfl operator status "))
        done = subprocess.run(["streamfl"] + shlex.split(line)[1:] + ["--timeout", "2"],
                              capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, PATH=os.pathsep.join(
                                  [str(Path(sys.executable).parent), os.environ.get("PATH", "")])))
        assert done.returncode != 0
        wait_until(lambda: "u'operator'" in log_text(), 10, "the operator's login:\n" + done.stderr)
        warnings = [line for line in log_text().splitlines() if "warning" in line.lower()]
        assert not warnings, warnings
    finally:
        for c in clients:
            c.stop()
        broker.terminate()
        broker.wait(10)
