"""Power meters against fake sysfs trees and command outputs in the formats the drivers
and firmware print: happy paths, units, missing, unreadable and garbage."""
import errno
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from streamfl.dvfs.base import DvfsError, FrequencyDomain
from streamfl.dvfs.fake.pmic import PMIC_CAPTURE
from streamfl.dvfs.fake.tree import build_tree
from streamfl.dvfs.power.base import PowerError
from streamfl.dvfs.power.factory import create_meter, detect_meter
from streamfl.dvfs.power.ina3221_hwmon import Ina3221HwmonMeter
from streamfl.dvfs.power.ina3221_iio import Ina3221IioMeter
from streamfl.dvfs.power.jtop import INSTALL_HINT, JtopMeter, parse_power
from streamfl.dvfs.power.modeled import ModeledMeter
from streamfl.dvfs.power.null import NullMeter
from streamfl.dvfs.power.rapl import RaplMeter
from streamfl.dvfs.power.rpi5_pmic import Rpi5PmicMeter, parse_pmic_adc
from streamfl.errors import ConfigError


def put(root, rel, content="", mode=None):
    """Write ``content`` plus the newline sysfs prints at ``root/rel``."""
    path = Path(root) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content + "\n")
    if mode is not None:
        os.chmod(str(path), mode)
    return path


def link(root, rel, target):
    path = Path(root) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, str(path))


def make_unreadable_dir(path):
    """Replace a file by a directory: reading it fails with EISDIR, even as root."""
    path = Path(path)
    path.unlink()
    path.mkdir()


