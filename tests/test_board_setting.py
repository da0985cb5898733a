"""One board setting: the agent config's top-level ``board`` names the board profile (or ``auto``),
the deprecated ``dvfs.board`` and the old labels still load with a warning, two keys naming
different boards is an error, and the Hello a real agent sends carries the resolved profile name,
which the coordinator records."""
import logging
import subprocess
import sys
from dataclasses import asdict

import pytest
import yaml

from streamfl.agent.config import AgentConfig, load_agent_config
from streamfl.agent.core import AgentCore
from streamfl.agent.dvfs import AgentDvfs
from streamfl.agent.preflight import check_startup
from streamfl.config import build
from streamfl.dvfs import config as dvfs_config
from streamfl.dvfs.config import AUTO_BOARD, LEGACY_BOARD_LABELS
from streamfl.dvfs.profiles import PROFILE_NAMES
from streamfl.errors import ConfigError
from streamfl.models import ModelSpec

SPEC = ModelSpec(name="mlp", in_channels=3, window_len=8, num_classes=3, hidden=4)
TINY = {"device_id": "b1", "model": SPEC,
        "sensor": {"channels": 3, "window_len": 8, "num_classes": 3}}


@pytest.fixture(autouse=True)
def fresh_warnings():
    """Each test sees the first deprecation warning (they are said once per process)."""
    dvfs_config._warned.clear()
    yield
    dvfs_config._warned.clear()


def cfg(**values):
    return build(AgentConfig, dict(TINY, **values), "test")


def warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "streamfl.dvfs.config" and r.levelno == logging.WARNING]


def write(tmp_path, values):
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def fake_device_tree(tmp_path, model):
    """A /proc whose device-tree model is ``model`` (NUL-terminated, as the kernel writes it)."""
    proc = tmp_path / "proc"
    (proc / "device-tree").mkdir(parents=True)
    (proc / "device-tree" / "model").write_bytes(model.encode() + b"\x00")
    return proc


def test_the_default_is_auto_and_the_dvfs_section_gets_the_profile(caplog):
    assert cfg().board == AUTO_BOARD and cfg().dvfs.board is None
    named = cfg(board="raspberry-pi-4")
    assert named.board == "raspberry-pi-4" and named.dvfs.board == "raspberry-pi-4"
    assert warnings(caplog) == []


def test_the_old_dvfs_board_still_loads_and_warns_once(tmp_path, caplog):
    path = write(tmp_path, dict(TINY, model=asdict(SPEC), dvfs={"board": "jetson-orin-nano"}))
    for _ in range(3):
        loaded = load_agent_config(path)
        assert loaded.board == "jetson-orin-nano" and loaded.dvfs.board == "jetson-orin-nano"
    said = warnings(caplog)
    assert len(said) == 1 and "dvfs.board is deprecated" in said[0], said
    assert "board: jetson-orin-nano" in said[0]


@pytest.mark.parametrize("label, profile", sorted(LEGACY_BOARD_LABELS.items()))
def test_old_labels_mean_their_profile_with_a_warning(label, profile, caplog):
    loaded = cfg(board=label)
    assert loaded.board == profile
    assert profile == AUTO_BOARD or profile in PROFILE_NAMES
    said = warnings(caplog)
    assert len(said) == 1 and repr(label) in said[0] and profile in said[0], said


def test_two_keys_naming_different_boards_are_a_config_error_naming_both(tmp_path):
    path = write(tmp_path, dict(TINY, model=asdict(SPEC), board="raspberry-pi-4",
                                dvfs={"board": "jetson-nano"}))
    with pytest.raises(ConfigError, match="board 'raspberry-pi-4' and dvfs.board 'jetson-nano'"):
        load_agent_config(path)


def test_two_keys_naming_the_same_board_load_quietly(caplog):
    both = cfg(board="jetson-nano", dvfs={"board": "jetson-nano"})
    assert both.board == "jetson-nano" and warnings(caplog) == []


def test_a_policy_needing_the_power_model_takes_it_from_the_top_level_board():
    options = {"clp_level": "efficient"}
    named = cfg(board="jetson-orin-nano", dvfs={"policy": "clp-aware", "policy_options": options})
    assert set(named.dvfs.policy_kwargs()["power_w"]) == {"cpu0", "cpu4", "gpu"}
    with pytest.raises(ConfigError, match="not auto"):
        cfg(dvfs={"policy": "clp-aware", "policy_options": options})


