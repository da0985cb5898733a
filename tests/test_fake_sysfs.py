"""The fake sysfs trees match the formats sysfs prints and the fake kernel applies its rules."""
import errno
import os
import stat
from pathlib import Path

import pytest

from streamfl.dvfs.base import DvfsError
from streamfl.dvfs.fake.kernel import FakeKernel
from streamfl.dvfs.fake.tree import FAKE_TREES, build_tree, legacy_limits, thermal_eagain_paths

GPU_TREES = [t for t in FAKE_TREES if t[0].startswith("jetson")]
CPU = "devices/system/cpu/"

#: Facts per tree, as seen on the boards: (policies, cpuinfo_max_freq kHz, real devfreq dir or None).
EXPECTED = {
    ("jetson-nano", "jp4"): (["policy0"], 1479000, "devices/57000000.gpu/devfreq/57000000.gpu"),
    ("jetson-xavier-nx", "jp4"): (["policy0", "policy2", "policy4"], 1907200,
                                  "devices/17000000.gv11b/devfreq/17000000.gv11b"),
    ("jetson-xavier-nx", "jp5"): (["policy0", "policy2", "policy4"], 1907200,
                                  "devices/platform/17000000.gv11b/devfreq/17000000.gv11b"),
    ("jetson-agx-orin", "jp5"): (["policy0", "policy4", "policy8"], 2201600,
                                 "devices/platform/17000000.ga10b/devfreq/17000000.ga10b"),
    ("jetson-agx-orin", "jp6"): (["policy0", "policy4", "policy8"], 2201600,
                                 "devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu"),
    ("jetson-orin-nano", "jp6"): (["policy0", "policy4"], 1728000,
                                  "devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu"),
    ("jetson-orin-nano", "jp5"): (["policy0", "policy4"], 1510400,
                                  "devices/platform/17000000.ga10b/devfreq/17000000.ga10b"),
    ("raspberry-pi-4", ""): (["policy0"], 1500000, None),
    ("raspberry-pi-5", ""): (["policy0"], 2400000, None),
    ("generic-linux", ""): (["policy0", "policy1", "policy2", "policy3"], 4200000, None),
}


def make(tmp_path, board, variant, **kwargs):
    root = tmp_path / "sys"
    build_tree(root, board, variant)
    return root, FakeKernel(root, legacy_limits=legacy_limits(board, variant), **kwargs)


@pytest.fixture(scope="module", params=FAKE_TREES, ids=lambda t: "-".join(filter(None, t)))
def built(request, tmp_path_factory):
    """One tree per board for the tests that only read it: (root, board, variant)."""
    board, variant = request.param
    root = tmp_path_factory.mktemp("sys")
    build_tree(root, board, variant)
    return root, board, variant


def errno_of(call, *args):
    with pytest.raises(DvfsError) as info:
        call(*args)
    return info.value.errno


def raw(root, rel):
    return (root / rel).read_bytes()


def mode(root, rel):
    return stat.S_IMODE(os.stat(str(root / rel)).st_mode)


def real(root, rel):
    """``rel`` with its symlinks resolved, relative to the root."""
    return os.path.relpath(os.path.realpath(str(root / rel)), os.path.realpath(str(root)))


def cpu_set(ranges):
    """``0,4-11`` as a set of CPU numbers."""
    out = set()
    for part in ranges.split(","):
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return out


def ints(kernel, rel):
    return [int(x) for x in kernel.read(rel).split()]


def test_every_tree_is_listed_with_its_facts():
    assert sorted(FAKE_TREES) == sorted(EXPECTED)


