"""The shipped mosquitto configuration keeps each device to its own identity and topics.

mosquitto runs with a byte-for-byte copy of ``configs/mosquitto/acl`` (mode 0600) and with
``configs/mosquitto/streamfl.conf`` where only the lines that must differ on a test machine are
rewritten (``_deployed_conf``): the listener's port (bound to 127.0.0.1) and the paths of the
certificates, password file, ACL, persistence folder and log file; the certificate variant also
gets the README's two listener lines. When the tests run as root, ``user root`` is appended (else
mosquitto drops to a user that cannot read the test's files), and the one warning that causes is
the only one tolerated. Certificates come from ``openssl``, the password file from
``mosquitto_passwd -b`` for ``coordinator``, ``coordinator-probe``, ``operator``, ``dashboard`` and the ACL's two
example devices, ``pi-01`` (device A) and ``pi-02`` (device B).

A negative (a message that must not arrive) is checked only after a positive control, sent later
on the same connection, has arrived (mosquitto keeps one client's messages in order), and after a
short quiet period, so it cannot pass because nothing was delivered at all.
"""
import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

import pytest

from factories import make_global_model, make_hello, make_update
from fleet import FleetRun
from polling import wait_until
from streamfl.protocol.codec import encode
from streamfl.protocol.messages import Command, CoordinatorStatus, DeviceReply, Telemetry
from streamfl.protocol.topics import Topics
from streamfl.protocol.transport.base import MqttSettings
from streamfl.protocol.transport.paho import PahoTransport
from streamfl.sim.brokers import free_port, wait_port

pytestmark = [
    pytest.mark.integration, pytest.mark.timeout(120),
    pytest.mark.skipif(not (shutil.which("mosquitto") and shutil.which("mosquitto_passwd")
                            and shutil.which("openssl")),
                       reason="needs mosquitto, mosquitto_passwd and openssl"),
]

SHIPPED = Path(__file__).resolve().parents[1] / "configs" / "mosquitto"
PASSWORD = "s3cret"
A, B = "pi-01", "pi-02"
OPERATOR = "operator"
#: The ACL's account for apps that read the devices' predictions (docs/predictions.md).
DASHBOARD = "dashboard"
#: Long enough for a message the broker let through to arrive after the control that followed it.
QUIET_S = 0.5
ROOT_WARNING = "Mosquitto should not be run as root/administrator."


