"""Fake sysfs trees for every supported board, file for file as the boards show them.

Contents, formats and modes follow captures from the boards and the kernel sources; numbers marked
(v) are sample values, and each choice made for an unconfirmed fact is marked [U] with a comment.
A tree is plain files and relative symlinks, so the real ``SysfsFiles`` reads it as it reads
``/sys``; ``streamfl.dvfs.fake.kernel.FakeKernel`` adds the rules.
"""
import logging
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

from streamfl.dvfs.fake.files import ROOT_RO, ROOT_RWX, RW, WO, Tree, words
from streamfl.dvfs.fake.ina3221 import ina_hwmon, ina_iio

log = logging.getLogger(__name__)

#: (board, variant) pairs a tree can be built for: Xavier NX, AGX Orin
#: and Orin Nano on two JetPacks each.
FAKE_TREES: Tuple[Tuple[str, str], ...] = (
    ("jetson-nano", "jp4"),
    ("jetson-xavier-nx", "jp4"),
    ("jetson-xavier-nx", "jp5"),
    ("jetson-agx-orin", "jp5"),
    ("jetson-agx-orin", "jp6"),
    ("jetson-orin-nano", "jp6"),
    ("jetson-orin-nano", "jp5"),
    ("raspberry-pi-4", ""),
    ("raspberry-pi-5", ""),
    ("generic-linux", ""),
)

CPU = "devices/system/cpu/"
#: Tegra cpufreq drivers report 300000 ns.
TEGRA_LATENCY_NS = 300000
#: [U] cpufreq-dt falls back to CPUFREQ_ETERNAL (printed %u) when the OPPs carry no latency, and
#: raspberrypi-cpufreq registers its OPPs without one; the value on a real board is unconfirmed.
ETERNAL_NS = 4294967295

JETSON_GOVS = ("conservative", "ondemand", "userspace", "powersave", "performance", "schedutil")
NANO_GOVS = ("interactive",) + JETSON_GOVS  # [U] typical L4T R32 list
NANO_GPU_GOVS = ("wmark_active", "wmark_simple", "nvhost_podgov", "userspace", "performance",
                 "simple_ondemand")
ORIN_GPU_GOVS = ("nvhost_podgov", "userspace", "performance", "simple_ondemand")  # [U]

ORIN_KHZ = (115200, 192000, 268800, 345600, 422400, 499200, 576000, 652800, 729600, 806400,
            883200, 960000, 1036800, 1113600, 1190400, 1267200, 1344000, 1420800, 1497600)
NANO_KHZ = (102000, 204000, 307200, 403200, 518400, 614400, 710400, 825600, 921600, 1036800,
            1132800, 1224000, 1326000, 1428000, 1479000)
XAVIER_KHZ = ORIN_KHZ + (1574400, 1651200, 1728000, 1804800, 1881600, 1907200)
AGX_ORIN_KHZ = ORIN_KHZ + (1574400, 1651200, 1728000, 1804800, 1881600, 1958400, 2035200,
                           2112000, 2188800, 2201600)
ORIN_NANO_KHZ = ORIN_KHZ + (1510400,)
#: [U] Super ladder (JP6.2 MAXN_SUPER, max 1728000 seen on a Super kit): the lower steps are a guess.
ORIN_NANO_SUPER_KHZ = ORIN_KHZ + (1574400, 1651200, 1728000)

NANO_GPU_HZ = tuple(76800000 * i for i in range(1, 13))
XAVIER_GPU_HZ = (114750000, 204000000, 306000000, 408000000, 510000000, 599250000, 701250000,
                 803250000, 854250000, 905250000, 956250000, 1007250000, 1058250000, 1109250000)
AGX_ORIN_GPU_HZ = tuple(102000000 * i for i in range(3, 13)) + (1300500000,)
ORIN_NANO_GPU_HZ = (306000000, 408000000, 510000000, 612000000, 624750000)
#: [U] Super list (102 MHz steps up to the observed 1020000000).
ORIN_NANO_SUPER_GPU_HZ = tuple(102000000 * i for i in range(3, 11))