def test_tree_formats_match_the_reference(built):
    root, board, variant = built
    kernel = FakeKernel(root, legacy_limits(board, variant))
    policies, max_khz, devfreq = EXPECTED[(board, variant)]
    for dirpath, dirnames, filenames in os.walk(str(root)):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if path.is_symlink():
                target = os.readlink(str(path))
                assert not os.path.isabs(target), path
                assert path.exists() and str(path.resolve()).startswith(str(root.resolve()))
    assert kernel.listdir(CPU + "cpufreq") == policies
    table_driver = board != "generic-linux"
    for pol in policies:
        p = CPU + "cpufreq/%s/" % pol
        related = raw(root, p + "related_cpus")
        assert related.endswith(b"\n") and not related.endswith(b" \n")
        assert raw(root, p + "affected_cpus") == related
        for cpu in related.split():
            assert os.readlink(str(root / CPU / ("cpu%s/cpufreq" % cpu.decode()))) == \
                "../cpufreq/" + pol
        assert int(kernel.read(p + "cpuinfo_max_freq")) == max_khz  # kHz
        govs = raw(root, p + "scaling_available_governors")
        if table_driver:
            freqs = raw(root, p + "scaling_available_frequencies")
            assert freqs.endswith(b" \n") and govs.endswith(b" \n")  # "%u " then "\n"
            table = [int(f) for f in freqs.split()]
            assert table == sorted(table) and table[-1] == max_khz
            assert mode(root, p + "cpuinfo_cur_freq") == 0o400
            assert mode(root, p + "stats/reset") == 0o200
        else:
            assert govs == b"performance powersave\n"  # setpolicy branch: no trailing space
            assert not kernel.exists(p + "scaling_available_frequencies")
        for rw in ("scaling_governor", "scaling_min_freq", "scaling_max_freq", "scaling_setspeed"):
            assert mode(root, p + rw) == 0o644
        assert mode(root, p + "scaling_cur_freq") == 0o444
        assert kernel.read(p + "scaling_setspeed") == "<unsupported>"
    gpus = kernel.listdir("class/devfreq")
    if devfreq is None:
        assert gpus == []
    else:
        assert len(gpus) == 1 and real(root, "class/devfreq/" + gpus[0]) == devfreq
        freqs = raw(root, devfreq + "/available_frequencies")
        assert not freqs.endswith(b" \n")  # devfreq truncates the trailing space
        assert min(int(f) for f in freqs.split()) > 50000000  # Hz, not kHz
        assert kernel.read(devfreq + "/governor") == "nvhost_podgov"
        gpu = real(root, devfreq + "/device")
        assert raw(root, gpu + "/of_node/name") in (b"gpu\0", b"gv11b\0", b"ga10b\0")
        assert kernel.read(gpu + "/of_node/name").endswith("\0")
        assert 0 <= int(kernel.read(gpu + "/load")) <= 1000
        gpu0 = [r for r in ("devices/gpu.0", "devices/platform/bus@0/gpu.0") if kernel.exists(r)]
        assert gpu0 and real(root, gpu0[0]) == gpu
        assert kernel.exists(devfreq + "/name") == (variant != "jp4")
    drivers = kernel.listdir("bus/i2c/drivers")
    if variant == "jp4":
        assert drivers == ["ina3221x"]
        dev = "bus/i2c/drivers/ina3221x/" + kernel.listdir("bus/i2c/drivers/ina3221x")[0]
        io = dev + "/iio:device0/"
        assert kernel.read(io + "rail_name_0") in ("POM_5V_IN", "VDD_IN")
        assert int(kernel.read(io + "in_power0_input")) > 0  # mW
        assert kernel.read(io + "crit_current_limit_0").endswith(" ma")
    elif variant:
        assert drivers == ["ina3221"]
        dev = "bus/i2c/drivers/ina3221/" + kernel.listdir("bus/i2c/drivers/ina3221")[0]
        hwmon = dev + "/hwmon/" + kernel.listdir(dev + "/hwmon")[0] + "/"
        assert kernel.read(hwmon + "in7_label") == "sum of shunt voltages"
        assert 0 < int(kernel.read(hwmon + "in1_input")) < 20000  # mV
        assert not [f for f in kernel.listdir(hwmon) if f.startswith("power")]
    else:
        assert drivers == []
    rapl = "class/powercap/intel-rapl:0/"
    assert kernel.exists(rapl + "energy_uj") == (board == "generic-linux")
    if board == "generic-linux":
        assert kernel.read(rapl + "name") == "package-0"
        assert mode(root, rapl + "energy_uj") == 0o400
        assert kernel.read("class/powercap/intel-rapl:0:0/name") == "core"
    zones = kernel.listdir("class/thermal")
    assert zones and zones[0] == "thermal_zone0"
    eagain = thermal_eagain_paths(board, variant)
    for zone in zones:
        temp = "devices/virtual/thermal/%s/temp" % zone
        assert os.readlink(str(root / "class/thermal" / zone)) == \
            "../../devices/virtual/thermal/" + zone
        if temp in eagain:
            assert raw(root, temp) == b""
        else:
            assert 20000 <= int(kernel.read("class/thermal/%s/temp" % zone)) <= 110000  # m°C