def test_an_unknown_board_stops_the_start_naming_the_key_even_without_dvfs():
    with pytest.raises(ConfigError, match="^board: unknown board profile 'jetson-tx9'"):
        check_startup(cfg(board="jetson-tx9", dvfs={"backend": "none"}), available_bytes=lambda: None)
    check_startup(cfg(board="raspberry-pi-5", dvfs={"backend": "none"}), available_bytes=lambda: None)


def test_auto_is_resolved_from_the_device_tree_for_hello(tmp_path):
    proc = fake_device_tree(tmp_path, "NVIDIA Jetson Nano Developer Kit")
    loaded = cfg(dvfs={"backend": "simulated", "proc_root": str(proc)})
    dvfs = AgentDvfs.from_config(loaded.dvfs, tmp_path / "state")
    assert dvfs.board == "jetson-nano"
    # With DVFS off the name is still the board's, not "none" or "auto".
    off = cfg(dvfs={"backend": "none", "proc_root": str(proc)})
    assert AgentDvfs.from_config(off.dvfs, tmp_path / "state").board == "jetson-nano"
    # No device tree (an x86 host): generic-linux.
    bare = cfg(dvfs={"backend": "none", "proc_root": str(tmp_path / "no-proc")})
    assert AgentDvfs.from_config(bare.dvfs, tmp_path / "state").board == "generic-linux"


def test_core_hello_names_the_configured_profile():
    core = AgentCore(cfg(board="raspberry-pi-4"))
    assert core.hello().board == "raspberry-pi-4"


def test_check_config_prints_one_board_key_that_reloads_quietly(tmp_path, caplog):
    path = write(tmp_path, dict(TINY, model=asdict(SPEC), dvfs={"board": "raspberry-pi-4",
                                                              "backend": "none"}))
    out = subprocess.run([sys.executable, "-m", "streamfl.agent", "--config", str(path),
                          "--check-config"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "dvfs.board is deprecated" in out.stderr
    printed = yaml.safe_load(out.stdout)
    assert printed["board"] == "raspberry-pi-4" and "board" not in printed["dvfs"]
    again = write(tmp_path, printed)
    dvfs_config._warned.clear()
    caplog.clear()
    reloaded = load_agent_config(again)
    assert reloaded.board == "raspberry-pi-4" and reloaded.dvfs.board == "raspberry-pi-4"
    assert warnings(caplog) == []


def test_the_dvfs_status_board_flag_is_the_top_level_key(tmp_path):
    out = subprocess.run([sys.executable, "-m", "streamfl.agent", "dvfs", "status", "--board",
                          "raspberry-pi-4", "--sysfs-root", str(tmp_path / "sys"), "--state-dir",
                          str(tmp_path / "state")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "board: raspberry-pi-4" in out.stdout and "deprecated" not in out.stderr


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_the_coordinator_hears_the_resolved_board_not_a_label(fleet, tmp_path):
    """A real agent with ``board: auto`` on a (fake) Jetson Nano device tree, and one still using
    the old ``dvfs.board``: the coordinator's device events name their profiles."""
    proc = fake_device_tree(tmp_path, "NVIDIA Jetson Nano Developer Kit")
    run = fleet()
    run.start_coordinator()
    run.start_agent(0, board="auto", dvfs={"proc_root": str(proc)})
    legacy = run.agent_config(1)
    legacy["dvfs"]["board"] = legacy.pop("board")
    path = run.root / "agent-legacy.yaml"
    path.write_text(yaml.safe_dump(legacy))
    run._spawn("agent-legacy", [sys.executable, "-m", "streamfl.agent", "--config", str(path),
                                "--broker", run.host, "--port", str(run.port), "--fleet", run.fleet,
                                "--state-dir", str(run.root / "legacy-state")])

    def boards():
        seen = {m["device"]: m.get("board") for m in run.metrics()
                if m.get("event") == "device" and m.get("online")}
        return seen if len(seen) == 2 else None

    seen = run.wait_for(boards, 120, "both agents' Hello at the coordinator")
    assert seen == {run.device_id(0): "jetson-nano", run.device_id(1): legacy["dvfs"]["board"]}, seen
    assert legacy["dvfs"]["board"] in PROFILE_NAMES