#: Thermal zones per board, in zone order: (type, m°C or None where reading raises EAGAIN).
_THERMAL: Dict[str, Tuple[Tuple[str, Optional[int]], ...]] = {
    "jetson-nano": (("AO-therm", 41000), ("CPU-therm", 36500), ("GPU-therm", 34000),
                    ("PLL-therm", 33000), ("PMIC-Die", 100000), ("thermal-fan-est", 35250)),
    # [U] order; the JP4 names are known only as an alphabetical list and no JP5 names are, so
    # the JP5 tree keeps them.
    "jetson-xavier-nx": (("AO-therm", 40500), ("CPU-therm", 39000), ("GPU-therm", 38500),
                         ("PLL-therm", 37500), ("PMIC-Die", 100000), ("Tboard_tegra", 36000),
                         ("Tdiode_tegra", 37000), ("thermal-fan-est", 37600)),
    # [U] strings and order, derived from tegrastats labels.
    "jetson-agx-orin": (("cpu-thermal", 45500), ("gpu-thermal", 44000), ("cv0-thermal", 43500),
                        ("cv1-thermal", 43000), ("cv2-thermal", 43200), ("soc0-thermal", 44500),
                        ("soc1-thermal", 44800), ("soc2-thermal", 44100), ("tj-thermal", 45500),
                        ("tboard-thermal", 38000), ("tdiode-thermal", 40000)),
    "jetson-orin-nano": (("cpu-thermal", 47875), ("gpu-thermal", 50218), ("cv0-thermal", None),
                         ("cv1-thermal", None), ("cv2-thermal", None), ("soc0-thermal", 47281),
                         ("soc1-thermal", 48281), ("soc2-thermal", 46750), ("tj-thermal", 50218)),
    "raspberry-pi-4": (("cpu-thermal", 48686),),  # [U] type string
    "raspberry-pi-5": (("cpu-thermal", 51200),),  # [U] type string
    "generic-linux": (("x86_pkg_temp", 45000),),  # [U] Intel's usual zone
}

def _cpus(t: Tree, policies: Sequence[Sequence[int]], table_khz: Optional[Sequence[int]],
          hw_khz: Tuple[int, int], driver: str, governors: Sequence[str], governor: str,
          limits_khz: Tuple[int, int, int], latency_ns: int, has_get: bool = True) -> None:
    """CPU hotplug files and one cpufreq policy per cluster."""
    n_cpus = sum(len(p) for p in policies)
    t.put(CPU + "online", "0-%d" % (n_cpus - 1))
    for cpus in policies:
        pol = "cpufreq/policy%d" % cpus[0]
        p = CPU + pol + "/"
        for cpu in cpus:
            t.put(CPU + "cpu%d/online" % cpu, "1", RW)  # [U] presence for cpu0
            t.link(CPU + "cpu%d/cpufreq" % cpu, "../" + pol)
        t.put(p + "affected_cpus", words(cpus, False))
        t.put(p + "related_cpus", words(cpus, False))
        t.put(p + "cpuinfo_min_freq", str(hw_khz[0]))
        t.put(p + "cpuinfo_max_freq", str(hw_khz[1]))
        t.put(p + "cpuinfo_transition_latency", str(latency_ns))
        if has_get:
            t.put(p + "cpuinfo_cur_freq", str(limits_khz[2]), ROOT_RO)
        # Setpolicy drivers (intel_pstate) print "performance powersave\n" without the trailing
        # space and have no frequency table.
        t.put(p + "scaling_available_governors", words(governors, table_khz is not None))
        t.put(p + "scaling_driver", driver)
        t.put(p + "scaling_governor", governor, RW)
        t.put(p + "scaling_min_freq", str(limits_khz[0]), RW)
        t.put(p + "scaling_max_freq", str(limits_khz[1]), RW)
        t.put(p + "scaling_cur_freq", str(limits_khz[2]))
        t.put(p + "scaling_setspeed", "<unsupported>", RW)
        if table_khz is not None:
            t.put(p + "scaling_available_frequencies", words(table_khz, True))
            # [U] CONFIG_CPU_FREQ_STAT on each board; time in 10 ms units.
            t.put(p + "stats/time_in_state", "\n".join("%d 0" % f for f in table_khz))
            t.put(p + "stats/total_trans", "0")
            t.put(p + "stats/reset", "", WO)