def test_unknown_board_or_variant_names_the_known_ones(tmp_path):
    for board, variant in (("jetson-tx2", ""), ("jetson-nano", "jp6"), ("raspberry-pi-4", "jp4")):
        with pytest.raises(ValueError, match="jetson-agx-orin/jp5.*raspberry-pi-5"):
            build_tree(tmp_path, board, variant)
    with pytest.raises(ValueError, match="known"):
        legacy_limits("jetson-xavier-nx", "jp6")


@pytest.mark.parametrize("variant", ["jp4", "jp5"])
def test_xavier_nx_trees_follow_reference_8_2(tmp_path, variant):
    root, kernel = make(tmp_path, "jetson-xavier-nx", variant)
    jp5 = variant == "jp5"
    for pol in ("policy0", "policy2", "policy4"):
        assert kernel.read(CPU + "cpufreq/%s/scaling_driver" % pol) == \
            ("tegra194" if jp5 else "tegra_cpufreq")
    gpu = "devices/platform/17000000.gv11b" if jp5 else "devices/17000000.gv11b"
    links = ["devices/gpu.0", "class/devfreq/17000000.gv11b/device"]
    if jp5:  # nvgpu's links in the parent and grand-parent on kernels > 4.14
        links += ["devices/17000000.gv11b", "devices/platform/gpu.0"]
    for rel in links:
        assert real(root, rel) == gpu, rel
    assert real(root, "class/devfreq/17000000.gv11b") == gpu + "/devfreq/17000000.gv11b"
    assert raw(root, gpu + "/of_node/name") == b"gv11b\0"
    rails = ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"]
    if jp5:
        assert kernel.listdir("bus/i2c/drivers") == ["ina3221"]
        h = "bus/i2c/drivers/ina3221/7-0040/hwmon/hwmon4/"
        assert kernel.read(h + "name") == "ina3221"
        assert [kernel.read(h + "in%d_label" % n) for n in (1, 2, 3)] == rails
        assert kernel.read(h + "in7_label") == "sum of shunt voltages"
        for n in (1, 2, 3):
            assert int(kernel.read(h + "curr%d_input" % n)) > 0  # mA
            assert kernel.read(h + "curr%d_crit_alarm" % n) == kernel.read(
                h + "curr%d_max_alarm" % n) == "0"
    else:
        io = "bus/i2c/drivers/ina3221x/7-0040/iio:device0/"
        assert real(root, io.rstrip("/")) == "devices/c250000.i2c/i2c-7/7-0040/iio:device0"
        assert [kernel.read(io + "rail_name_%d" % n) for n in (0, 1, 2)] == rails


@pytest.mark.parametrize("board,variant", [t for t in FAKE_TREES if t[0].startswith("jetson")
                                           and t[1] != "jp4"])
def test_hwmon_sum_channel_only_where_summation_is_enabled(tmp_path, board, variant):
    """curr4_* exist only when no input has summation disabled; AGX Orin's 1-0040 has it on
    VIN_SYS_5V0, so that monitor has none."""
    root, kernel = make(tmp_path, board, variant)
    for addr in kernel.listdir("bus/i2c/drivers/ina3221"):
        dev = "bus/i2c/drivers/ina3221/%s/hwmon/" % addr
        h = dev + kernel.listdir(dev)[0] + "/"
        sums = sorted(f for f in kernel.listdir(h) if f.startswith("curr4"))
        if (board, addr) == ("jetson-agx-orin", "1-0040"):
            assert sums == []
            assert kernel.read(h + "in3_label") == "VIN_SYS_5V0"
        else:
            assert sums == ["curr4_crit", "curr4_crit_alarm", "curr4_input"], (board, addr)
            assert int(kernel.read(h + "curr4_input")) == sum(
                int(kernel.read(h + "curr%d_input" % n)) for n in (1, 2, 3))