def _openssl(cwd: Path, *args: str) -> None:
    subprocess.run(["openssl"] + list(args), cwd=str(cwd), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _signed(d: Path, name: str, subject: str, ext: Optional[str] = None) -> None:
    """``name``.key and ``name``.crt for ``subject``, signed by ca.crt."""
    _openssl(d, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key", "-out",
             name + ".csr", "-subj", subject)
    args = ["x509", "-req", "-in", name + ".csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", name + ".crt", "-days", "2"]
    if ext:
        (d / (name + ".ext")).write_text(ext)
        args += ["-extfile", name + ".ext"]
    _openssl(d, *args)


def _make_certificates(d: Path, clients: Iterable[str] = ()) -> None:
    """ca.crt, a server certificate for 127.0.0.1 and one client certificate (CN = the name) per
    name in ``clients``, all signed by that CA."""
    _openssl(d, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.crt", "-days", "2", "-subj", "/CN=streamfl test CA")
    _signed(d, "server", "/CN=localhost", "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in clients:
        _signed(d, name, "/CN=" + name)


def _deployed_conf(shipped: str, values: Dict[str, str]) -> str:
    """``shipped`` with each line whose option is a key of ``values`` set to that value; every
    other line is kept as it is. Each key must occur exactly once."""
    seen: Dict[str, int] = {key: 0 for key in values}
    lines = []
    for line in shipped.splitlines():
        key = line.split(" ", 1)[0]
        if key in values:
            seen[key] += 1
            line = "%s %s" % (key, values[key])
        lines.append(line)
    assert all(n == 1 for n in seen.values()), "shipped conf lost or repeats an option: %s" % seen
    return "\n".join(lines) + "\n"


class _Broker:
    """The mosquitto process of this module and where its files are."""

    def __init__(self, d: Path, port: int):
        self.dir, self.port = d, port

    def log_text(self) -> str:
        return "".join((self.dir / name).read_text(errors="replace")
                       for name in ("mosquitto.log", "stderr.log") if (self.dir / name).exists())


@contextlib.contextmanager
def _running_broker(d: Path, certificates: bool) -> Iterator[_Broker]:
    """mosquitto with the shipped files; ``certificates``: the README's certificate variant
    (``require_certificate true`` and ``use_identity_as_username true`` added to the listener)."""
    users = ("coordinator", "coordinator-probe", OPERATOR, A, B, DASHBOARD)
    _make_certificates(d, users if certificates else ())
    passwd = d / "passwd"
    for user in users:
        subprocess.run(["mosquitto_passwd", "-b"] + (["-c"] if not passwd.exists() else [])
                       + [str(passwd), user, PASSWORD], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (d / "password.txt").write_text(PASSWORD + "\n")
    acl = d / "acl"
    shutil.copyfile(str(SHIPPED / "acl"), str(acl))
    for private in (passwd, acl):     # newer mosquitto releases warn about files others can read
        private.chmod(0o600)
    (d / "data").mkdir()
    port = free_port()
    values = {"listener": "%d 127.0.0.1" % port,
              "cafile": str(d / "ca.crt"), "certfile": str(d / "server.crt"),
              "keyfile": str(d / "server.key"), "password_file": str(passwd),
              "acl_file": str(acl), "persistence_location": "%s/" % (d / "data"),
              "log_dest": "file %s" % (d / "mosquitto.log")}
    if certificates:
        values["require_certificate"] = "true\nuse_identity_as_username true"
    conf = _deployed_conf((SHIPPED / "streamfl.conf").read_text(), values)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        conf += "user root\n"
    (d / "mosquitto.conf").write_text(conf)
    with open(d / "stderr.log", "wb") as err:
        proc = subprocess.Popen([shutil.which("mosquitto") or "mosquitto", "-c",
                                 str(d / "mosquitto.conf")], stdout=err, stderr=subprocess.STDOUT)
        try:
            b = _Broker(d, port)
            assert wait_port("127.0.0.1", port, 10), b.log_text()
            yield b
        finally:
            proc.terminate()
            proc.wait(10)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """The shipped files as they are: passwords, the client id forced to the user name."""
    with _running_broker(tmp_path_factory.mktemp("acl"), certificates=False) as b:
        yield b


@pytest.fixture(scope="module")
def cert_broker(tmp_path_factory):
    """The certificate variant: the user name (and client id) is the certificate's CN."""
    with _running_broker(tmp_path_factory.mktemp("acl-certs"), certificates=True) as b:
        yield b


class _Client:
    """A PahoTransport logged in as ``user`` (TLS; a password, or the client certificate named
    ``certificate``) that records what it receives."""

    def __init__(self, broker: _Broker, user: str, filters: Iterable[str] = (),
                 client_id: Optional[str] = None, certificate: Optional[str] = None):
        self.got: List[Tuple[str, bytes]] = []
        self.disconnects: List[str] = []
        cert = (broker.dir / (certificate + ".crt")) if certificate else None
        key = (broker.dir / (certificate + ".key")) if certificate else None
        settings = MqttSettings(host="127.0.0.1", port=broker.port, client_id=client_id or user,
                                keepalive_s=5, persistent_session=False, reconnect_min_s=0.2,
                                reconnect_max_s=0.5, tls_ca=broker.dir / "ca.crt", tls_cert=cert,
                                tls_key=key, username=user,
                                password=None if certificate else PASSWORD)
        self.transport = PahoTransport(settings)
        self.transport.on_message = lambda topic, payload: self.got.append((topic, payload))
        self.transport.on_disconnect = self.disconnects.append
        for topic_filter in filters:
            self.transport.subscribe(topic_filter)
        self.transport.connect()
        wait_until(lambda: self.transport.connected, 10, "%s to connect" % user)

    def on(self, topic: str) -> List[bytes]:
        return [payload for t, payload in list(self.got) if t == topic]

    def topics(self) -> set:
        return {t for t, _ in list(self.got)}

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        assert self.transport.publish(topic, payload, qos=1, retain=retain)

    def close(self) -> None:
        self.transport.close()


@pytest.fixture
def clients():
    """Factory of ``_Client``s, all closed after the test (one connection per user at a time:
    the broker makes the user name the client id, so a second one would replace the first)."""
    made: List[_Client] = []

    def make(*args, **kwargs) -> _Client:
        made.append(_Client(*args, **kwargs))
        return made[-1]

    try:
        yield make
    finally:
        for client in made:
            client.close()


def _coordinator(broker: _Broker, clients, topics: Topics,
                 certificate: Optional[str] = None) -> Tuple[_Client, bytes]:
    """A coordinator watching all of ``streamfl/v1/#`` once its retained model came back (so its
    subscription is live); the model frame it published."""
    model = encode(make_global_model(version=1))
    coordinator = clients(broker, "coordinator", ["streamfl/v1/#"], certificate=certificate)
    coordinator.publish(topics.model, model, retain=True)
    wait_until(lambda: model in coordinator.on(topics.model), 10, "the coordinator's own model")
    return coordinator, model


@pytest.mark.parametrize("which", ["broker", "cert_broker"])
def test_shipped_configuration_loads_without_warnings(request, which):
    broker = request.getfixturevalue(which)
    # mosquitto writes "running" after it opened its sockets; on a loaded machine that can come
    # after the port already answers.
    wait_until(lambda: "running" in broker.log_text(), 10, "mosquitto's 'running' line")
    log = broker.log_text()
    warnings = [line for line in log.splitlines() if "warning" in line.lower()
                and not (line.endswith(ROOT_WARNING) and os.geteuid() == 0)]
    assert warnings == [], log


def test_a_device_cannot_write_another_devices_topics_the_model_or_the_coordinator_status(
        broker, clients):
    topics = Topics("writes")
    coordinator, model = _coordinator(broker, clients, topics)
    a = clients(broker, A)
    forged = {
        topics.device(B, "status"): encode(make_hello(B)),
        topics.device(B, "update"): encode(make_update(device_id=B)),
        topics.device(B, "telemetry"): encode(Telemetry(B, 1.0, 1, 2)),
        # Fleet control: a board answers for itself only (the coordinator also checks the id).
        topics.device(B, "reply"): encode(DeviceReply(B, "pause", 7, True)),
        topics.device(B, "command"): encode(Command("skip", {"rounds": 3})),
        topics.device(A, "command"): encode(Command("skip", {"rounds": 3})),
        topics.model: encode(make_global_model(version=99)),
        topics.coordinator_status: encode(CoordinatorStatus(online=False, version=99)),
    }
    for topic, frame in forged.items():
        a.publish(topic, frame, retain=topic in (topics.model, topics.coordinator_status))
    own = {"status": encode(make_hello(A)), "update": encode(make_update(device_id=A)),
           "telemetry": encode(Telemetry(A, 1.0, 1, 2)),
           "reply": encode(DeviceReply(A, "pause", 7, True))}
    for kind, frame in own.items():                     # the positive controls, sent last
        a.publish(topics.device(A, kind), frame)
    for kind, frame in own.items():
        wait_until(lambda: frame in coordinator.on(topics.device(A, kind)), 10,
                   "device A's own %s at the coordinator" % kind)
    time.sleep(QUIET_S)
    assert coordinator.on(topics.model) == [model]
    for topic in forged:
        if topic != topics.model:
            assert coordinator.on(topic) == [], topic
    # Nothing forged was retained either: a device that subscribes now gets the real model only.
    b = clients(broker, B, [topics.model, topics.coordinator_status])
    wait_until(lambda: b.on(topics.model), 10, "the retained model at device B")
    time.sleep(QUIET_S)
    assert b.on(topics.model) == [model] and b.on(topics.coordinator_status) == []


def test_a_device_reads_the_model_and_its_own_commands_but_not_another_devices(broker, clients):
    topics = Topics("reads")
    coordinator, model = _coordinator(broker, clients, topics)
    b = clients(broker, B, [topics.model, topics.device(B, "command")])
    a = clients(broker, A, [topics.model, topics.device(A, "command"), topics.device(B, "command"),
                            "streamfl/v1/#"])
    wait_until(lambda: model in a.on(topics.model) and model in b.on(topics.model), 10,
               "the retained model at both devices (their subscriptions are live)")
    to_b, to_a = encode(Command("skip", {"rounds": 1})), encode(Command("skip", {"rounds": 2}))
    status = encode(CoordinatorStatus(online=True, version=1))
    coordinator.publish(topics.device(B, "command"), to_b)
    coordinator.publish(topics.device(B, "update"), encode(make_update(device_id=B)))
    coordinator.publish(topics.device(A, "command"), to_a)    # positive controls, sent last
    coordinator.publish(topics.coordinator_status, status)
    wait_until(lambda: to_b in b.on(topics.device(B, "command")), 10, "B's command at B")
    wait_until(lambda: to_a in a.on(topics.device(A, "command"))
               and status in a.on(topics.coordinator_status), 10,
               "A's command and the coordinator's status at A")
    time.sleep(QUIET_S)
    seen = {t for t in a.topics() if t.startswith(topics.prefix + "/")}  # "#" sees other tests' models
    assert seen == {topics.model, topics.device(A, "command"), topics.coordinator_status}, seen


def test_only_the_operator_writes_the_coordinators_command_topic(broker, clients):
    """The operator account sends the coordinator commands (new-session) and does nothing else; a
    device cannot send one."""
    topics = Topics("operator")
    coordinator, model = _coordinator(broker, clients, topics)
    a = clients(broker, A)
    forged = encode(Command("new-session", {"by": A}))
    a.publish(topics.coordinator_command, forged)
    control = encode(make_hello(A))
    a.publish(topics.device(A, "status"), control)                  # A's positive control, last
    operator = clients(broker, OPERATOR, ["streamfl/v1/#"])
    beyond = {topics.device(A, "command"): encode(Command("skip", {"rounds": 9})),
              topics.model: encode(make_global_model(version=99))}
    for topic, frame in beyond.items():
        operator.publish(topic, frame, retain=topic == topics.model)
    sent = encode(Command("new-session"))
    operator.publish(topics.coordinator_command, sent)               # the operator's, last
    wait_until(lambda: control in coordinator.on(topics.device(A, "status")), 10,
               "device A's own status at the coordinator")
    wait_until(lambda: sent in coordinator.on(topics.coordinator_command), 10,
               "the operator's command at the coordinator")
    time.sleep(QUIET_S)
    assert coordinator.on(topics.coordinator_command) == [sent]
    assert coordinator.on(topics.model) == [model] and coordinator.on(topics.device(A, "command")) == []
    # Nor does the operator read anything, not even the retained model.
    assert operator.topics() == set(), operator.topics()


def _posing_as_b_changes_nothing(broker: _Broker, clients, topics: Topics,
                                 certificates: bool) -> None:
    """Device A connects with B's client id (and, with certificates, B's user name): it is still A."""
    coordinator, _ = _coordinator(broker, clients, topics,
                                  certificate="coordinator" if certificates else None)
    b = clients(broker, B, [topics.model, topics.device(B, "command")],
                certificate=B if certificates else None)
    wait_until(lambda: b.on(topics.model), 10, "the retained model at device B")
    posing = clients(broker, B if certificates else A, [topics.model, topics.device(B, "command")],
                     client_id=B, certificate=A if certificates else None)
    wait_until(lambda: posing.on(topics.model), 10, "the retained model at A posing as B")
    forged = encode(make_update(device_id=B))
    control = encode(make_update(device_id=A))
    posing.publish(topics.device(B, "update"), forged)
    posing.publish(topics.device(A, "update"), control)
    command = encode(Command("skip", {"rounds": 1}))
    coordinator.publish(topics.device(B, "command"), command)
    wait_until(lambda: control in coordinator.on(topics.device(A, "update")), 10,
               "the update A sent as itself")
    wait_until(lambda: command in b.on(topics.device(B, "command")), 10, "B's command at B")
    time.sleep(QUIET_S)
    assert coordinator.on(topics.device(B, "update")) == []
    assert posing.on(topics.device(B, "command")) == []
    # Taking B's client id would have thrown the real B off the broker; it stayed connected.
    assert b.disconnects == [] and b.transport.connected


def test_choosing_another_devices_client_id_does_not_make_a_device_that_device(broker, clients):
    _posing_as_b_changes_nothing(broker, clients, Topics("identity"), certificates=False)


def test_with_certificates_the_certificate_says_who_a_device_is(cert_broker, clients):
    _posing_as_b_changes_nothing(cert_broker, clients, Topics("certs"), certificates=True)


def test_the_coordinator_and_an_agent_run_under_the_acl(broker, tmp_path):
    """The real programs: an agent logged in as pi-01 sends updates the coordinator merges, and
    trains on a model it read (an update based on version 1 or later)."""
    mqtt = {"tls_ca": str(broker.dir / "ca.crt"), "password_file": str(broker.dir / "password.txt")}
    run = FleetRun(tmp_path / "fleet", "127.0.0.1", broker.port)
    try:
        run.start_coordinator(mqtt=dict(mqtt, username="coordinator"))
        run.start_agent(0, device_id=A, mqtt=dict(mqtt, username=A))
        run.wait_for(lambda: [u for u in run.updates() if u["device"] == A and u["base_version"] >= 1],
                     90, "an update from %s based on a model it read" % A)
    finally:
        run.stop_all()
    assert {u["device"] for u in run.updates()} == {A}