def _gpu(t: Tree, dev: str, table_hz: Sequence[int], governors: Sequence[str], of_name: str,
         limits_hz: Tuple[int, int, int], links: Sequence[Tuple[str, str]],
         has_name: bool) -> None:
    """An nvgpu device with its devfreq node, Hz throughout."""
    name = dev.rsplit("/", 1)[1]
    d = "%s/devfreq/%s/" % (dev, name)
    t.put(d + "available_frequencies", words(table_hz, False))  # space truncated, even on 4.9
    t.put(d + "available_governors", words(governors, False))
    t.put(d + "governor", "nvhost_podgov", RW)
    t.put(d + "min_freq", str(limits_hz[0]), RW)
    t.put(d + "max_freq", str(limits_hz[1]), RW)
    t.put(d + "cur_freq", str(limits_hz[2]))
    t.put(d + "target_freq", str(limits_hz[2]))
    t.put(d + "polling_interval", "50", RW)  # [U] value
    if has_name:  # kernels >= 5.5
        t.put(d + "name", name)
    t.link(d + "device", "../../../" + name)
    t.link("class/devfreq/" + name, "../../" + d.rstrip("/"))
    t.put(dev + "/of_node/name", of_name.encode() + b"\0")  # DT property: NUL, no newline
    t.put(dev + "/load", "0")
    t.put(dev + "/railgate_enable", "1", ROOT_RWX)
    t.put(dev + "/enable_3d_scaling", "1", RW)  # [U] mode
    t.put(dev + "/tpc_pg_mask", "0", RW)  # [U] mode
    t.put(dev + "/power/control", "auto", RW)
    for rel, target in links:
        t.link(rel, target)


def _thermal(t: Tree, board: str) -> None:
    for i, (kind, temp) in enumerate(_THERMAL[board]):
        z = "devices/virtual/thermal/thermal_zone%d" % i
        t.put(z + "/type", kind)
        # A zone whose read raises EAGAIN is left empty: only FakeKernel models the error.
        t.put(z + "/temp", b"" if temp is None else str(temp))
        t.link("class/thermal/thermal_zone%d" % i, "../../" + z)


def _jetson_nano(t: Tree, variant: str) -> None:
    _cpus(t, [[0, 1, 2, 3]], NANO_KHZ, (102000, 1479000), "tegra-cpufreq", NANO_GOVS, "schedutil",
          (102000, 1479000, 1479000), TEGRA_LATENCY_NS)  # [U] driver name (tegra210-cpufreq.c)
    _gpu(t, "devices/57000000.gpu", NANO_GPU_HZ, NANO_GPU_GOVS, "gpu",
         (76800000, 921600000, 76800000), [("devices/gpu.0", "57000000.gpu")], False)
    ina_iio(t, "devices/50000000.host1x/546c0000.i2c/i2c-6/6-0040",
            [("POM_5V_IN", 5000, 509, 2545), ("POM_5V_GPU", 5000, 0, 0),
             ("POM_5V_CPU", 5000, 110, 549)])
    t.put("devices/pwm-fan/target_pwm", "0", RW)
    t.put("devices/pwm-fan/temp_control", "1", RW)


def _jetson_xavier_nx(t: Tree, variant: str) -> None:
    """JP4 (L4T R32, 4.9) or JP5 (R35, 5.10): cpufreq driver, GPU layout, INA driver."""
    jp5 = variant == "jp5"
    _cpus(t, [[0, 1], [2, 3], [4, 5]], XAVIER_KHZ, (115200, 1907200),
          "tegra194" if jp5 else "tegra_cpufreq", JETSON_GOVS, "schedutil",
          (115200, 1907200, 1907200), TEGRA_LATENCY_NS)
    limits = (114750000, 1109250000, 114750000)
    if jp5:
        # the platform dir, plus nvgpu's gpu.0 link in the parent and gpu.0 and
        # <devname> links in the grand-parent on kernels > 4.14; devfreq "name" since 5.5.
        _gpu(t, "devices/platform/17000000.gv11b", XAVIER_GPU_HZ, NANO_GPU_GOVS, "gv11b", limits,
             [("devices/platform/gpu.0", "17000000.gv11b"),
              ("devices/17000000.gv11b", "platform/17000000.gv11b"),
              ("devices/gpu.0", "platform/17000000.gv11b")], True)
        # JP5 power: hwmon ina3221 at 7-0040, hwmon4 (index varies 3/4/5). [U] labels and
        # shunts (5000 uOhm, as the Orin NX family with the same rails); [U] the platform
        # path of the client, as on Orin JP5. No summation-disable is reported, so the
        # sum channel follows the upstream driver's rule (curr4_* only without summation-disable);
        # values (v) as the JP4 tree.
        ina_hwmon(t, "devices/platform/c250000.i2c/i2c-7/7-0040", "hwmon4",
                  [("VDD_IN", 5000, 800), ("VDD_CPU_GPU_CV", 5000, 80), ("VDD_SOC", 5000, 220)],
                  5000, summation=True)
        return
    _gpu(t, "devices/17000000.gv11b", XAVIER_GPU_HZ, NANO_GPU_GOVS, "gv11b", limits,
         [("devices/gpu.0", "17000000.gv11b")], False)
    # [U] rail labels; values (v).
    ina_iio(t, "devices/c250000.i2c/i2c-7/7-0040",
            [("VDD_IN", 5000, 800, 4000), ("VDD_CPU_GPU_CV", 5000, 80, 400),
             ("VDD_SOC", 5000, 220, 1100)])