@pytest.mark.parametrize("board,variant", FAKE_TREES)
def test_legacy_limits_only_on_jetpack_4(board, variant):
    assert legacy_limits(board, variant) == (variant == "jp4")


@pytest.mark.parametrize("board,variant", FAKE_TREES)
def test_cpufreq_governors_and_setspeed(tmp_path, board, variant):
    root, kernel = make(tmp_path, board, variant)
    p = CPU + "cpu0/cpufreq/"
    before = kernel.read(p + "scaling_governor")
    assert errno_of(kernel.write, p + "scaling_governor", "turbo") == errno.EINVAL
    assert errno_of(kernel.write, p + "scaling_governor", "\n") == errno.EINVAL
    assert kernel.read(p + "scaling_governor") == before
    assert errno_of(kernel.write, p + "scaling_setspeed", "1000000") == errno.EINVAL
    low, high = int(kernel.read(p + "cpuinfo_min_freq")), int(kernel.read(p + "cpuinfo_max_freq"))
    kernel.write(p + "scaling_governor", "performance\n")
    assert int(kernel.read(p + "scaling_cur_freq")) == high
    if board == "generic-linux":
        assert errno_of(kernel.write, p + "scaling_governor", "userspace") == errno.EINVAL
        kernel.write(p + "scaling_governor", "powersave")  # a policy: the CPU still scales
        assert low <= int(kernel.read(p + "scaling_cur_freq")) <= high
        return
    table = ints(kernel, p + "scaling_available_frequencies")
    assert int(kernel.read(p + "cpuinfo_cur_freq")) == high
    kernel.write(p + "scaling_governor", "powersave")
    assert int(kernel.read(p + "scaling_cur_freq")) == low == table[0]
    kernel.write(p + "scaling_governor", "userspace")
    assert kernel.read(p + "scaling_setspeed") == str(low)  # starts at policy->cur
    kernel.write(p + "scaling_setspeed", str(table[3] - 1))
    assert kernel.read(p + "scaling_setspeed") == str(table[3])  # lowest table freq >= request
    assert kernel.read(p + "scaling_cur_freq") == str(table[3])
    assert raw(root, p + "scaling_cur_freq") == b"%d\n" % table[3]  # plain readers see it too
    assert errno_of(kernel.write, p + "scaling_setspeed", "fast") == errno.EINVAL
    kernel.write(p + "scaling_max_freq", str(table[2]))  # limits re-target: max < setspeed
    assert kernel.read(p + "scaling_cur_freq") == str(table[2])
    kernel.write(p + "scaling_max_freq", str(high))  # the request comes back
    assert kernel.read(p + "scaling_cur_freq") == str(table[3])
    kernel.write(p + "scaling_setspeed", str(high * 2))  # clamped into [min, max]
    assert kernel.read(p + "scaling_setspeed") == str(high)
    kernel.write(p + "scaling_min_freq", str(table[-2]))
    kernel.write(p + "scaling_setspeed", "0")
    assert kernel.read(p + "scaling_cur_freq") == str(table[-2])
    kernel.write(p + "scaling_governor", "schedutil")
    assert kernel.read(p + "scaling_setspeed") == "<unsupported>"
    assert raw(root, p + "scaling_setspeed") == b"<unsupported>\n"
    assert errno_of(kernel.write, p + "scaling_setspeed", str(high)) == errno.EINVAL


