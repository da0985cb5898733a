"""The systemd units: the keys the issue requires, and ``systemd-analyze verify`` where available."""
import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_agent_unit_can_still_write_clock_files():
    svc = _service("streamfl-agent.service")
    # ProtectKernelTunables would remount /sys read-only and leave the board unable to restore clocks.
    assert svc.get("ProtectKernelTunables", "no") == "no"
    assert "/sys" not in svc.get("InaccessiblePaths", "")
    # After SIGKILL or a crash, the unit itself puts the clocks back.
    assert svc["ExecStopPost"].split()[1:3] == ["dvfs", "restore"]
    rules = (ROOT / "systemd" / "streamfl-sysfs.conf").read_text()
    assert "scaling_max_freq" in rules and "devfreq/*/max_freq" in rules


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
    for name in ("scaling_max_freq", "scaling_min_freq", "scaling_governor"):
        assert "cpufreq/" + name in by_subsystem["cpu"]
    for name in ("max_freq", "min_freq", "governor"):
        assert "/sys%%p/%s" % name in by_subsystem["devfreq"]
    # The same files the boot-time tmpfiles rule covers.
    tmpfiles = (ROOT / "systemd" / "streamfl-sysfs.conf").read_text()
    assert "devfreq/*/max_freq" in tmpfiles and "policy*/scaling_min_freq" in tmpfiles


@pytest.mark.skipif(shutil.which("udevadm") is None, reason="udevadm not installed")
def test_udev_rule_parses(tmp_path):
    rules = tmp_path / "70-streamfl-dvfs.rules"
    rules.write_text((ROOT / "systemd" / "70-streamfl-dvfs.rules").read_text())
    proc = subprocess.run(["udevadm", "verify", str(rules)], capture_output=True, text=True)
    if proc.returncode != 0 and "verify" in proc.stderr and "unknown" in proc.stderr.lower():
        pytest.skip("this udevadm has no 'verify' (systemd < 254)")
    assert proc.returncode == 0, proc.stdout + proc.stderr
