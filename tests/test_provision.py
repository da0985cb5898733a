"""``streamfl provision`` without a broker: the fleet file's errors name their key (exit 2), what it
writes loads in the agent's and the coordinator's own config checks, its password lines are
mosquitto's ``$7$`` format, its ACL keeps every pattern line of the shipped one, and a re-run
adds boards while every key, certificate and password already issued stays byte for byte."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from streamfl.cli import main
from streamfl.errors import ConfigError
from streamfl.provision import broker_files, fleet_file, passwords, pki
from streamfl.provision.provisioner import Provisioner

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "configs" / "mosquitto"
MODEL = {"name": "mlp", "in_channels": 3, "window_len": 8, "num_classes": 4, "hidden": 16}
SENSOR = {"kind": "synthetic", "window_len": 8, "stride": 4, "channels": 3, "num_classes": 4}


def _fleet(tmp_path: Path, **over) -> Path:
    values = {"fleet": "farm1", "broker": {"hosts": ["127.0.0.1", "broker.local"], "port": 18883},
              "boards": [{"id": "pi-01", "kind": "raspberry-pi-5"},
                         {"count": 2, "prefix": "orin-", "kind": "jetson-orin-nano"}],
              "model": MODEL, "agent": {"sensor": SENSOR}}
    values.update(over)
    path = tmp_path / ("fleet-%d.yaml" % len(list(tmp_path.glob("fleet-*.yaml"))))
    path.write_text(yaml.safe_dump(values))
    return path


def _provision(tmp_path: Path, out: Path, **over):
    return Provisioner(out).provision(fleet_file.load(_fleet(tmp_path, **over)))


def _secret_files(out: Path):
    """Every key, certificate and password file, by path, with its bytes."""
    names = ("*.key", "*.crt", "*password", "crl.pem")
    return {p: p.read_bytes() for pattern in names for p in out.rglob(pattern)
            if p.name != "ca.crt" or p.parent == out}


@pytest.mark.parametrize("change, key", [
    ({"fleet": "bad/fleet"}, "fleet"),
    ({"broker": {"hosts": []}}, "broker.hosts"),
    ({"broker": {"hosts": ["ok.local", "not a host"]}}, "broker.hosts[1]"),
    ({"broker": {"hosts": ["h"], "port": 70000}}, "broker.port"),
    ({"broker": {"hosts": ["h"], "bind": "everywhere"}}, "broker.bind"),
    ({"broker": {"hosts": ["h"], "colour": 1}}, "broker.colour"),
    ({"auth": "token"}, "auth"),
    ({"boards": [{"id": "pi 01", "kind": "raspberry-pi-5"}]}, "boards[0].id"),
    ({"boards": [{"id": "pi-01"}]}, "boards[0].kind"),
    ({"boards": [{"id": "pi-01", "kind": "raspberry-pi-9"}]}, "boards[0].kind"),
    ({"boards": [{"id": "pi-01", "kind": "raspberry-pi-5"},
                 {"count": 3, "prefix": "pi-", "kind": "raspberry-pi-5"}]}, "boards[1].prefix"),
    ({"boards": [{"id": "operator", "kind": "raspberry-pi-5"}]}, "boards[0].id"),
    ({"boards": {"count": 0, "prefix": "pi-", "kind": "raspberry-pi-5"}}, "boards.count"),
    ({"agent": {"device_id": "x"}}, "agent.device_id"),
    ({"agent": {"mqtt": {"host": "x"}}}, "agent.mqtt.host"),
    ({"coordinator": {"signing_key_file": "k"}}, "coordinator.signing_key_file"),
    ({"certificates": {"ca_days": 0}}, "certificates.ca_days"),
    ({"colour": "blue"}, "colour"),
])
def test_a_wrong_fleet_file_names_the_key_and_exits_2(tmp_path, capsys, change, key):
    path = _fleet(tmp_path, **change)
    with pytest.raises(ConfigError) as info:
        fleet_file.load(path)
    assert (": %s: " % key) in str(info.value), str(info.value)
    assert main(["provision", str(path), "--out", str(tmp_path / "out")]) == 2
    assert key in capsys.readouterr().err
    assert not (tmp_path / "out" / "fleet-state.json").exists()


def test_count_and_prefix_make_numbered_ids(tmp_path):
    spec = fleet_file.load(_fleet(tmp_path, boards={"count": 12, "prefix": "pi-", "kind": "raspberry-pi-4",
                                                    "start": 5}))
    assert [b.id for b in spec.boards] == ["pi-%02d" % n for n in range(5, 17)]
    assert fleet_file.load(ROOT / "configs" / "fleet.example.yaml").boards[-1].id == "pi-30"


def test_password_lines_are_mosquittos_format_and_kept_when_they_still_match():
    line = passwords.hash_line("pi-01", "s3cret", salt=b"\x01" * 12)
    assert line.startswith("pi-01:$7$101$AQEBAQEBAQEBAQEB$") and len(line.split("$")[4]) == 88
    assert passwords.line_matches(line, "s3cret") and not passwords.line_matches(line, "other")
    kept = passwords.password_file({"pi-01": "s3cret", "pi-02": "new"}, line + "\n")
    assert kept.splitlines()[0] == line and passwords.line_matches(kept.splitlines()[1], "new")
    assert passwords.password_file({"pi-01": "changed"}, line + "\n").splitlines()[0] != line


def test_the_acl_keeps_every_shipped_pattern_and_role_block(tmp_path):
    out = tmp_path / "out"
    _provision(tmp_path, out)
    shipped = (SHIPPED / "acl").read_text()
    acl = (out / "broker" / "acl").read_text()
    patterns = broker_files.pattern_lines(shipped)
    assert patterns and all(p in acl.splitlines() for p in patterns)
    for role in fleet_file.ROLE_ACCOUNTS:
        assert "user %s" % role in acl.splitlines()
    for board in ("pi-01", "orin-01", "orin-02"):
        assert "user %s" % board in acl.splitlines()
    assert "user pi-02" not in acl  # the shipped example block is gone
    # a line another change adds to the shipped ACL reaches the generated one
    extra = tmp_path / "shipped"
    extra.mkdir()
    (extra / "streamfl.conf").write_text((SHIPPED / "streamfl.conf").read_text())
    (extra / "acl").write_text(shipped.replace(
        "pattern read streamfl/v1/+/device/%u/command\n",
        "pattern read streamfl/v1/+/device/%u/command\npattern write streamfl/v1/+/device/%u/reply\n"))
    Provisioner(tmp_path / "out2", extra).provision(fleet_file.load(_fleet(tmp_path)))
    assert "pattern write streamfl/v1/+/device/%u/reply" in (tmp_path / "out2" / "broker" / "acl").read_text()


def test_the_conf_is_the_shipped_one_with_paths_listener_and_auth_rewritten(tmp_path):
    out = tmp_path / "out"
    _provision(tmp_path, out, auth="certificate")
    conf = (out / "broker" / "mosquitto.conf").read_text().splitlines()
    shipped = (SHIPPED / "streamfl.conf").read_text().splitlines()
    changed = {"listener", "cafile", "certfile", "keyfile", "password_file", "acl_file",
               "persistence_location", "log_dest", "require_certificate"}
    kept = [line for line in shipped if line.split(" ", 1)[0] not in changed]
    assert [line for line in conf if line in kept] == kept
    assert "listener 18883" in conf and "require_certificate true" in conf
    assert "use_identity_as_username true" in conf
    assert "crlfile %s" % (out / "broker" / "crl.pem").resolve() in conf
    assert not any(line.startswith("password_file ") for line in conf)


def test_modes_of_keys_and_passwords(tmp_path):
    out = tmp_path / "out"
    _provision(tmp_path, out)
    mode = lambda p: (out / p).stat().st_mode & 0o777  # noqa: E731
    assert mode("ca") == 0o700 and mode("ca/ca.key") == 0o600
    for secret in ("broker/server.key", "broker/passwd", "broker/acl", "coordinator/mqtt-password",
                   "coordinator/probe-password", "coordinator/coordinator-signing.key",
                   "operator/operator-signing.key", "operator/mqtt-password",
                   "dashboard/mqtt-password", "kits/pi-01/mqtt-password"):
        assert mode(secret) == 0o600, secret
    assert mode("broker/mosquitto.conf") == 0o644 and mode("kits/pi-01/agent.yaml") == 0o644


def test_generated_yaml_passes_the_programs_own_check_config(tmp_path):
    out = tmp_path / "out"
    _provision(tmp_path, out, auth="certificate")
    kit = out / "kits" / "orin-02"
    agent = yaml.safe_load((kit / "agent.yaml").read_text())
    assert agent["device_id"] == "orin-02" and agent["board"] == "jetson-orin-nano"
    assert agent["mqtt"]["tls_cert"] == "/etc/streamfl/client.crt"
    assert agent["coordinator_public_key"] == (out / "coordinator" / "coordinator-signing.pub").read_text().strip()
    cert = pki.load_cert((kit / "client.crt").read_bytes())
    assert pki.common_name(cert) == "orin-02"
    bin_dir = Path(sys.executable).parent
    # the kit's files stand where the board would have them installed (/etc/streamfl/...)
    done = subprocess.run([str(bin_dir / "streamfl-agent"), "--check-config", "--config", str(kit / "agent.yaml"),
                           "--tls-ca", str(kit / "ca.crt"), "--tls-cert", str(kit / "client.crt"),
                           "--tls-key", str(kit / "client.key")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr.lower(), done.stderr
    coordinator = out / "coordinator" / "coordinator.yaml"
    done = subprocess.run([str(bin_dir / "streamfl-coordinator"), "--check-config", "--config",
                           str(coordinator)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    checked = yaml.safe_load(done.stdout)
    assert checked["exclusive"]["probe_tls_cert"] == str((out / "coordinator" / "probe.crt").resolve())
    assert checked["operator"]["public_keys"] == [(out / "operator" / "operator-signing.pub").read_text().strip()]
    assert pki.common_name(pki.load_cert((out / "coordinator" / "probe.crt").read_bytes())) == "coordinator-probe"


@pytest.mark.parametrize("auth", ["password", "certificate"])
def test_a_rerun_adds_boards_and_keeps_every_issued_file_byte_for_byte(tmp_path, auth):
    out = tmp_path / "out"
    first = _provision(tmp_path, out, auth=auth)
    assert sorted(first.new_boards) == ["orin-01", "orin-02", "pi-01"]
    before = _secret_files(out)
    passwd_before = (out / "broker" / "passwd").read_text() if auth == "password" else ""
    boards = [{"id": "pi-01", "kind": "raspberry-pi-5"},
              {"count": 4, "prefix": "orin-", "kind": "jetson-orin-nano"}]
    second = _provision(tmp_path, out, auth=auth, boards=boards)
    assert sorted(second.new_boards) == ["orin-03", "orin-04"]
    after = _secret_files(out)
    assert {p: after[p] for p in before} == before
    assert any("orin-04" in str(p) for p in set(after) - set(before))
    if auth == "password":
        lines = (out / "broker" / "passwd").read_text().splitlines()
        assert set(passwd_before.splitlines()) <= set(lines)
        assert sum(1 for line in lines if line.startswith("orin-04:$7$")) == 1
    # a revoked board is not issued again by a later run, and its record stays
    assert main(["provision", "--revoke", "orin-01", "--out", str(out)]) == 0
    third = _provision(tmp_path, out, auth=auth, boards=boards)
    assert third.skipped_revoked == ["orin-01"]
    state = yaml.safe_load((out / "fleet-state.json").read_text())
    assert state["boards"]["orin-01"]["state"] == "revoked" and state["boards"]["orin-01"]["revoked"]
    assert "user orin-01" not in (out / "broker" / "acl").read_text()
    if auth == "password":
        assert "orin-01:" not in (out / "broker" / "passwd").read_text()
    else:
        from cryptography import x509
        crl = x509.load_pem_x509_crl((out / "broker" / "crl.pem").read_bytes())
        serial = int(state["boards"]["orin-01"]["serial"])
        assert crl.get_revoked_certificate_by_serial_number(serial) is not None
        assert len(list(crl)) == 1


def test_a_folder_holds_one_fleet(tmp_path, capsys):
    out = tmp_path / "out"
    _provision(tmp_path, out)
    assert main(["provision", str(_fleet(tmp_path, auth="certificate")), "--out", str(out)]) == 2
    assert "auth" in capsys.readouterr().err
    assert main(["provision", "--revoke", "nobody", "--out", str(out)]) == 2


def test_stdout_says_what_to_chown_when_not_root(tmp_path, capsys, monkeypatch):
    from streamfl.provision import provisioner
    monkeypatch.setattr(provisioner, "running_as_root", lambda: False)
    out = tmp_path / "out"
    assert main(["provision", str(_fleet(tmp_path)), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    command = "sudo chown mosquitto:mosquitto %s" % " ".join(
        str((out / "broker" / name).resolve()) for name in ("server.key", "acl", "passwd", "data", "log"))
    assert command in printed
    assert command in (out / "README.md").read_text()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root (chown)")
def test_as_root_the_broker_files_belong_to_mosquitto(tmp_path):
    from streamfl.provision.ownership import mosquitto_ids
    ids = mosquitto_ids()
    if ids is None:
        pytest.skip("no mosquitto user")
    out = tmp_path / "out"
    _provision(tmp_path, out)
    for name in ("server.key", "acl", "passwd", "data", "log"):
        assert (out / "broker" / name).stat().st_uid == ids[0], name
    assert (out / "ca" / "ca.key").stat().st_uid == 0


def test_a_crl_near_its_next_update_is_made_again(tmp_path):
    from cryptography import x509
    out = tmp_path / "out"
    _provision(tmp_path, out, auth="certificate", certificates={"crl_days": 1})
    first = (out / "broker" / "crl.pem").read_bytes()
    time.sleep(1.1)  # a new CRL's last update differs by at least a second
    _provision(tmp_path, out, auth="certificate", certificates={"crl_days": 1})
    second = (out / "broker" / "crl.pem").read_bytes()
    assert first != second  # inside its last tenth (at least a day): renewed
    assert x509.load_pem_x509_crl(second).next_update_utc > x509.load_pem_x509_crl(first).next_update_utc


def test_a_boards_own_agent_keys_reach_its_kit_only_and_a_changed_kit_is_named(tmp_path):
    out = tmp_path / "out"
    boards = [{"id": "pi-01", "kind": "raspberry-pi-5", "agent": {"round_interval_s": 2.0}},
              {"id": "pi-02", "kind": "raspberry-pi-4"}]
    _provision(tmp_path, out, boards=boards)
    one = yaml.safe_load((out / "kits" / "pi-01" / "agent.yaml").read_text())
    two = yaml.safe_load((out / "kits" / "pi-02" / "agent.yaml").read_text())
    assert one["round_interval_s"] == 2.0 and "round_interval_s" not in two
    assert one["sensor"] == two["sensor"] == SENSOR and one["model"] == MODEL
    again = _provision(tmp_path, out, boards=boards, broker={"hosts": ["127.0.0.1", "broker.local"],
                                                               "port": 18999})
    assert any("pi-01, pi-02" in note and "again" in note for note in again.notes), again.notes
    assert yaml.safe_load((out / "kits" / "pi-02" / "agent.yaml").read_text())["mqtt"]["port"] == 18999