@pytest.mark.parametrize("board,variant", FAKE_TREES)
def test_cpufreq_min_max_ordering_and_clamping(tmp_path, board, variant):
    root, kernel = make(tmp_path, board, variant)
    p = CPU + "cpufreq/policy0/"
    low, high = int(kernel.read(p + "cpuinfo_min_freq")), int(kernel.read(p + "cpuinfo_max_freq"))
    mid_low, mid_high = low + (high - low) // 4, low + (high - low) * 3 // 4
    kernel.write(p + "scaling_min_freq", str(mid_high))
    if legacy_limits(board, variant):  # 4.9: crossing is EINVAL, nothing changes
        assert errno_of(kernel.write, p + "scaling_max_freq", str(mid_low)) == errno.EINVAL
        assert kernel.read(p + "scaling_max_freq") == str(high)
        kernel.write(p + "scaling_min_freq", str(mid_low))  # lowering: min first, then max
        kernel.write(p + "scaling_max_freq", str(mid_low))
        assert errno_of(kernel.write, p + "scaling_min_freq", str(mid_high)) == errno.EINVAL
        kernel.write(p + "scaling_max_freq", str(high))  # raising: max first, then min
        kernel.write(p + "scaling_min_freq", str(mid_high))
        assert kernel.read(p + "scaling_min_freq") == str(mid_high)
        assert errno_of(kernel.write, p + "scaling_max_freq", "0") == errno.EINVAL
    else:  # freq-QoS: max wins, the min request returns when max is raised again
        kernel.write(p + "scaling_max_freq", str(mid_low))
        assert kernel.read(p + "scaling_max_freq") == str(mid_low)
        assert kernel.read(p + "scaling_min_freq") == str(mid_low)
        kernel.write(p + "scaling_max_freq", str(high))
        assert kernel.read(p + "scaling_min_freq") == str(mid_high)
        kernel.write(p + "scaling_min_freq", str(high * 2))  # clamped to cpuinfo, then to max
        assert kernel.read(p + "scaling_min_freq") == str(high)
        kernel.write(p + "scaling_max_freq", "0")
        assert kernel.read(p + "scaling_max_freq") == kernel.read(p + "scaling_min_freq") == \
            str(low)
        kernel.write(p + "scaling_max_freq", str(high))
    kernel.write(p + "scaling_min_freq", "1")  # outside cpuinfo: clamped
    assert kernel.read(p + "scaling_min_freq") == str(low)
    kernel.write(p + "scaling_max_freq", str(high * 2))
    assert kernel.read(p + "scaling_max_freq") == str(high)
    assert errno_of(kernel.write, p + "scaling_max_freq", "1.5 GHz") == errno.EINVAL
    assert errno_of(kernel.write, p + "scaling_max_freq", "-1") == errno.EINVAL
    # A dynamic governor keeps cur inside the limits.
    kernel.write(p + "scaling_governor", "powersave" if board == "generic-linux" else "ondemand")
    kernel.write(p + "scaling_max_freq", str(mid_low))
    assert low <= int(kernel.read(p + "scaling_cur_freq")) <= mid_low
    # Plain writes by another process: the kernel reads the files as they are.
    (root / p / "scaling_max_freq").write_text("%d\n" % low)
    (root / p / "scaling_governor").write_text("performance\n")
    assert kernel.read(p + "scaling_cur_freq") == str(low)
    kernel.write(p + "scaling_max_freq", str(high))
    assert kernel.read(p + "scaling_cur_freq") == str(high)