def _orin_gpu(t: Tree, variant: str, table_hz: Sequence[int]) -> None:
    """The two Orin GPU layouts: JP5 ``platform/17000000.ga10b``, JP6 ``platform/bus@0/...gpu``."""
    limits = (table_hz[0], table_hz[-1], table_hz[0])
    if variant == "jp6":
        _gpu(t, "devices/platform/bus@0/17000000.gpu", table_hz, ORIN_GPU_GOVS, "gpu", limits,
             [("devices/platform/bus@0/gpu.0", "17000000.gpu"),
              ("devices/platform/gpu.0", "bus@0/17000000.gpu"),
              ("devices/platform/17000000.gpu", "bus@0/17000000.gpu")], True)
    else:
        _gpu(t, "devices/platform/17000000.ga10b", table_hz, ORIN_GPU_GOVS, "ga10b", limits,
             [("devices/platform/gpu.0", "17000000.ga10b"),
              ("devices/17000000.ga10b", "platform/17000000.ga10b"),
              ("devices/gpu.0", "platform/17000000.ga10b")], True)


def _i2c1(variant: str) -> str:
    return "devices/platform/%sc240000.i2c/i2c-1/" % ("bus@0/" if variant == "jp6" else "")


def _jetson_agx_orin(t: Tree, variant: str) -> None:
    _cpus(t, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]], AGX_ORIN_KHZ, (115200, 2201600),
          "tegra194", JETSON_GOVS, "schedutil", (115200, 2201600, 2201600), TEGRA_LATENCY_NS)
    _orin_gpu(t, variant, AGX_ORIN_GPU_HZ)
    # 1-0040's third input (VIN_SYS_5V0) has ti,summation-disable, so that monitor
    # has no curr4_* sum channel; 1-0041 has equal shunts and no summation-disable [U: none
    # is known], so it keeps it.
    ina_hwmon(t, _i2c1(variant) + "1-0040", "hwmon3",
              [("VDD_GPU_SOC", 843, 6170), ("VDD_CPU_CV", 780, 3437), ("VIN_SYS_5V0", 4968, 953)],
              2000, summation=False)
    ina_hwmon(t, _i2c1(variant) + "1-0041", "hwmon4",
              [("NC", 0, 0), ("VDDQ_VDD2_1V8AO", 1800, 341), ("NC", 0, 0)], 2000, summation=True)


def _jetson_orin_nano(t: Tree, variant: str) -> None:
    # JP6 is the observed Orin Nano Super; JP5 predates Super, so it gets the base ladders.
    cpu_khz = ORIN_NANO_SUPER_KHZ if variant == "jp6" else ORIN_NANO_KHZ
    _cpus(t, [[0, 1, 2, 3], [4, 5]], cpu_khz, (cpu_khz[0], cpu_khz[-1]), "tegra194", JETSON_GOVS,
          "schedutil", (cpu_khz[0], cpu_khz[-1], cpu_khz[-1]), TEGRA_LATENCY_NS)
    _orin_gpu(t, variant, ORIN_NANO_SUPER_GPU_HZ if variant == "jp6" else ORIN_NANO_GPU_HZ)
    # [U] hwmon1 and the bus path on JP5; observed on JP6 with curr4_crit_alarm.
    ina_hwmon(t, _i2c1(variant) + "1-0040", "hwmon1",
              [("VDD_IN", 5000, 930), ("VDD_CPU_GPU_CV", 5000, 112), ("VDD_SOC", 5000, 297)],
              5000, summation=True)
    oc = "devices/platform/soctherm-oc-event/hwmon/hwmon3/"
    for i in (1, 2, 3):
        t.put(oc + "oc%d_event_cnt" % i, "0")
        t.put(oc + "oc%d_throt_en" % i, "1")
    if variant == "jp6":
        t.put("kernel/nvpmodel_clk_cap/emc", "3199000000", RW)  # [U] mode


