"""The systemd units: the keys the issue requires, and ``systemd-analyze verify`` where available."""
import configparser
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from streamfl.dvfs.fake.kernel import FakeKernel
from streamfl.dvfs.fake.tree import FAKE_TREES, build_tree, legacy_limits
from streamfl.dvfs.factory import sysfs_backend
from streamfl.dvfs.profiles import PROFILE_NAMES, load_profile
from test_dvfs_domains import TREE_IDS, profile_for

ROOT = Path(__file__).resolve().parents[1]
UNITS = ["streamfl-agent.service", "streamfl-coordinator.service"]


def _service(name):
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(ROOT / "systemd" / name)
    return parser["Service"]


@pytest.mark.parametrize("name", UNITS)
def test_unit_has_notify_watchdog_and_no_restart_on_config_error(name):
    svc = _service(name)
    assert svc["Type"] == "notify"
    assert int(svc["WatchdogSec"]) > 0
    assert svc["Restart"] == "on-failure"
    assert svc["RestartPreventExitStatus"].split() == ["2"]
    assert svc["NoNewPrivileges"] == "yes"
    assert svc["ProtectSystem"] == "strict"


def _service_values(name, key):
    """Every value of a key that may repeat (configparser keeps only the last one)."""
    values, section = [], None
    for line in (ROOT / "systemd" / name).read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and line.startswith(key + "="):
            values.extend(line.split("=", 1)[1].split())
    return values


def test_coordinator_unit_gives_numba_a_cache_folder_and_executable_memory():
    # The update loops are compiled by numba (coordinator/kernels): their cache must lie in a
    # folder the sandbox leaves writable, and a JIT needs memory it may write and then execute.
    svc = _service("streamfl-coordinator.service")
    env = dict(v.split("=", 1) for v in _service_values("streamfl-coordinator.service", "Environment"))
    assert env["NUMBA_CACHE_DIR"] == "/var/cache/" + svc["CacheDirectory"]
    assert svc.get("MemoryDenyWriteExecute", "no") == "no"


def _rw_dirs():
    """The agent unit's ReadWritePaths, relative to /sys (each must carry "-": absent is fine)."""
    paths = _service_values("streamfl-agent.service", "ReadWritePaths")
    assert paths and all(p.startswith("-/sys/") for p in paths), paths
    return [p[len("-/sys/"):].rstrip("/") for p in paths]


def _under(rel, dirs):
    return any(rel == d or rel.startswith(d + "/") for d in dirs)


def test_agent_unit_keeps_sys_read_only_but_the_clock_folders():
    svc = _service("streamfl-agent.service")
    assert svc["ProtectKernelTunables"] == "yes"
    assert "/sys" not in svc.get("InaccessiblePaths", "")
    dirs = _rw_dirs()
    assert "devices/system/cpu/cpufreq" in dirs
    # Nothing wider than a cpufreq folder or a GPU's devfreq folder.
    assert all(d == "devices/system/cpu/cpufreq" or d.endswith("/devfreq") for d in dirs), dirs
    # After SIGKILL or a crash, the unit itself puts the clocks back.
    assert svc["ExecStopPost"].split()[1:3] == ["dvfs", "restore"]
    rules = (ROOT / "systemd" / "streamfl-sysfs.conf").read_text()
    assert "scaling_max_freq" in rules and "devfreq/*.gpu/max_freq" in rules


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_every_profile_folder_is_writable_in_the_unit(name):
    """Real device folders are listed; the class/devfreq links resolve (checked on the trees)."""
    dirs = _rw_dirs()
    for spec in load_profile(name).domains:
        for path in spec.paths:
            if not path.startswith("class/"):
                assert _under(path, dirs), (name, spec.name, path)


