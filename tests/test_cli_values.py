"""Command-line values and config files read numbers the YAML 1.2 way (``1e9``, ``1e-3``), and a
configuration error that a flag causes names the flag, not the file or "defaults"."""
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from streamfl.agent import cli as agent_cli
from streamfl.agent.config import load_agent_config
from streamfl.config import parse_value, parse_yaml, read_yaml
from streamfl.coordinator import cli as coordinator_cli
from streamfl.errors import ConfigError
from streamfl.sim.scenario import parse_sets

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text, expected", [
    ("1e9", 1e9), ("1.0e9", 1e9), ("1e-3", 1e-3), ("-2E+5", -2e5), (".5e3", 500.0),
    ("1.0e+9", 1e9), ("1.5", 1.5), ("3", 3), ("true", True), ("null", None),
    ("abc", "abc"), ("e5", "e5"), ("1e", "1e"), ("[1e3, 2]", [1000.0, 2])])
def test_parse_value_reads_exponents_as_numbers(text, expected):
    value = parse_value(text, "--set x")
    assert value == expected and type(value) is type(expected)


def test_set_values_and_config_files_read_exponents_as_numbers(tmp_path):
    assert parse_sets(["lr=1.0e9", "stream.params.beta=1e-3"]) == [
        ("lr", 1e9), ("stream.params.beta", 1e-3)]
    assert parse_yaml("lr: 1e-3\nx: 5E+6\n", "test") == {"lr": 1e-3, "x": 5e6}
    path = tmp_path / "agent.yaml"
    path.write_text("lr: 1e-3\n")
    assert read_yaml(path) == {"lr": 1e-3}
    assert load_agent_config(path).lr == 1e-3


def test_a_set_value_that_is_not_yaml_names_the_key():
    with pytest.raises(ConfigError, match="--set lr: the value is not YAML"):
        parse_sets(["lr=[1,"])


def agent_load(argv):
    return agent_cli.load_from_args(agent_cli.build_parser().parse_args(argv))


def coordinator_load(argv):
    return coordinator_cli.load_from_args(coordinator_cli.build_parser().parse_args(argv))


@pytest.mark.parametrize("load", [agent_load, coordinator_load])
@pytest.mark.parametrize("argv, flag", [
    (["--port", "0"], "--port 0:"),
    (["--broker", "example.org", "--port", "70000"], "--port 70000:"),
    (["--fleet", "a b"], "--fleet 'a b':"),
    (["--port", "0", "--fleet", "a b"], ("--port 0:", "--fleet 'a b':"))])   # either
def test_an_error_a_flag_causes_names_the_flag(tmp_path, load, argv, flag):
    for extra in ([], ["--config", str(_write(tmp_path, "fleet: lab\n"))]):
        with pytest.raises(ConfigError) as err:
            load(argv + extra)
        message = str(err.value)
        assert message.startswith(flag), message
        assert "defaults" not in message and "agent.yaml" not in message, message


@pytest.mark.parametrize("load", [agent_load, coordinator_load])
def test_an_error_in_the_file_still_names_the_file(tmp_path, load):
    path = _write(tmp_path, "fleet: lab\nmqtt: {port: 0}\n")
    with pytest.raises(ConfigError) as err:
        load(["--config", str(path), "--broker", "example.org"])
    assert str(err.value).startswith(str(path)) and "--broker" not in str(err.value)
    assert load(["--config", str(path), "--port", "1999"]).mqtt.port == 1999   # a flag may fix it


def test_flags_still_override_the_file(tmp_path):
    path = _write(tmp_path, "fleet: lab\nmqtt: {host: a, port: 1000}\n")
    cfg = agent_load(["--config", str(path), "--port", "1999", "--state-dir", str(tmp_path)])
    assert (cfg.fleet, cfg.mqtt.host, cfg.mqtt.port, cfg.state_dir) == ("lab", "a", 1999, tmp_path)


def _write(tmp_path, text):
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    return path


def run(module, *args, cwd):
    return subprocess.run([sys.executable, "-m", module] + list(args), capture_output=True,
                          text=True, timeout=120, cwd=str(cwd))


def test_coordinator_version_and_check_config(tmp_path):
    import streamfl
    proc = run("streamfl.coordinator.cli", "--version", cwd=tmp_path)
    assert proc.returncode == 0 and streamfl.__version__ in proc.stdout
    proc = run("streamfl.coordinator.cli", "--config", str(REPO / "configs" / "coordinator.example.yaml"),
               "--fleet", "lab", "--port", "1999", "--check-config", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = yaml.safe_load(proc.stdout)
    assert data["fleet"] == "lab" and data["mqtt"]["port"] == 1999
    assert not list(tmp_path.iterdir())          # no state or run folder made
    proc = run("streamfl.coordinator.cli", "--port", "0", "--check-config", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--port 0" in lines[0], proc.stderr


def test_agent_flag_error_exits_2_naming_the_flag(tmp_path):
    proc = run("streamfl.agent", "--port", "0", "--check-config", cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("streamfl-agent: error: --port 0:"), proc.stderr