def _raspberry_pi(t: Tree, low_khz: int, high_khz: int) -> None:
    table = tuple(range(low_khz, high_khz + 1, 100000))  # OPPs in 100 MHz steps
    _cpus(t, [[0, 1, 2, 3]], table, (low_khz, high_khz), "cpufreq-dt", JETSON_GOVS, "ondemand",
          (low_khz, high_khz, low_khz), ETERNAL_NS)


def _raspberry_pi_4(t: Tree, variant: str) -> None:
    _raspberry_pi(t, 600000, 1500000)  # arm_freq 1500 of the Pi 4B <= R1.3 and CM4


def _raspberry_pi_5(t: Tree, variant: str) -> None:
    _raspberry_pi(t, 1500000, 2400000)  # [U] firmware arm_freq defaults, 100 MHz steps
    fan = "devices/platform/cooling_fan/hwmon/hwmon2"  # [U] hwmon index
    t.put(fan + "/fan1_input", "0")
    t.link("class/hwmon/hwmon2", "../../" + fan)


def _generic_linux(t: Tree, variant: str) -> None:
    # [U] an x86 laptop: intel_pstate, one policy per CPU, 0.8-4.2 GHz, no ->get so no
    # cpuinfo_cur_freq, transition latency 0.
    _cpus(t, [[0], [1], [2], [3]], None, (800000, 4200000), "intel_pstate",
          ("performance", "powersave"), "powersave", (800000, 4200000, 2100000), 0, has_get=False)
    base = "devices/virtual/powercap/intel-rapl/"
    t.put(base + "enabled", "1", RW)
    t.link("class/powercap/intel-rapl", "../../" + base.rstrip("/"))
    zones = (("intel-rapl:0", "package-0", "52649883221"),
             ("intel-rapl:0/intel-rapl:0:0", "core", "31405617480"),  # (v) sub-zone values
             ("intel-rapl:0/intel-rapl:0:1", "uncore", "1250390136"))
    for path, name, energy_uj in zones:
        z = base + path + "/"
        t.put(z + "name", name)
        t.put(z + "energy_uj", energy_uj, ROOT_RO)  # root-only since CVE-2020-8694
        t.put(z + "max_energy_range_uj", "262143328850")  # [U] for the sub-zones
        t.put(z + "enabled", "1", RW)
        t.link("class/powercap/" + path.rsplit("/", 1)[-1], "../../" + z.rstrip("/"))
    pkg = base + "intel-rapl:0/"
    for i, (name, limit_uw, window_us) in enumerate((("long_term", 65000000, 7995392),
                                                     ("short_term", 117000000, 2440))):
        t.put(pkg + "constraint_%d_name" % i, name)
        t.put(pkg + "constraint_%d_power_limit_uw" % i, str(limit_uw), RW)
        t.put(pkg + "constraint_%d_time_window_us" % i, str(window_us), RW)


_BUILDERS = {
    "jetson-nano": _jetson_nano,
    "jetson-xavier-nx": _jetson_xavier_nx,
    "jetson-agx-orin": _jetson_agx_orin,
    "jetson-orin-nano": _jetson_orin_nano,
    "raspberry-pi-4": _raspberry_pi_4,
    "raspberry-pi-5": _raspberry_pi_5,
    "generic-linux": _generic_linux,
}


def _check(board: str, variant: str) -> None:
    if (board, variant) not in FAKE_TREES:
        raise ValueError("no fake sysfs tree for board %r variant %r (known: %s)" % (
            board, variant, ", ".join("%s/%s" % (b, v) if v else b for b, v in FAKE_TREES)))


def build_tree(sysfs_root: Path, board: str, variant: str = "") -> None:
    """Write the sysfs files of ``board`` under ``sysfs_root``, replacing files there."""
    _check(board, variant)
    t = Tree(Path(sysfs_root))
    _BUILDERS[board](t, variant)
    _thermal(t, board)
    log.debug("built fake sysfs tree for %s %s under %s", board, variant, sysfs_root)


def legacy_limits(board: str, variant: str) -> bool:
    """True on 4.9 kernels (JetPack 4), where crossing min/max is EINVAL; False where max wins."""
    _check(board, variant)
    return variant == "jp4"


def thermal_eagain_paths(board: str, variant: str) -> Tuple[str, ...]:
    """The thermal ``temp`` files whose reads raise EAGAIN on that board (``FakeKernel(eagain_paths=)``)."""
    _check(board, variant)
    # [U] the CV zones are observed failing on JP6 only; the JP5 tree assumes the same.
    return tuple("devices/virtual/thermal/thermal_zone%d/temp" % i
                 for i, (_, temp) in enumerate(_THERMAL[board]) if temp is None)

