"""An agent whose MQTT user name (or client certificate CN) is not its device id says so at start:
under the shipped identity ACL mosquitto drops every publish of such an agent without a word.

The integration test runs mosquitto with the shipped ``configs/mosquitto`` files (the helpers of
``test_broker_acl.py``) and the real ``streamfl-agent``: the mismatched agent warns and nothing it
publishes arrives; an agent whose names agree warns nothing and its status does arrive.
"""
import datetime
import shutil
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fleet import FleetRun
from polling import wait_until
from streamfl.agent import cli as agent_cli
from streamfl.agent.config import AgentConfig
from streamfl.agent.preflight import certificate_common_name, identity_warnings
from streamfl.config import build
from test_broker_acl import A, B, _Client, _running_broker


def _config(**values) -> AgentConfig:
    return build(AgentConfig, dict({"dvfs": {"backend": "none"}}, **values), "test")


def _certificate(d: Path, cn: str) -> Path:
    """A self-signed PEM certificate for ``cn`` (and its key beside it)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    path = d / (cn + ".crt")
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / (cn + ".key")).write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return path


def test_no_warning_when_the_names_agree_or_none_is_set():
    assert identity_warnings(_config(device_id="pi-01", mqtt={"username": "pi-01"})) == []
    assert identity_warnings(_config(device_id="pi-01")) == []


def test_a_user_name_other_than_the_device_id_is_named_in_the_warning():
    (warning,) = identity_warnings(_config(device_id="pi-02", mqtt={"username": "pi-01"}))
    assert "'pi-01'" in warning and "'pi-02'" in warning and "configs/mosquitto/acl" in warning


def test_a_client_certificate_for_another_name_is_named_in_the_warning(tmp_path):
    cert = _certificate(tmp_path, "pi-01")
    assert certificate_common_name(cert) == "pi-01"
    assert certificate_common_name(tmp_path / "missing.crt") is None
    tls = {"tls_ca": str(cert), "tls_cert": str(cert), "tls_key": str(tmp_path / "pi-01.key")}
    assert identity_warnings(_config(device_id="pi-01", mqtt=tls)) == []
    (warning,) = identity_warnings(_config(device_id="pi-02", mqtt=tls))
    assert str(cert) in warning and "'pi-01'" in warning and "'pi-02'" in warning
    # A user name, when set, is what the broker goes by.
    assert identity_warnings(_config(device_id="pi-02", mqtt=dict(tls, username="pi-02"))) == []


def test_check_config_prints_the_warning_and_still_passes(tmp_path, capsys):
    path = tmp_path / "agent.yaml"
    path.write_text("device_id: pi-02\ndvfs: {backend: none}\nmqtt: {username: pi-01}\n")
    assert agent_cli.main(["--config", str(path), "--check-config"], environ={}) == 0
    err = capsys.readouterr().err
    assert err.startswith("streamfl-agent: warning: MQTT user name 'pi-01' differs from device_id 'pi-02'"), err


needs_mosquitto = pytest.mark.skipif(
    not (shutil.which("mosquitto") and shutil.which("mosquitto_passwd") and shutil.which("openssl")),
    reason="needs mosquitto, mosquitto_passwd and openssl")


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory):
    with _running_broker(tmp_path_factory.mktemp("acl"), certificates=False) as b:
        yield b


@needs_mosquitto
@pytest.mark.integration
@pytest.mark.timeout(120)
def test_under_the_shipped_acl_the_mismatched_agent_warns_and_is_not_heard(acl_broker, tmp_path):
    mqtt = {"tls_ca": str(acl_broker.dir / "ca.crt"), "password_file": str(acl_broker.dir / "password.txt")}
    run = FleetRun(tmp_path / "fleet", "127.0.0.1", acl_broker.port)
    status = "streamfl/v1/%s/device/%%s/status" % run.fleet
    watch = _Client(acl_broker, "coordinator", filters=[status % "+"])
    try:
        wrong = run.start_agent(0, device_id=B, mqtt=dict(mqtt, username=A))
        wait_until(lambda: "connected to 127.0.0.1" in wrong.log_text(), 30, "the mismatched agent to connect")
        log = wrong.log_text()
        assert "WARNING" in log and "MQTT user name '%s' differs from device_id '%s'" % (A, B) in log, log
        assert wrong.terminate() == 0
        right = run.start_agent(1, device_id=A, mqtt=dict(mqtt, username=A))
        wait_until(lambda: watch.on(status % A), 30, "the status of the agent whose names agree")
        assert "differs from device_id" not in right.log_text()
        assert watch.on(status % B) == [], "the broker let the mismatched agent's status through"
    finally:
        watch.close()
        run.stop_all()
