"""A state file that cannot be read or is corrupt stops either program with exit code 2 naming the
file (systemd's ``RestartPreventExitStatus=2`` then does not restart into it); a damaged file that
holds nothing the program cannot get back (the coordinator's ``plugins.safetensors``, the agent's
checkpoint) is moved aside and the start goes on, logged. Through the real CLI entry points."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from polling import wait_until
from streamfl.agent import cli as agent_cli
from streamfl.coordinator import cli as coordinator_cli
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.core import CoordinatorCore
from streamfl.coordinator.persistence import MODEL_FILE, PLUGINS_FILE, STATE_FILE, Persister, StateStore
from streamfl.models import save_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def _saved_state(state_dir: Path) -> Path:
    """A state folder as a coordinator with the default config leaves it, plug-in arrays included."""
    core = CoordinatorCore(CoordinatorConfig(), run_id="r1")
    Persister(StateStore(state_dir)).flush(core)
    save_checkpoint(state_dir / PLUGINS_FILE, {"fedcurv/F/x": np.ones(3, np.float32)},
                    {"version": 0, "arch_id": core.arch_id})
    return state_dir


def _coordinator(tmp_path: Path, state_dir: Path, capsys) -> (int, str):
    code = coordinator_cli.main(["--state-dir", str(state_dir), "--run-dir", str(tmp_path / "run"),
                                 "--broker", "127.0.0.1", "--port", "1"])
    return code, capsys.readouterr().err


def _break_state_json(d: Path) -> Path:
    (d / STATE_FILE).write_text("{not json")
    return d / STATE_FILE


def _truncate_model(d: Path) -> Path:
    data = (d / MODEL_FILE).read_bytes()
    (d / MODEL_FILE).write_bytes(data[:len(data) // 2])
    return d / MODEL_FILE


def _unreadable_state_json(d: Path) -> Path:
    (d / STATE_FILE).unlink()
    (d / STATE_FILE).mkdir()  # reading it fails with an OSError, as a file without permission does (also as root)
    return d / STATE_FILE


def _state_json_of_wrong_shape(d: Path) -> Path:
    state = json.loads((d / STATE_FILE).read_text())
    state["known_devices"] = {"d1": 5}
    (d / STATE_FILE).write_text(json.dumps(state))
    return d / STATE_FILE


def _unreadable_plugins_file(d: Path) -> Path:
    (d / PLUGINS_FILE).unlink()
    (d / PLUGINS_FILE).mkdir()
    return d / PLUGINS_FILE


def _model_of_nan(d: Path) -> Path:
    from streamfl.models import load_checkpoint
    tensors, meta = load_checkpoint(d / MODEL_FILE)
    name = sorted(tensors)[0]
    tensors[name] = np.full_like(tensors[name], np.nan)
    save_checkpoint(d / MODEL_FILE, tensors, meta)
    return d / MODEL_FILE


@pytest.mark.parametrize("damage", [_break_state_json, _truncate_model, _unreadable_state_json,
                                    _state_json_of_wrong_shape, _unreadable_plugins_file, _model_of_nan],
                         ids=lambda f: f.__name__.strip("_"))
def test_the_coordinator_exits_2_naming_a_damaged_or_unreadable_state_file(damage, tmp_path, capsys):
    path = damage(_saved_state(tmp_path / "state"))
    code, err = _coordinator(tmp_path, tmp_path / "state", capsys)
    assert code == 2, err
    assert str(path) in err, err
    assert "Traceback" not in err


def test_the_coordinator_process_exits_2_on_a_garbage_state_json(tmp_path):
    path = _break_state_json(_saved_state(tmp_path / "state"))
    proc = subprocess.run([sys.executable, "-m", "streamfl.coordinator", "--state-dir", str(tmp_path / "state"),
                           "--run-dir", str(tmp_path / "run"), "--broker", "127.0.0.1", "--port", "1"],
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert str(path) in proc.stderr and "Traceback" not in proc.stdout + proc.stderr


def test_the_shipped_units_do_not_restart_on_exit_code_2():
    for unit in ("streamfl-coordinator.service", "streamfl-agent.service"):
        text = (ROOT / "systemd" / unit).read_text()
        assert "Restart=on-failure" in text and "RestartPreventExitStatus=2" in text, unit


def test_a_damaged_plugins_file_is_moved_aside_and_the_coordinator_runs(fleet):
    run = fleet()
    proc = run.start_coordinator()
    wait_until(lambda: "coordinator for fleet" in proc.log_text(), 30, "the coordinator's first start")
    assert proc.terminate() == 0
    damaged = run.coordinator_state / PLUGINS_FILE
    damaged.write_bytes(b"not a checkpoint")
    proc = run.start_coordinator()
    wait_until(lambda: "coordinator for fleet" in proc.log_text(), 30, "the coordinator's restart")
    assert "continuing from" in proc.log_text()
    assert proc.alive, proc.tail()
    aside = list(run.coordinator_state.glob(PLUGINS_FILE + ".corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == b"not a checkpoint"
    assert "moved aside to %s" % aside[0] in proc.log_text()
    assert proc.terminate() == 0


# ---- the agent ------------------------------------------------------------------------------------


def _agent(tmp_path: Path, state_dir: Path, capsys) -> (int, str):
    config = tmp_path / "agent.yaml"
    config.write_text("device_id: d1\ndvfs: {backend: none}\n")
    code = agent_cli.main(["--config", str(config), "--state-dir", str(state_dir),
                           "--broker", "127.0.0.1", "--port", "1"], environ={})
    return code, capsys.readouterr().err


def test_the_agent_exits_2_naming_a_state_folder_it_cannot_write(tmp_path, capsys):
    state_dir = tmp_path / "state"
    state_dir.write_text("a file where the folder should be")
    code, err = _agent(tmp_path, state_dir, capsys)
    assert code == 2 and str(state_dir) in err and "not writable" in err, err


def test_the_agent_exits_2_naming_a_checkpoint_it_cannot_read(tmp_path, capsys):
    checkpoint = tmp_path / "state" / "checkpoint.safetensors"
    checkpoint.mkdir(parents=True)
    code, err = _agent(tmp_path, tmp_path / "state", capsys)
    assert code == 2 and str(checkpoint) in err, err


def test_a_damaged_checkpoint_is_moved_aside_and_the_agent_runs(fleet):
    run = fleet()
    state = run.agent_state(0)
    state.mkdir(parents=True)
    (state / "checkpoint.safetensors").write_bytes(b"\x00garbage")
    proc = run.start_agent(0)
    wait_until(lambda: "started (fleet" in proc.log_text(), 30, "the agent's start")
    aside = list(state.glob("checkpoint.safetensors.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == b"\x00garbage"
    assert "moved aside to %s" % aside[0] in proc.log_text()
    assert not (state / "checkpoint.safetensors").exists()
    assert proc.terminate() == 0