@pytest.mark.parametrize("board,variant", GPU_TREES)
def test_devfreq_userspace_and_limits(tmp_path, board, variant):
    root, kernel = make(tmp_path, board, variant)
    d = "class/devfreq/" + kernel.listdir("class/devfreq")[0] + "/"
    table = ints(kernel, d + "available_frequencies")
    legacy = legacy_limits(board, variant)
    bad = errno_of(kernel.write, d + "governor", "turbo")
    assert bad == (errno.ENODEV if legacy else errno.EINVAL)
    assert not kernel.exists(d + "userspace")
    assert errno_of(kernel.write, d + "userspace/set_freq", str(table[1])) == errno.ENOENT
    kernel.write(d + "governor", "userspace")
    assert kernel.read(d + "userspace/set_freq") == "undefined"
    assert kernel.read(d + "cur_freq") == str(table[0])
    kernel.write(d + "userspace/set_freq", str(table[2] - 1))
    assert kernel.read(d + "cur_freq") == str(table[2])
    kernel.write(d + "max_freq", str(table[1]))
    assert kernel.read(d + "cur_freq") == str(table[1])  # clamped to max_freq
    assert kernel.read(d + "userspace/set_freq") == str(table[2] - 1)  # shows the request
    assert errno_of(kernel.write, d + "userspace/set_freq", "max") == errno.EINVAL
    kernel.write(d + "governor", "userspace")  # same governor: the value stays
    assert kernel.read(d + "userspace/set_freq") == str(table[2] - 1)
    kernel.write(d + "governor", "performance")
    assert not kernel.exists(d + "userspace") and kernel.listdir(d + "userspace") == []
    assert kernel.read(d + "cur_freq") == str(table[1])
    kernel.write(d + "max_freq", str(table[-1]))
    assert kernel.read(d + "cur_freq") == kernel.read(d + "target_freq") == str(table[-1])
    kernel.write(d + "min_freq", str(table[-2]))
    if legacy:  # 4.9 devfreq: crossing is EINVAL, 0 means no limit and reads back as 0
        assert errno_of(kernel.write, d + "max_freq", str(table[1])) == errno.EINVAL
        kernel.write(d + "min_freq", "0")
        kernel.write(d + "max_freq", "0")
        assert kernel.read(d + "max_freq") == "0"
        assert kernel.read(d + "cur_freq") == str(table[-1])
        kernel.write(d + "max_freq", str(table[1]))
        kernel.write(d + "min_freq", str(table[1]))
        assert errno_of(kernel.write, d + "min_freq", str(table[2])) == errno.EINVAL
        kernel.write(d + "min_freq", "0")  # 0 skips the check: it means no limit
    else:  # QoS devfreq: max wins, the min request comes back, 0 is no limit, kHz rounding
        kernel.write(d + "max_freq", str(table[1]))
        assert kernel.read(d + "min_freq") == kernel.read(d + "max_freq") == str(table[1])
        kernel.write(d + "max_freq", "0")
        assert kernel.read(d + "max_freq") == str(table[-1])
        assert kernel.read(d + "min_freq") == str(table[-2])
        kernel.write(d + "min_freq", "0")
        assert kernel.read(d + "min_freq") == str(table[0])
        kernel.write(d + "max_freq", str(table[1] + 1))  # rounded up to the next kHz
        assert kernel.read(d + "max_freq") == str(table[1] + 1000)
        kernel.write(d + "min_freq", str(table[0] + 999))  # rounded down
        assert kernel.read(d + "min_freq") == str(table[0])
    kernel.write(d + "governor", "nvhost_podgov")  # a dynamic governor stays within limits
    assert table[0] <= int(kernel.read(d + "cur_freq")) <= table[1] + 1000
    assert errno_of(kernel.write, d + "available_frequencies", "1") == errno.EACCES


@pytest.mark.parametrize("board,variant", FAKE_TREES)
def test_permissions_and_missing_files(tmp_path, board, variant):
    root, kernel = make(tmp_path, board, variant)
    user = FakeKernel(root, legacy_limits(board, variant), as_root=False)
    p = CPU + "cpufreq/policy0/"
    if kernel.exists(p + "cpuinfo_cur_freq"):
        assert errno_of(user.read, p + "cpuinfo_cur_freq") == errno.EACCES
        assert int(kernel.read(p + "cpuinfo_cur_freq")) > 0
        assert errno_of(kernel.read, p + "stats/reset") == errno.EACCES  # 0200, root too
        (root / p / "stats/total_trans").write_text("7\n")
        kernel.write(p + "stats/reset", "1")
        assert kernel.read(p + "stats/total_trans") == "0"
    if board == "generic-linux":
        assert errno_of(user.read, "class/powercap/intel-rapl:0/energy_uj") == errno.EACCES
        assert int(kernel.read("class/powercap/intel-rapl:0/energy_uj")) > 0
    assert user.read(p + "scaling_max_freq") == kernel.read(p + "scaling_max_freq")
    assert errno_of(user.write, p + "scaling_max_freq", "0") == errno.EACCES
    os.chmod(str(root / p / "scaling_max_freq"), 0o664)  # what the udev rule does
    user.write(p + "scaling_max_freq", kernel.read(p + "cpuinfo_max_freq"))
    for read_only in ("scaling_cur_freq", "cpuinfo_max_freq", "related_cpus"):
        assert errno_of(kernel.write, p + read_only, "1") == errno.EACCES  # kernfs_fop_open
    assert errno_of(kernel.write, CPU + "online", "0-1") == errno.EACCES
    assert errno_of(kernel.write, p + "no_such_attr", "1") == errno.ENOENT
    assert errno_of(kernel.read, p + "no_such_attr") == errno.ENOENT
    assert errno_of(kernel.read, "../etc/passwd") == errno.ENOENT
    assert errno_of(kernel.read, CPU + "cpu0/cpufreq") == errno.EISDIR
    assert kernel.exists(CPU + "cpu0/cpufreq/scaling_governor")
    assert not kernel.exists(CPU + "cpu99")
    assert kernel.listdir(CPU + "nowhere") == []