def run_unprivileged(fn):
    """Call ``fn`` in a forked child that is not root (uid 65534 when the tests run as root, since
    root reads 0400 files anyway); returns ``{"ok": bool, "errno": int, "message": str}``."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        out = {"ok": False, "errno": -1, "message": "child failed"}
        try:
            os.close(read_fd)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            try:
                fn()
                out = {"ok": True, "errno": 0, "message": ""}
            except PowerError as exc:
                out = {"ok": False, "errno": exc.errno, "message": str(exc)}
            except BaseException as exc:  # report anything else to the parent
                out = {"ok": False, "errno": -2, "message": repr(exc)}
            os.write(write_fd, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    chunks = []
    while True:
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_fd)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks).decode())


@pytest.fixture
def shared_root():
    """A tree root an unprivileged child can traverse (pytest's tmp_path is 0700 under root)."""
    root = tempfile.mkdtemp(prefix="streamfl-power-")
    os.chmod(root, 0o755)
    try:
        yield Path(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def root_only_mode():
    """0400 as on a real board (owner root); 0000 when the tests themselves are not root."""
    return 0o400 if os.geteuid() == 0 else 0


# -- INA3221 through IIO (JetPack 4) ----------------------------------

NANO_INA = "devices/50000000.host1x/546c0000.i2c/i2c-6/6-0040"


def nano_iio_tree(root, with_power=True):
    dev = NANO_INA + "/iio:device0"
    put(root, NANO_INA + "/name", "ina3221x")
    put(root, dev + "/name", "ina3221x")
    rails = [("POM_5V_IN", "5000", "509", "2540"), ("POM_5V_GPU", "5000", "0", "0"),
             ("POM_5V_CPU", "5000", "110", "549")]
    for k, (rail, mv, ma, mw) in enumerate(rails):
        put(root, "%s/rail_name_%d" % (dev, k), rail)
        put(root, "%s/in_voltage%d_input" % (dev, k), mv)
        put(root, "%s/in_current%d_input" % (dev, k), ma)
        if with_power:
            put(root, "%s/in_power%d_input" % (dev, k), mw)
        put(root, "%s/in_current%d_trigger_input" % (dev, k), ma)
        put(root, "%s/warn_current_limit_%d" % (dev, k), "32760 ma")
        put(root, "%s/crit_power_limit_%d" % (dev, k), "65520 mw")
        put(root, "%s/ui_input_%d" % (dev, k), "%s %s" % (mv, ma))
    link(root, "bus/iio/devices/iio:device0", "../../../" + dev)
    link(root, "bus/i2c/drivers/ina3221x/6-0040", "../../../../" + NANO_INA)
    return Path(root) / dev


def test_iio_nano_reads_in_power_in_mw(tmp_path):
    nano_iio_tree(tmp_path)
    meter = Ina3221IioMeter(sysfs_root=tmp_path)
    assert meter.kind == "ina3221-iio"
    assert meter.rails == ("POM_5V_IN", "POM_5V_GPU", "POM_5V_CPU")
    assert meter.read_w() == pytest.approx({"POM_5V_IN": 2.540, "POM_5V_GPU": 0.0,
                                            "POM_5V_CPU": 0.549})
    assert meter.power_source("POM_5V_IN") == "in_power"
    # POM_5V_IN is the module input; GPU and CPU are inside it, so they are not added.
    assert meter.total_w() == pytest.approx(2.540)


def test_iio_falls_back_to_voltage_times_current(tmp_path):
    nano_iio_tree(tmp_path, with_power=False)
    meter = Ina3221IioMeter(sysfs_root=tmp_path)
    assert meter.power_source("POM_5V_IN") == "in_voltage*in_current"
    assert meter.read_w()["POM_5V_IN"] == pytest.approx(5000 * 509 / 1e6)
    assert meter.read_w()["POM_5V_CPU"] == pytest.approx(0.55)


def test_iio_found_through_the_i2c_driver_directory_alone(tmp_path):
    nano_iio_tree(tmp_path)
    os.unlink(str(tmp_path / "bus/iio/devices/iio:device0"))
    meter = Ina3221IioMeter(sysfs_root=tmp_path)
    assert meter.rails == ("POM_5V_IN", "POM_5V_GPU", "POM_5V_CPU")


def test_iio_xavier_nx_total_is_vdd_in(tmp_path):
    dev = "devices/c250000.i2c/i2c-7/7-0040/iio:device0"
    for k, (rail, mw) in enumerate([("VDD_IN", "4890"), ("VDD_CPU_GPU_CV", "1223"),
                                    ("VDD_SOC", "1427")]):
        put(tmp_path, "%s/rail_name_%d" % (dev, k), rail)
        put(tmp_path, "%s/in_power%d_input" % (dev, k), mw)
        put(tmp_path, "%s/in_voltage%d_input" % (dev, k), "5000")
        put(tmp_path, "%s/in_current%d_input" % (dev, k), "1")
    link(tmp_path, "bus/iio/devices/iio:device0", "../../../" + dev)
    meter = Ina3221IioMeter(sysfs_root=tmp_path)
    assert meter.total_w() == pytest.approx(4.890)


def test_iio_without_input_rail_sums_and_ignores_other_iio_devices(tmp_path):
    put(tmp_path, "bus/iio/devices/iio:device0/name", "some-adc")  # not an ina3221x: no rail_name_
    put(tmp_path, "bus/iio/devices/iio:device0/in_voltage0_raw", "1234")
    dev = "bus/iio/devices/iio:device1"
    for k, (rail, mw) in enumerate([("VDD_A", "1000"), ("VDD_B", "250"), ("", "999")]):
        put(tmp_path, "%s/rail_name_%d" % (dev, k), rail)  # an empty name is not a rail
        put(tmp_path, "%s/in_power%d_input" % (dev, k), mw)
    meter = Ina3221IioMeter(sysfs_root=tmp_path)
    assert meter.rails == ("VDD_A", "VDD_B")
    assert meter.total_w() == pytest.approx(1.25)


def test_iio_missing_tree_and_missing_files(tmp_path):
    with pytest.raises(PowerError, match="no ina3221x IIO rails"):
        Ina3221IioMeter(sysfs_root=tmp_path)
    dev = nano_iio_tree(tmp_path, with_power=False)
    meter = Ina3221IioMeter(sysfs_root=tmp_path)
    (dev / "in_current1_input").unlink()
    with pytest.raises(PowerError) as info:
        meter.read_w()
    assert info.value.errno == errno.ENOENT
    assert isinstance(info.value, DvfsError)


def test_iio_unreadable_and_garbage(tmp_path):
    dev = nano_iio_tree(tmp_path)
    meter = Ina3221IioMeter(sysfs_root=tmp_path)
    put(tmp_path, NANO_INA + "/iio:device0/in_power2_input", "n/a")
    with pytest.raises(PowerError, match="not an integer"):
        meter.read_w()
    make_unreadable_dir(dev / "in_power2_input")
    with pytest.raises(PowerError) as info:
        meter.read_w()
    assert info.value.errno == errno.EISDIR


def test_iio_root_only_files_need_read_access(shared_root):
    dev = nano_iio_tree(shared_root)
    meter = Ina3221IioMeter(sysfs_root=shared_root)
    os.chmod(str(dev / "in_power0_input"), root_only_mode())
    result = run_unprivileged(meter.read_w)
    assert result["ok"] is False
    assert result["errno"] == errno.EACCES
    assert "read access" in result["message"]


# -- INA3221 through hwmon (JetPack 5/6) ------------------------------

ORIN_NANO_INA = "devices/platform/bus@0/c240000.i2c/i2c-1/1-0040"


def hwmon_device(root, client, index, channels, extra_labels=None):
    """An ina3221 hwmon device; ``channels`` maps n to (label or None, mV, mA)."""
    dev = "%s/hwmon/hwmon%d" % (client, index)
    put(root, client + "/name", "ina3221")
    put(root, dev + "/name", "ina3221")
    for n, (label, mv, ma) in channels.items():
        if label is not None:
            put(root, "%s/in%d_label" % (dev, n), label)
        put(root, "%s/in%d_input" % (dev, n), mv)
        put(root, "%s/curr%d_input" % (dev, n), ma)
        put(root, "%s/in%d_enable" % (dev, n), "1")
        put(root, "%s/curr%d_crit_alarm" % (dev, n), "0")
        put(root, "%s/curr%d_max_alarm" % (dev, n), "0")
        put(root, "%s/shunt%d_resistor" % (dev, n), "5000")
        put(root, "%s/in%d_input" % (dev, n + 3), "4650")  # shunt voltage, uV
    put(root, dev + "/in7_label", "sum of shunt voltages")
    put(root, dev + "/in7_input", "6000")
    put(root, dev + "/curr4_crit_alarm", "0")
    link(root, "class/hwmon/hwmon%d" % index, "../../" + dev)
    return Path(root) / dev


def orin_nano_tree(root):
    # Values from a tegrastats idle capture: 5000 mV x 930/112/297 mA ~ 4.65/0.56/1.48 W.
    dev = hwmon_device(root, ORIN_NANO_INA, 1, {1: ("VDD_IN", "5000", "930"),
                                                2: ("VDD_CPU_GPU_CV", "5000", "112"),
                                                3: ("VDD_SOC", "5000", "297")})
    put(root, "devices/platform/soctherm-oc-event/hwmon/hwmon3/name", "soctherm_oc")
    put(root, "devices/platform/soctherm-oc-event/hwmon/hwmon3/oc1_event_cnt", "0")
    link(root, "class/hwmon/hwmon3", "../../devices/platform/soctherm-oc-event/hwmon/hwmon3")
    return dev


def test_hwmon_orin_nano_watts_from_mv_times_ma(tmp_path):
    orin_nano_tree(tmp_path)
    meter = Ina3221HwmonMeter(sysfs_root=tmp_path)
    assert meter.kind == "ina3221-hwmon"
    assert meter.rails == ("VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC")  # not in7's shunt sum
    assert meter.read_w() == pytest.approx({"VDD_IN": 4.65, "VDD_CPU_GPU_CV": 0.56,
                                            "VDD_SOC": 1.485})
    assert meter.total_w() == pytest.approx(4.65)


def test_hwmon_agx_orin_two_monitors_skip_nc_disabled_and_unlabelled(tmp_path):
    client0 = "devices/platform/bus@0/c240000.i2c/i2c-1/1-0040"
    client1 = "devices/platform/bus@0/c240000.i2c/i2c-1/1-0041"
    hwmon_device(tmp_path, client0, 3, {1: ("VDD_GPU_SOC", "843", "6170"),
                                        2: ("VDD_CPU_CV", "780", "3437"),
                                        3: ("VIN_SYS_5V0", "4968", "953")})
    dev1 = hwmon_device(tmp_path, client1, 4, {1: ("NC", "0", "0"),
                                               2: ("VDDQ_VDD2_1V8AO", "1800", "341"),
                                               3: ("VDD_SPARE", "0", "0")})
    put(tmp_path, client1 + "/hwmon/hwmon4/in3_enable", "0")  # disabled: in3_input is ENODATA
    make_unreadable_dir(dev1 / "in3_input")
    put(tmp_path, client1 + "/hwmon/hwmon5/name", "ina3221")  # a third one with no labels at all
    put(tmp_path, client1 + "/hwmon/hwmon5/in1_input", "5000")
    link(tmp_path, "class/hwmon/hwmon5", "../../" + client1 + "/hwmon/hwmon5")
    meter = Ina3221HwmonMeter(sysfs_root=tmp_path)
    assert meter.rails == ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO")
    watts = meter.read_w()
    assert watts["VDD_GPU_SOC"] == pytest.approx(843 * 6170 / 1e6)
    assert watts["VDDQ_VDD2_1V8AO"] == pytest.approx(0.6138)
    # AGX Orin has no VDD_IN: the total is the sum of the rails.
    assert meter.total_w() == pytest.approx(sum(watts.values()))


def test_hwmon_ignores_other_hwmon_devices_and_reports_none(tmp_path):
    put(tmp_path, "class/hwmon/hwmon0/name", "cpu_thermal")
    put(tmp_path, "class/hwmon/hwmon0/temp1_input", "48000")
    with pytest.raises(PowerError, match="no labelled ina3221"):
        Ina3221HwmonMeter(sysfs_root=tmp_path)
    with pytest.raises(PowerError):
        Ina3221HwmonMeter(sysfs_root=tmp_path / "absent")


def test_hwmon_missing_unreadable_and_garbage_files(tmp_path):
    dev = orin_nano_tree(tmp_path)
    meter = Ina3221HwmonMeter(sysfs_root=tmp_path)
    (dev / "curr2_input").unlink()
    with pytest.raises(PowerError) as info:
        meter.read_w()
    assert info.value.errno == errno.ENOENT
    put(dev, "curr2_input", "112 mA")
    with pytest.raises(PowerError, match="not an integer"):
        meter.total_w()
    put(dev, "curr2_input", "112")
    make_unreadable_dir(dev / "in1_input")
    with pytest.raises(PowerError) as info:
        meter.read_w()
    assert info.value.errno == errno.EISDIR


def test_hwmon_unreadable_name_or_label_fails_construction(tmp_path):
    dev = orin_nano_tree(tmp_path)
    make_unreadable_dir(dev / "in2_label")
    with pytest.raises(PowerError) as info:
        Ina3221HwmonMeter(sysfs_root=tmp_path)
    assert info.value.errno == errno.EISDIR


# -- Raspberry Pi 5 PMIC ----------------------------------------------------------



def test_pmic_parses_the_capture_and_pairs_rails_by_name():
    calls = []

    def runner(argv):
        calls.append(argv)
        return PMIC_CAPTURE

    meter = Rpi5PmicMeter(runner=runner)
    assert meter.kind == "rpi5-pmic"
    assert calls[0] == ["vcgencmd", "pmic_read_adc"]
    assert len(meter.rails) == 12
    assert "EXT5V" not in meter.rails and "BATT" not in meter.rails  # voltage only
    watts = meter.read_w()
    # current(7) pairs with volt(15): by name, not by channel number.
    assert watts["VDD_CORE"] == pytest.approx(6.22421 * 0.861733)
    assert watts["HDMI"] == pytest.approx(0.0241758 * 5.08664)
    assert meter.total_w() == pytest.approx(sum(watts.values()))
    assert meter.total_w() == pytest.approx(7.2398, abs=1e-4)  # hand sum of the 12 A x V


def test_pmic_parse_reports_amps_and_volts():
    amps, volts = parse_pmic_adc(PMIC_CAPTURE)
    assert amps["DDR_VDDQ"] == pytest.approx(0.0666672)
    assert volts["EXT5V"] == pytest.approx(5.09066)
    assert "EXT5V" not in amps


def test_pmic_default_runner_runs_a_real_command(tmp_path):
    script = tmp_path / "vcgencmd.py"
    script.write_text("import sys\nassert sys.argv[1] == 'pmic_read_adc'\n"
                      "sys.stdout.write(%r)\n" % PMIC_CAPTURE)
    meter = Rpi5PmicMeter(command=[sys.executable, str(script), "pmic_read_adc"])
    assert meter.read_w()["VDD_CORE"] == pytest.approx(5.3636, abs=1e-3)


def test_pmic_missing_command_timeout_and_failure(tmp_path):
    with pytest.raises(PowerError, match="not found") as info:
        Rpi5PmicMeter(command=[str(tmp_path / "vcgencmd"), "pmic_read_adc"])
    assert info.value.errno == errno.ENOENT
    with pytest.raises(PowerError, match="did not answer"):
        Rpi5PmicMeter(command=[sys.executable, "-c", "import time; time.sleep(10)"],
                      timeout_s=0.2)
    with pytest.raises(PowerError, match="exited with 2"):
        Rpi5PmicMeter(command=[sys.executable, "-c",
                               "import sys; sys.stderr.write('boom'); sys.exit(2)"])
    not_exec = put(tmp_path, "not-executable", "#!/bin/sh", mode=0o644)
    with pytest.raises(PowerError, match="cannot run"):
        Rpi5PmicMeter(command=[str(not_exec.parent)])  # a directory: PermissionError


def test_pmic_garbage_output():
    # What the firmware of a Pi 4 answers: no PMIC ADC.
    with pytest.raises(PowerError, match="no rail with both"):
        Rpi5PmicMeter(runner=lambda argv: 'error=2 error_msg="Command not registered"\n')
    with pytest.raises(PowerError, match="no number"):
        Rpi5PmicMeter(runner=lambda argv: "VDD_CORE_A current(7)=abcA\nVDD_CORE_V volt(15)=0.8V\n")
    with pytest.raises(PowerError, match="inconsistent"):
        Rpi5PmicMeter(runner=lambda argv: "VDD_CORE_A volt(7)=1.0V\n")
    with pytest.raises(PowerError, match="no rail with both"):
        Rpi5PmicMeter(runner=lambda argv: "")


def test_pmic_failure_after_start_is_a_power_error():
    answers = [PMIC_CAPTURE]

    def runner(argv):
        if answers:
            return answers.pop()
        raise OSError(errno.EACCES, "Permission denied", "/dev/vcio")

    meter = Rpi5PmicMeter(runner=runner)
    with pytest.raises(PowerError, match="video group") as info:
        meter.read_w()
    assert info.value.errno == errno.EACCES


# -- Intel RAPL -------------------------------------------------------------

MAX_RANGE_UJ = 262143328850


class FakeClock(object):
    def __init__(self, t_s=100.0):
        self.t_s = t_s

    def __call__(self):
        return self.t_s


def rapl_tree(root, energy_uj=52649883221, mode=None):
    zone = "devices/virtual/powercap/intel-rapl/intel-rapl:0"
    put(root, zone + "/name", "package-0")
    put(root, zone + "/energy_uj", str(energy_uj), mode=mode)
    put(root, zone + "/max_energy_range_uj", str(MAX_RANGE_UJ))
    put(root, zone + "/constraint_0_name", "long_term")
    put(root, zone + "/constraint_0_power_limit_uw", "65000000")
    put(root, zone + "/intel-rapl:0:0/name", "core")
    put(root, zone + "/intel-rapl:0:0/energy_uj", "1000")
    put(root, zone + "/intel-rapl:0:0/max_energy_range_uj", str(MAX_RANGE_UJ))
    (Path(root) / "class/powercap").mkdir(parents=True, exist_ok=True)
    link(root, "class/powercap/intel-rapl", "../../devices/virtual/powercap/intel-rapl")
    link(root, "class/powercap/intel-rapl:0", "../../" + zone)
    link(root, "class/powercap/intel-rapl:0:0", "../../" + zone + "/intel-rapl:0:0")
    return Path(root) / zone


def test_rapl_power_from_energy_difference(tmp_path):
    zone = rapl_tree(tmp_path)
    clock = FakeClock()
    meter = RaplMeter(sysfs_root=tmp_path, clock=clock)
    assert meter.kind == "rapl"
    assert meter.rails == ("package-0",)  # subzone core is inside the package
    # The first read averages since construction; no time has passed, so 0.0 W.
    assert meter.read_w() == {"package-0": 0.0}
    put(zone, "energy_uj", str(52649883221 + 15000000))
    clock.t_s += 1.5
    assert meter.read_w() == pytest.approx({"package-0": 10.0})
    # A read at the same instant repeats the previous answer and keeps the baseline.
    put(zone, "energy_uj", str(52649883221 + 16000000))
    assert meter.total_w() == pytest.approx(10.0)
    put(zone, "energy_uj", str(52649883221 + 17000000))
    clock.t_s += 0.5
    assert meter.total_w() == pytest.approx(4.0)


def test_rapl_counter_wraps_at_max_energy_range(tmp_path):
    zone = rapl_tree(tmp_path, energy_uj=MAX_RANGE_UJ - 1000000)
    clock = FakeClock()
    meter = RaplMeter(sysfs_root=tmp_path, clock=clock)
    put(zone, "energy_uj", "4000000")
    clock.t_s += 1.0
    assert meter.read_w()["package-0"] == pytest.approx(5.0)


def test_rapl_psys_is_the_total(tmp_path):
    rapl_tree(tmp_path)
    put(tmp_path, "class/powercap/intel-rapl:1/name", "psys")
    put(tmp_path, "class/powercap/intel-rapl:1/energy_uj", "0")
    put(tmp_path, "class/powercap/intel-rapl:1/max_energy_range_uj", str(MAX_RANGE_UJ))
    clock = FakeClock()
    meter = RaplMeter(sysfs_root=tmp_path, clock=clock)
    assert meter.rails == ("package-0", "psys")
    put(tmp_path, "class/powercap/intel-rapl:1/energy_uj", "30000000")
    clock.t_s += 1.0
    assert meter.total_w() == pytest.approx(30.0)


def test_rapl_missing_and_garbage(tmp_path):
    with pytest.raises(PowerError, match="no intel-rapl zones"):
        RaplMeter(sysfs_root=tmp_path)
    zone = rapl_tree(tmp_path)
    (zone / "max_energy_range_uj").unlink()
    with pytest.raises(PowerError) as info:
        RaplMeter(sysfs_root=tmp_path)
    assert info.value.errno == errno.ENOENT
    put(zone, "max_energy_range_uj", "0")
    with pytest.raises(PowerError, match="max_energy_range_uj is 0"):
        RaplMeter(sysfs_root=tmp_path)
    put(zone, "max_energy_range_uj", str(MAX_RANGE_UJ))
    meter = RaplMeter(sysfs_root=tmp_path, clock=FakeClock())
    put(zone, "energy_uj", "lots")
    with pytest.raises(PowerError, match="not an integer"):
        meter.read_w()
    put(zone, "energy_uj", "-5")
    with pytest.raises(PowerError, match="negative"):
        meter.read_w()
    make_unreadable_dir(zone / "energy_uj")
    with pytest.raises(PowerError) as info:
        meter.read_w()
    assert info.value.errno == errno.EISDIR


def test_rapl_root_only_energy_says_how_to_grant_access(shared_root):
    rapl_tree(shared_root, mode=root_only_mode())
    result = run_unprivileged(lambda: RaplMeter(sysfs_root=shared_root))
    assert result["ok"] is False
    assert result["errno"] == errno.EACCES
    assert "needs read access" in result["message"]
    assert "CAP_DAC_READ_SEARCH" in result["message"]


# -- jtop: the not-installed path and the stats parsing only ----------------------

JTOP_POWER = {
    "rail": {
        "VDD_IN": {"volt": 5000, "curr": 930, "power": 4650, "avg": 4600, "online": True,
                   "type": "INA3221", "warn": 32760, "crit": 32760},
        "VDD_CPU_GPU_CV": {"volt": 5000, "curr": 112, "power": 560, "avg": 550, "online": True},
        "VDD_SOC": {"volt": 5000, "curr": 297, "power": 1485, "avg": 1480, "online": True},
        "VDD_OFF": {"volt": 0, "curr": 0, "power": 0, "avg": 0, "online": False},
    },
    "tot": {"volt": 5000, "curr": 930, "power": 4650, "avg": 4600, "online": True,
            "name": "VDD_IN"},
}


def test_jtop_not_installed_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "jtop", None)  # makes ``import jtop`` raise ImportError
    with pytest.raises(PowerError, match=r"pip install streamfl\[jetson\]"):
        JtopMeter()
    assert INSTALL_HINT == "pip install streamfl[jetson]"


def test_jtop_parses_the_power_dict():
    meter = JtopMeter(source=lambda: JTOP_POWER)
    assert meter.kind == "jtop"
    assert meter.rails == ("VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC")  # offline rail skipped
    assert meter.read_w() == pytest.approx({"VDD_IN": 4.65, "VDD_CPU_GPU_CV": 0.56,
                                            "VDD_SOC": 1.485})
    assert meter.total_w() == pytest.approx(4.65)
    meter.close()
    meter.close()


def test_jtop_without_tot_uses_input_rail_or_sum():
    stats = {"rail": {"VDD_GPU_SOC": {"volt": 843, "curr": 6170},
                      "VDD_CPU_CV": {"power": 2681}}}
    watts, total_w = parse_power(stats)
    assert total_w is None
    assert watts["VDD_GPU_SOC"] == pytest.approx(5.20131)
    assert JtopMeter(source=lambda: stats).total_w() == pytest.approx(5.20131 + 2.681)


def test_jtop_garbage_and_source_errors():
    for bad in ({}, {"rail": []}, {"rail": {"X": 5}}, {"rail": {"X": {"power": "lots"}}},
                {"rail": {"X": {"volt": 5000}}}, {"rail": {}, "tot": {"power": None}}, None):
        with pytest.raises(PowerError):
            parse_power(bad)

    def broken():
        raise RuntimeError("socket closed")

    with pytest.raises(PowerError, match="socket closed"):
        JtopMeter(source=broken)


# -- modeled and null ------------------------------------------------------------------------------

class TinyDomain(FrequencyDomain):
    """A frequency domain held in memory: just enough for the modeled meter."""

    def __init__(self, name, kind, levels_khz):
        self.name, self.kind = name, kind
        self._levels = tuple(levels_khz)
        self.cap = self._levels[-1]
        self.fail = False

    @property
    def levels_khz(self):
        return self._levels

    def current_khz(self):
        return self.cap

    def cap_khz(self):
        if self.fail:
            raise DvfsError("cannot read scaling_max_freq", errno.EBUSY)
        return self.cap

    def set_level(self, index):
        self.cap = self._levels[index]

    def snapshot(self):
        return [("cap", str(self.cap))]

    def restore(self, snapshot):
        self.cap = int(snapshot[0][1])


def test_modeled_meter_follows_levels_and_busy():
    cpu = TinyDomain("cpu0", "cpu", [102000, 918000, 1479000])
    gpu = TinyDomain("gpu", "gpu", [76800000, 921600000])
    busy = [False]
    meter = ModeledMeter([cpu, gpu], {"cpu0": [0.5, 1.5, 3.0], "gpu": [0.8, 4.0]}, idle_w=1.25,
                         busy=lambda: busy[0])
    assert meter.kind == "modeled"
    assert meter.rails == ("idle", "cpu0", "gpu")
    assert meter.read_w() == {"idle": 1.25, "cpu0": 0.0, "gpu": 0.0}
    assert meter.total_w() == 1.25
    busy[0] = True
    assert meter.total_w() == pytest.approx(1.25 + 3.0 + 4.0)
    cpu.set_level(1)
    gpu.set_level(0)
    assert meter.read_w() == pytest.approx({"idle": 1.25, "cpu0": 1.5, "gpu": 0.8})
    cpu.fail = True
    with pytest.raises(PowerError) as info:
        meter.read_w()
    assert info.value.errno == errno.EBUSY


def test_modeled_meter_rejects_bad_models():
    cpu = TinyDomain("cpu0", "cpu", [600000, 1500000])
    with pytest.raises(ValueError, match="no watts per level"):
        ModeledMeter([cpu], {}, 1.0, lambda: True)
    with pytest.raises(ValueError, match="2 levels but 3"):
        ModeledMeter([cpu], {"cpu0": [1, 2, 3]}, 1.0, lambda: True)
    with pytest.raises(ValueError):
        ModeledMeter([cpu], {"cpu0": [1, -2]}, 1.0, lambda: True)
    with pytest.raises(ValueError):
        ModeledMeter([cpu], {"cpu0": [1, 2]}, float("nan"), lambda: True)
    with pytest.raises(ValueError):
        ModeledMeter([TinyDomain("idle", "cpu", [1])], {"idle": [1]}, 1.0, lambda: True)


def test_null_meter_measures_nothing():
    meter = NullMeter()
    assert meter.kind == "null"
    assert meter.rails == ()
    assert meter.read_w() == {}
    assert meter.total_w() == 0.0
    meter.close()
    assert "measures nothing" in NullMeter.__doc__.lower()


# -- factory ---------------------------------------------------------------------------------------

def no_vcgencmd(argv):
    raise FileNotFoundError(2, "No such file or directory", argv[0])


def test_detect_picks_the_sensor_the_tree_has(tmp_path):
    assert detect_meter(tmp_path / "empty", runner=no_vcgencmd).kind == "null"
    orin_nano_tree(tmp_path / "orin")
    assert detect_meter(tmp_path / "orin", runner=no_vcgencmd).kind == "ina3221-hwmon"
    nano_iio_tree(tmp_path / "nano")
    assert detect_meter(tmp_path / "nano", runner=no_vcgencmd).kind == "ina3221-iio"
    assert detect_meter(tmp_path / "empty", runner=lambda argv: PMIC_CAPTURE).kind == "rpi5-pmic"
    rapl_tree(tmp_path / "x86")
    assert detect_meter(tmp_path / "x86", runner=no_vcgencmd).kind == "rapl"


@pytest.mark.parametrize("variant,kind", [("jp4", "ina3221-iio"), ("jp5", "ina3221-hwmon")])
def test_xavier_nx_rails_through_either_driver(tmp_path, variant, kind):
    """The same three rails at 7-0040: IIO on JetPack 4, hwmon on JetPack 5."""
    build_tree(tmp_path, "jetson-xavier-nx", variant)
    assert detect_meter(tmp_path, runner=no_vcgencmd).kind == kind
    meter = create_meter(kind, tmp_path)
    assert meter.rails == ("VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC")
    assert meter.read_w() == pytest.approx({"VDD_IN": 4.0, "VDD_CPU_GPU_CV": 0.4, "VDD_SOC": 1.1})
    assert meter.total_w() == pytest.approx(4.0)                    # VDD_IN, not the sum


def test_agx_orin_tree_without_a_sum_channel_reads_every_rail(tmp_path):
    build_tree(tmp_path, "jetson-agx-orin", "jp6")              # 1-0040 has no curr4_*
    meter = create_meter("ina3221-hwmon", tmp_path)
    assert meter.rails == ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO")
    assert meter.total_w() == pytest.approx((843 * 6170 + 780 * 3437 + 4968 * 953
                                             + 1800 * 341) / 1e6)


def test_create_meter_by_kind_and_unknown_kinds(tmp_path):
    orin_nano_tree(tmp_path)
    assert create_meter("ina3221-hwmon", tmp_path).rails[0] == "VDD_IN"
    assert create_meter("null").total_w() == 0.0
    with pytest.raises(PowerError):
        create_meter("ina3221-iio", tmp_path)
    with pytest.raises(ConfigError, match="unknown power meter kind 'modeled'"):
        create_meter("modeled")
    with pytest.raises(ConfigError, match="unknown"):
        create_meter("tegrastats")