class _Recording(FakeKernel):
    """The fake kernel, noting every file written."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.written = set()

    def write(self, rel_path, value):
        self.written.add(rel_path)
        super().write(rel_path, value)


@pytest.mark.parametrize("board,variant", FAKE_TREES, ids=TREE_IDS)
def test_every_file_the_agent_writes_lies_under_a_read_write_path(tmp_path, board, variant):
    """Set every level in both modes and restore, as the agent does; resolve links as the kernel
    and systemd do, so a class/devfreq path counts by the device folder it leads to."""
    build_tree(tmp_path, board, variant)
    real_root = os.path.realpath(str(tmp_path))
    rw = [os.path.relpath(os.path.realpath(str(tmp_path / d)), real_root)
          for d in _rw_dirs() if (tmp_path / d).exists()]
    profile = profile_for(board, variant, tmp_path)
    io = _Recording(tmp_path, legacy_limits=legacy_limits(board, variant))
    for mode in ("cap", "pin") if board != "generic-linux" else ("cap",):
        backend = sysfs_backend(profile, io, tmp_path, mode)
        saved = backend.snapshot()
        for dom in backend.domains:
            for i in range(len(dom.levels_khz)):
                dom.set_level(i)
            dom.set_level(0)
        assert backend.restore(saved) == []
    assert io.written
    for rel in sorted(io.written):
        real = os.path.relpath(os.path.realpath(str(tmp_path / rel)), real_root)
        assert _under(real, rw), (rel, real, rw)


def test_no_read_write_path_is_dead():
    """Each listed folder exists on at least one board's tree (a typo would pass verify)."""
    found = set()
    with tempfile.TemporaryDirectory() as tmp:
        for i, (board, variant) in enumerate(FAKE_TREES):
            root = Path(tmp) / str(i)
            build_tree(root, board, variant)
            found.update(d for d in _rw_dirs() if (root / d).is_dir())
    assert found == set(_rw_dirs())


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
@pytest.mark.parametrize("name", UNITS)
def test_systemd_analyze_verify(tmp_path, name):
    # ExecStart must name an existing executable: point it at this environment's console script.
    bindir = Path(sys.executable).parent
    text = (ROOT / "systemd" / name).read_text().replace("/usr/local/bin/", str(bindir) + "/")
    unit = tmp_path / name
    unit.write_text(text)
    proc = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    messages = proc.stdout + proc.stderr
    assert proc.returncode == 0, messages
    assert name not in messages, messages  # unknown keys are reported (exit 0) naming the unit file


def test_udev_rule_covers_devices_that_appear_after_boot():
    """tmpfiles runs once at boot; the udev rule re-applies group access on every ``add``."""
    rules = (ROOT / "systemd" / "70-streamfl-dvfs.rules").read_text()
    lines = [ln for ln in rules.splitlines() if ln.strip() and not ln.startswith("#")]
    by_subsystem = {}
    for line in lines:
        assert 'ACTION=="add"' in line and "streamfl" in line, line
        assert line.count('"') % 2 == 0, "unbalanced quotes: %s" % line
        subsystem = line.split('SUBSYSTEM=="', 1)[1].split('"', 1)[0]
        by_subsystem[subsystem] = line
    assert set(by_subsystem) == {"cpu", "devfreq", "iio"}
    for name in ("max_freq", "min_freq", "governor"):
        assert "/sys%%p/%s" % name in by_subsystem["devfreq"]
    # The same files the boot-time tmpfiles rule covers, on the same devices.
    tmpfiles = [ln.split()[1] for ln in (ROOT / "systemd" / "streamfl-sysfs.conf").read_text()
                .splitlines() if ln.startswith("z ")]
    prefix = "/sys/devices/system/cpu/cpufreq/policy*/"
    cpu_files = [p[len(prefix):] for p in tmpfiles if p.startswith(prefix)]
    assert "scaling_setspeed" in cpu_files
    for name in cpu_files:
        assert by_subsystem["cpu"].count("/sys%%p/cpufreq/%s" % name) == 2, name  # chgrp, chmod
    # Only GPU devfreq devices: the same name patterns in both rules.
    kernel = by_subsystem["devfreq"].split('KERNEL=="', 1)[1].split('"', 1)[0].split("|")
    devfreq = [p.split("/")[4] for p in tmpfiles if p.startswith("/sys/class/devfreq/")]
    assert set(devfreq) == set(kernel) and "*" not in kernel


@pytest.mark.skipif(shutil.which("udevadm") is None, reason="udevadm not installed")
def test_udev_rule_parses(tmp_path):
    rules = tmp_path / "70-streamfl-dvfs.rules"
    rules.write_text((ROOT / "systemd" / "70-streamfl-dvfs.rules").read_text())
    proc = subprocess.run(["udevadm", "verify", str(rules)], capture_output=True, text=True)
    if proc.returncode != 0 and "verify" in proc.stderr and "unknown" in proc.stderr.lower():
        pytest.skip("this udevadm has no 'verify' (systemd < 254)")
    assert proc.returncode == 0, proc.stdout + proc.stderr
