"""Agent configuration: YAML validation, flag overrides, secrets, the example file, CLI exit codes."""
import dataclasses
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from streamfl.agent.cli import build_parser, default_state_dir, overrides_from_args
from streamfl.agent.config import AgentConfig, MqttConfig, load_agent_config
from streamfl.dvfs.config import DvfsConfig
from streamfl.errors import ConfigError
from streamfl.models import ModelSpec
from streamfl.protocol.topics import sanitize_name
from streamfl.sensors.config import SensorConfig

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "configs" / "agent.example.yaml"


def write(tmp_path, text, name="agent.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_defaults():
    cfg = load_agent_config()
    assert cfg.fleet == "default" and cfg.board == "auto" and cfg.dvfs.board is None
    assert cfg.device_id == sanitize_name(socket.gethostname())
    assert cfg.buffer_capacity == 2048 and cfg.min_buffer == 64 and cfg.local_steps == 20
    assert cfg.outbox_max_bytes == 256 * 2 ** 20 and cfg.torch_threads == 1
    assert isinstance(cfg.model, ModelSpec) and isinstance(cfg.sensor, SensorConfig)
    assert cfg.mqtt.port == 1883
    assert isinstance(cfg.seed, int)
    assert load_agent_config(overrides={"device_id": "a"}).seed != \
        load_agent_config(overrides={"device_id": "b"}).seed


def test_example_yaml_loads_and_documents_every_key():
    cfg = load_agent_config(EXAMPLE)
    assert cfg.model == ModelSpec() and cfg.sensor == SensorConfig()
    data = yaml.safe_load(EXAMPLE.read_text())
    sections = {"model": ModelSpec, "sensor": SensorConfig, "mqtt": MqttConfig, "dvfs": DvfsConfig}
    for f in dataclasses.fields(AgentConfig):
        assert f.name in data, "example YAML does not document %r" % f.name
    for key, cls in sections.items():
        missing = {f.name for f in dataclasses.fields(cls)} - set(data[key])
        assert not missing, "example YAML does not document %s.%s" % (key, sorted(missing))


def test_unknown_key_names_key_and_file(tmp_path):
    path = write(tmp_path, "fleet: lab\nbufer_capacity: 10\n")
    with pytest.raises(ConfigError) as err:
        load_agent_config(path)
    assert "bufer_capacity" in str(err.value) and str(path) in str(err.value)
    path = write(tmp_path, "mqtt:\n  hots: broker\n", "nested.yaml")
    with pytest.raises(ConfigError) as err:
        load_agent_config(path)
    assert "hots" in str(err.value) and "nested.yaml" in str(err.value)


def test_wrong_type_names_key_and_file(tmp_path):
    path = write(tmp_path, "round_interval_s: soon\n")
    with pytest.raises(ConfigError) as err:
        load_agent_config(path)
    assert "round_interval_s" in str(err.value) and str(path) in str(err.value)
    with pytest.raises(ConfigError, match="port"):
        load_agent_config(write(tmp_path, "mqtt: {port: 'x'}\n", "b.yaml"))


@pytest.mark.parametrize("text, word", [
    ("min_buffer: 5000\n", "min_buffer"),
    ("dropout: 1.5\n", "dropout"),
    ("device_id: 'has/slash'\n", "device_id"),
    ("fleet: '+'\n", "fleet"),
    ("model: {window_len: 100}\n", "window_len"),
    ("model: {name: transformer}\n", "transformer"),
    ("mqtt: {port: 70000}\n", "port"),
    ("mqtt: {tls_cert: /x.crt}\n", "tls_key"),
])
def test_bad_values_are_config_errors(tmp_path, text, word):
    with pytest.raises(ConfigError, match=word):
        load_agent_config(write(tmp_path, text))


def test_flags_override_file_values(tmp_path):
    path = write(tmp_path, "fleet: lab\nmqtt: {host: a.example, port: 1884}\nsensor: {kind: synthetic}\n")
    args = build_parser().parse_args(["--config", str(path), "--broker", "b.example",
                                      "--device-id", "pi-7", "--sensor", "replay",
                                      "--sensor-path", "/data/x.npz"])
    cfg = load_agent_config(args.config, overrides_from_args(args))
    assert cfg.fleet == "lab"                       # from the file
    assert cfg.mqtt.host == "b.example" and cfg.mqtt.port == 1884  # flag wins, file kept
    assert cfg.device_id == "pi-7"
    assert cfg.sensor.kind == "replay" and cfg.sensor.path == "/data/x.npz"


def test_password_from_file_or_environment(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    cfg = load_agent_config(overrides={"device_id": "d", "mqtt": {"password_file": str(secret),
                                                                  "username": "u"}})
    settings = cfg.mqtt_settings({})
    assert settings.password == "s3cret" and settings.client_id == "d"
    assert "s3cret" not in repr(settings)
    env_cfg = load_agent_config(overrides={"device_id": "d"})
    assert env_cfg.mqtt_settings({"STREAMFL_MQTT_PASSWORD": "pw2"}).password == "pw2"
    assert env_cfg.mqtt_settings({}).password is None
    missing = load_agent_config(overrides={"mqtt": {"password_file": str(tmp_path / "nope")}})
    with pytest.raises(ConfigError, match="password file"):
        missing.mqtt_settings({})


def test_default_state_dir(tmp_path):
    system = tmp_path / "var" / "lib" / "streamfl-agent"
    system.parent.mkdir(parents=True)
    assert default_state_dir(system, home=tmp_path / "home") == system
    if os.geteuid() != 0:
        system.parent.chmod(0o500)
        try:
            assert default_state_dir(system, home=tmp_path / "home") == \
                tmp_path / "home" / ".local" / "state" / "streamfl-agent"
        finally:
            system.parent.chmod(0o700)


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "streamfl.agent"] + list(args),
                          capture_output=True, text=True, timeout=120, env=env, cwd=str(REPO))


