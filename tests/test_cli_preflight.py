"""``streamfl-agent --check-config`` and the start refuse what would crash the agent later (a buffer
larger than memory, a model that cannot be allocated, missing files) with one line naming the key
and exit code 2, so systemd does not restart into a traceback."""
import subprocess
import sys

import pytest

from streamfl.agent.config import load_agent_config
from streamfl.agent.preflight import (MAX_THREADS_PER_CPU, available_memory_bytes, buffer_bytes,
                                      check_startup, model_parameters)
from streamfl.errors import ConfigError
from streamfl.models import ModelSpec, build_model

GIB = 2 ** 30


def config(tmp_path, text):
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    return load_agent_config(path)


def check(cfg, available=64 * GIB, cpus=4):
    check_startup(cfg, available_bytes=lambda: available, cpu_count=cpus)


def run_agent(*args, cwd):
    return subprocess.run([sys.executable, "-m", "streamfl.agent"] + list(args),
                          capture_output=True, text=True, timeout=120, cwd=str(cwd))


@pytest.mark.parametrize("text, key", [
    ("buffer_capacity: 100000000\n", "buffer_capacity"),
    ("model: {hidden: 1000000}\n", "model.hidden"),
    ("mqtt: {tls_ca: /nonexistent/ca.pem}\n", "mqtt.tls_ca"),
    ("board: no-such-board\n", "board"),
])
def test_check_config_and_start_exit_2_naming_the_key(tmp_path, text, key):
    path = tmp_path / "agent.yaml"
    path.write_text(text + "state_dir: %s\n" % (tmp_path / "state"))
    for extra in (["--check-config"], ["--broker", "127.0.0.1", "--port", "1"]):
        proc = run_agent("--config", str(path), *extra, cwd=tmp_path)
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("streamfl-agent: error: " + key), proc.stderr
        assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "state").exists()       # refused before anything was built


def test_the_defaults_pass():
    check(load_agent_config(), available=None)
    check(load_agent_config(), available=GIB)


def test_buffer_bounded_by_its_limit_and_by_free_memory(tmp_path):
    cfg = config(tmp_path, "buffer_capacity: 10000\nmax_buffer_bytes: 10000000\n")
    assert buffer_bytes(cfg) == 10000 * (50 * 6 * 4 + 8)
    with pytest.raises(ConfigError, match="^buffer_capacity 10000 .*max_buffer_bytes"):
        check(cfg)
    cfg = config(tmp_path, "buffer_capacity: 10000\n")
    check(cfg, available=GIB)
    with pytest.raises(ConfigError, match="^buffer_capacity 10000 .*memory available"):
        check(cfg, available=buffer_bytes(cfg) - 1)


def test_model_counted_without_allocating_it():
    spec = ModelSpec(name="lstm", hidden=32)
    assert model_parameters(spec) == sum(p.numel() for p in build_model(spec).parameters())
    assert model_parameters(ModelSpec(hidden=10 ** 8)) > 10 ** 16


def test_torch_threads_bounded_by_the_cpus(tmp_path):
    cfg = config(tmp_path, "torch_threads: %d\n" % (2 * MAX_THREADS_PER_CPU + 1))
    check(cfg, cpus=3)
    with pytest.raises(ConfigError, match="^torch_threads"):
        check(cfg, cpus=2)


def test_replay_dataset_must_exist(tmp_path):
    cfg = config(tmp_path, "sensor: {kind: replay, path: %s}\n" % (tmp_path / "none.npz"))
    with pytest.raises(ConfigError, match="^sensor.path"):
        check(cfg)


def test_available_memory_from_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  4000 kB\nMemFree:  100 kB\nMemAvailable:  2048 kB\n")
    assert available_memory_bytes(meminfo) == 2048 * 1024
    meminfo.write_text("MemTotal:  4000 kB\n")
    assert available_memory_bytes(meminfo) is None
    assert available_memory_bytes(tmp_path / "missing") is None
