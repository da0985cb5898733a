"""Coordinator config: defaults, YAML errors, the example file, and the CLI's exit code 2."""
import subprocess
import sys
from pathlib import Path

import pytest

from streamfl.coordinator.config import CoordinatorConfig, load_config
from streamfl.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parent.parent / "configs" / "coordinator.example.yaml"


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_example_yaml_loads_and_documents_the_defaults():
    config = load_config(EXAMPLE)
    assert config == CoordinatorConfig()
    text = EXAMPLE.read_text()
    for key in ("fleet", "strategy", "alpha", "staleness_a", "staleness_b", "max_staleness",
                "deadline_s", "min_updates", "lr", "batch_size", "local_steps", "dropout",
                "history_size", "dedup_window", "eval_path", "eval_every_versions",
                "eval_batch_size", "persist_interval_s", "publish_min_interval_s", "seed", "float16",
                "enrollment_file", "max_abs_value", "norm_multiplier", "signing_key_file", "combine",
                "max_frame_bytes", "keepalive_s", "tls_ca", "password_file", "reconnect_max_s"):
        assert "%s:" % key in text, key


def test_defaults():
    c = CoordinatorConfig()
    assert (c.strategy, c.alpha, c.history_size, c.eval_every_versions) == ("fedasync", 0.6, 10, 5)
    assert c.persist_interval_s == 0.5 and c.hparams.lr == 0.01 and c.hparams.local_steps == 20


def test_the_learning_rate_sent_decays_per_version_where_asked():
    from streamfl.coordinator.config import HParams
    assert HParams(lr=0.01).as_dict(500)["lr"] == 0.01
    decayed = HParams(lr=0.01, lr_decay_per_version=0.9992)
    assert decayed.as_dict(0)["lr"] == 0.01
    assert decayed.as_dict(1000)["lr"] == pytest.approx(0.01 * 0.9992 ** 1000)
    assert "lr_decay_per_version" not in decayed.as_dict(3)      # the devices get the rate only


def test_each_global_model_carries_the_rate_decayed_to_its_version():
    from factories import UNBOUNDED_ADMISSION, make_hello, make_update
    from streamfl.config import build
    from streamfl.coordinator.core import CoordinatorCore
    from streamfl.models import ModelSpec
    spec = ModelSpec(name="mlp", in_channels=2, window_len=4, num_classes=2, hidden=4)
    core = CoordinatorCore(build(CoordinatorConfig, {
        "model": spec, "strategy": "fedasync", "admission": UNBOUNDED_ADMISSION,
        "hparams": {"lr": 0.1, "lr_decay_per_version": 0.5}}, "test"))
    core.on_message(make_hello("d0", spec), 0.0)
    assert core.global_model().hparams["lr"] == 0.1
    for t in (1.0, 2.0):
        core.on_message(make_update(spec, device_id="d0", base_version=core.version), t)
    assert core.version == 2 and core.global_model().hparams["lr"] == pytest.approx(0.025)


def test_nested_values_and_overrides(tmp_path):
    path = write(tmp_path, "fleet: lab\nstrategy: fedavg\nfedavg: {deadline_s: 5}\n"
                           "model: {name: cnn1d}\nmqtt: {host: a, port: 1884}\n")
    c = load_config(path, {"mqtt": {"host": "b", "port": None}, "fleet": None})
    assert c.fleet == "lab" and c.fedavg.deadline_s == 5.0 and c.model.name == "cnn1d"
    assert c.mqtt.host == "b" and c.mqtt.port == 1884


@pytest.mark.parametrize("text, needle", [
    ("bogus: 1\n", "bogus"),
    ("mqtt: {bogus: 1}\n", "bogus"),
    ("alpha: fast\n", "alpha"),
    ("history_size: 2.5\n", "history_size"),
    ("alpha: 1.5\n", "alpha"),
    ("strategy: fedprox\n", "strategy"),
    ("staleness: exponential\n", "staleness"),
    ("fleet: 'a/b'\n", "fleet"),
    ("hparams: {lr: 0}\n", "lr"),
    ("hparams: {lr_decay_per_version: 0}\n", "lr_decay_per_version"),
    ("hparams: {lr_decay_per_version: 1.5}\n", "lr_decay_per_version"),
    ("hparams: {lr_decay_per_version: .nan}\n", "lr_decay_per_version"),
    ("mqtt: {port: 70000}\n", "port"),
    ("max_staleness: -1\n", "max_staleness"),
    ("- a list\n", "mapping"),
])
def test_bad_config_is_a_config_error(tmp_path, text, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(write(tmp_path, text))


def test_password_file_and_environment(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    c = load_config(write(tmp_path, "mqtt: {password_file: %s, username: u}\n" % secret))
    settings = c.mqtt.settings("coordinator-x")
    assert settings.password == "s3cret" and "s3cret" not in repr(settings)
    assert CoordinatorConfig().mqtt.settings("c", {"STREAMFL_MQTT_PASSWORD": "env"}).password == "env"
    missing = load_config(write(tmp_path, "mqtt: {password_file: %s}\n" % (tmp_path / "none")))
    with pytest.raises(ConfigError, match="password file"):
        missing.mqtt.settings("c")


def run_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "streamfl.coordinator"] + list(args), cwd=str(cwd),
                          capture_output=True, text=True, timeout=120)


def test_cli_exits_2_on_config_errors(tmp_path):
    bad = write(tmp_path, "alpha: 7\n")
    proc = run_cli("--config", str(bad), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "alpha" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = run_cli("--config", str(tmp_path / "missing.yaml"), cwd=tmp_path)
    assert proc.returncode == 2 and "missing.yaml" in proc.stderr


def test_cli_flags_override_the_file(tmp_path):
    from streamfl.coordinator.cli import build_parser, load_from_args
    path = write(tmp_path, "fleet: lab\nmqtt: {host: a, username: u}\n")
    args = build_parser().parse_args(["--config", str(path), "--broker", "b", "--port", "1884",
                                      "--eval-data", "x.npz", "--tls-ca", "ca.pem"])
    c = load_from_args(args)
    assert (c.fleet, c.mqtt.host, c.mqtt.port, c.mqtt.username) == ("lab", "b", 1884, "u")
    assert c.eval_path == "x.npz" and str(c.mqtt.tls_ca) == "ca.pem"
    with pytest.raises(ConfigError, match="port"):
        load_from_args(build_parser().parse_args(["--port", "0"]))
