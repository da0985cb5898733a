"""PahoTransport over TLS with client certificates and a password, against a real mosquitto.

Certificates are made with the openssl command line for each run: a CA, a server certificate for
127.0.0.1 and a client certificate, as a fleet operator would make them (see README, "TLS").
"""
import dataclasses
import os
import shutil
import subprocess
import threading
import time

import pytest

from streamfl.protocol.transport.base import MqttSettings
from streamfl.protocol.transport.paho import PahoTransport, read_password
from streamfl.sim.brokers import free_port, wait_port

pytestmark = [
    pytest.mark.integration, pytest.mark.timeout(60),
    pytest.mark.skipif(not (shutil.which("mosquitto") and shutil.which("mosquitto_passwd")
                            and shutil.which("openssl")),
                       reason="needs mosquitto, mosquitto_passwd and openssl"),
]


def _openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=str(cwd), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _signed(name, subject, cwd, ext=None):
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key", "-out", name + ".csr",
             "-subj", subject, cwd=cwd)
    args = ["x509", "-req", "-in", name + ".csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", name + ".crt", "-days", "2"]
    if ext:
        (cwd / (name + ".ext")).write_text(ext)
        args += ["-extfile", name + ".ext"]
    _openssl(*args, cwd=cwd)


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory):
    """mosquitto on a free port that demands a client certificate signed by our CA and a password."""
    d = tmp_path_factory.mktemp("tls")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "2", "-subj", "/CN=streamfl test CA", cwd=d)
    _signed("server", "/CN=localhost", d, ext="subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _signed("client", "/CN=pi-01", d)
    subprocess.run(["mosquitto_passwd", "-b", "-c", str(d / "passwd"), "pi-01", "s3cret"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (d / "password.txt").write_text("s3cret\n")
    port = free_port()
    conf = ("listener %d 127.0.0.1\ncafile %s/ca.crt\ncertfile %s/server.crt\nkeyfile %s/server.key\n"
            "require_certificate true\nallow_anonymous false\npassword_file %s/passwd\n"
            "log_type error\nlog_type warning\nlog_type notice\n" % (port, d, d, d, d))
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        conf += "user root\n"  # else mosquitto drops to a user that cannot read the key files here
    (d / "mosquitto.conf").write_text(conf)
    log = open(d / "broker.log", "wb")
    proc = subprocess.Popen([shutil.which("mosquitto"), "-c", str(d / "mosquitto.conf")],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        assert wait_port("127.0.0.1", port, 10), (d / "broker.log").read_text()
        yield d, port
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def _transport(d, port, client_id="pi-01", password="s3cret", cert=True):
    settings = MqttSettings(host="127.0.0.1", port=port, client_id=client_id, keepalive_s=5,
                            reconnect_min_s=0.2, reconnect_max_s=0.5, tls_ca=d / "ca.crt",
                            tls_cert=d / "client.crt" if cert else None,
                            tls_key=d / "client.key" if cert else None,
                            username="pi-01", password=password)
    return PahoTransport(settings)


def test_certificate_and_password_connect_and_carry_messages(tls_broker):
    d, port = tls_broker
    t = _transport(d, port, password=read_password(d / "password.txt"))
    got = []
    arrived = threading.Event()
    t.on_message = lambda topic, payload: (got.append((topic, payload)), arrived.set())
    t.subscribe("streamfl/v1/f/device/pi-01/command")
    try:
        t.connect()
        assert t.wait_connected(10), (d / "broker.log").read_text()
        deadline = time.monotonic() + 10
        while not arrived.is_set() and time.monotonic() < deadline:
            t.publish("streamfl/v1/f/device/pi-01/command", b"over tls")
            arrived.wait(0.5)
    finally:
        t.close()
    assert ("streamfl/v1/f/device/pi-01/command", b"over tls") in got


@pytest.mark.parametrize("why,logged", [("wrong password", "not authorized"),
                                         ("no client certificate", "certificate"),
                                         ("another CA", "certificate verify failed")])
def test_bad_credentials_are_refused_and_say_why(tls_broker, tmp_path, caplog, why, logged):
    d, port = tls_broker
    if why == "wrong password":
        t = _transport(d, port, client_id="pi-01-bad-pw", password="guess")
    elif why == "no client certificate":
        t = _transport(d, port, client_id="pi-01-no-cert", cert=False)
    else:                                      # a server certificate our CA did not sign
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "other.key", "-out",
                 "other.crt", "-days", "2", "-subj", "/CN=someone else", cwd=tmp_path)
        t = _transport(d, port, client_id="pi-01-other-ca")
        t = PahoTransport(dataclasses.replace(t.settings, tls_ca=tmp_path / "other.crt"))
    try:
        t.connect()
        assert not t.wait_connected(3)
    finally:
        t.close()
    warnings = [r.getMessage().lower() for r in caplog.records
                if r.name == "streamfl.protocol.transport.paho" and r.levelname == "WARNING"]
    assert any(logged in w for w in warnings), warnings