@pytest.mark.parametrize("board,variant", FAKE_TREES)
def test_offline_cpus_make_a_policy_inactive(tmp_path, board, variant):
    root, kernel = make(tmp_path, board, variant)
    p = CPU + "cpufreq/policy0/"
    cpus = kernel.read(p + "related_cpus").split()
    for cpu in cpus[1:]:
        kernel.write(CPU + "cpu%s/online" % cpu, "0")
    assert kernel.read(p + "affected_cpus") == "0"
    assert raw(root, p + "affected_cpus") == b"0\n"
    every = {int(c) for pol in kernel.listdir(CPU + "cpufreq")
             for c in kernel.read(CPU + "cpufreq/%s/related_cpus" % pol).split()}
    assert cpu_set(kernel.read(CPU + "online")) == every - {int(c) for c in cpus[1:]}
    if board == "jetson-agx-orin":
        assert kernel.read(CPU + "online") == "0,4-11"
    kernel.write(CPU + "cpu0/online", "0")
    for attr in ("scaling_max_freq", "related_cpus", "scaling_setspeed"):
        assert errno_of(kernel.read, p + attr) == errno.EBUSY
    assert errno_of(kernel.write, p + "scaling_max_freq", "0") == errno.EBUSY
    assert errno_of(kernel.read, CPU + "cpu0/cpufreq/scaling_cur_freq") == errno.EBUSY
    others = [pol for pol in kernel.listdir(CPU + "cpufreq") if pol != "policy0"]
    for pol in others:
        assert kernel.read(CPU + "cpufreq/%s/scaling_governor" % pol)
    assert errno_of(kernel.write, CPU + "cpu0/online", "2") == errno.EINVAL
    kernel.write(CPU + "cpu0/online", "1")
    assert kernel.read(p + "affected_cpus") == "0"
    for cpu in cpus[1:]:
        kernel.write(CPU + "cpu%s/online" % cpu, "1")
    assert kernel.read(p + "affected_cpus") == " ".join(cpus)
    assert cpu_set(kernel.read(CPU + "online")) == every


def test_thermal_reads_that_raise_eagain(built):
    root, board, variant = built
    failing = thermal_eagain_paths(board, variant) or ("class/thermal/thermal_zone0/temp",)
    kernel = FakeKernel(root, legacy_limits(board, variant), eagain_paths=failing)
    assert (board == "jetson-orin-nano") == (len(failing) == 3)
    for path in failing:
        assert errno_of(kernel.read, path) == errno.EAGAIN
        zone = path.split("/")[-2]
        assert errno_of(kernel.read, "devices/virtual/thermal/%s/temp" % zone) == errno.EAGAIN
        assert kernel.read("devices/virtual/thermal/%s/type" % zone)


def test_read_strips_only_the_final_newline(tmp_path):
    root, kernel = make(tmp_path, "jetson-agx-orin", "jp6")
    p = CPU + "cpufreq/policy4/"
    assert kernel.read(p + "scaling_available_frequencies").endswith("2201600 ")
    assert kernel.read(p + "scaling_available_governors").endswith("schedutil ")
    gpu = "devices/platform/17000000.gpu/"
    assert kernel.read(gpu + "of_node/name") == "gpu\0"
    kernel.write(gpu + "railgate_enable", "0\n")
    assert raw(root, "devices/platform/bus@0/17000000.gpu/railgate_enable") == b"0\n"
    assert kernel.read(gpu + "power/control") == "auto"
    kernel.write(p + "scaling_max_freq", "1000000")
    build_tree(root, "jetson-agx-orin", "jp6")  # building again replaces files and links
    assert kernel.read(p + "scaling_max_freq") == "2201600"
    assert os.readlink(str(root / CPU / "cpu4/cpufreq")) == "../cpufreq/policy4"