def test_cli_exits_2_with_one_line_message_on_bad_yaml(tmp_path):
    path = write(tmp_path, "fleet: lab\nlocal_steps: many\n")
    proc = run_cli("--config", str(path))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("streamfl-agent: error:")
    assert "local_steps" in lines[0] and str(path) in lines[0]
    bad_syntax = write(tmp_path, "fleet: [unclosed\n", "syntax.yaml")
    proc = run_cli("--config", str(bad_syntax))
    assert proc.returncode == 2 and "syntax.yaml" in proc.stderr


def test_cli_check_config_prints_effective_config(tmp_path):
    proc = run_cli("--config", str(EXAMPLE), "--device-id", "bench-1", "--port", "1999",
                   "--check-config")
    assert proc.returncode == 0, proc.stderr
    data = yaml.safe_load(proc.stdout)
    assert data["device_id"] == "bench-1" and data["mqtt"]["port"] == 1999


def test_dvfs_section_is_checked_at_load_time(tmp_path):
    cfg = load_agent_config(write(tmp_path, "dvfs:\n  backend: simulated\n  policy: clp-aware\n"))
    assert cfg.dvfs.backend == "simulated" and cfg.dvfs.policy == "clp-aware"
    for text, word in [("dvfs:\n  backend: gpio\n", "backend"), ("dvfs:\n  polciy: none\n", "polciy"),
                       ("dvfs:\n  policy: turbo\n", "turbo"),
                       ("dvfs:\n  policy: clp-aware\n  policy_options: {treshold: 0.1}\n", "treshold"),
                       ("dvfs:\n  energy_rate_hz: 0\n", "energy_rate_hz")]:
        with pytest.raises(ConfigError) as err:
            load_agent_config(write(tmp_path, text, "bad.yaml"))
        assert word in str(err.value) and "bad.yaml" in str(err.value), str(err.value)
