"""The DVFS and power contract suites (one per interface, every implementation): each
backend (sysfs cap, sysfs pin, simulated, null) and each meter (INA3221 IIO and hwmon, RAPL, Pi 5
PMIC, jtop, modeled, null) against every generated board tree it applies to, plus the profile
wiring."""
import math
import os

import pytest

from streamfl.dvfs.base import CPU, DvfsError
from streamfl.dvfs.config import DvfsConfig
from streamfl.dvfs.fake.jtop import jtop_source
from streamfl.dvfs.fake.kernel import FakeKernel
from streamfl.dvfs.fake.tree import FAKE_TREES, build_tree, legacy_limits
from streamfl.dvfs.factory import make_backend, make_meter
from streamfl.dvfs.limits import parse_levels
from streamfl.dvfs.power.base import PowerError
from streamfl.dvfs.power.energy import EnergyCounter
from streamfl.dvfs.power.factory import create_meter
from streamfl.dvfs.power.jtop import JtopMeter
from streamfl.dvfs.profiles import PROFILE_NAMES
from test_dvfs_domains import TREE_IDS, profile_for, tree_files
from test_power_meters import PMIC_CAPTURE

BACKENDS = ("sysfs-cap", "sysfs-pin", "simulated", "null")
METERS = ("ina3221-iio", "ina3221-hwmon", "rapl", "rpi5-pmic", "jtop", "modeled", "null")
#: Meters that find their sensor in the sysfs tree (the PMIC meter runs vcgencmd; jtop needs the
#: jetson-stats service, which no tree has: its stand-in reads the tree's INA3221 files).
TREE_METERS = ("ina3221-iio", "ina3221-hwmon", "rapl")
XAVIER_JP5 = ("jetson-xavier-nx", "jp5")


def tree_id(board, variant):
    return "%s-%s" % (board, variant) if variant else board


def backend_applies(board, kind):
    """Pin mode needs the userspace governor, which intel_pstate (generic-linux) lacks."""
    return not (kind == "sysfs-pin" and board == "generic-linux")


def meter_applies(board, variant, kind):
    """Which sensor each tree carries: INA3221 through IIO on JetPack 4 and
    hwmon on 5/6, RAPL on the x86 tree, the PMIC on the Pi 5, jtop on every Jetson (it reads either
    INA3221 driver); the model and null fit any board."""
    return {"ina3221-iio": variant == "jp4",
            "ina3221-hwmon": board.startswith("jetson") and variant != "jp4",
            "jtop": board.startswith("jetson"),
            "rapl": board == "generic-linux",
            "rpi5-pmic": board == "raspberry-pi-5"}.get(kind, True)


def expected_meter(board, variant, profile):
    """The meter a board with this tree should get: its profile's, except that Xavier NX on
    JetPack 5 has the hwmon driver where the (JetPack 4) profile names IIO."""
    return "ina3221-hwmon" if (board, variant) == XAVIER_JP5 else profile.power.meter


def tree_paths(root):
    """Every path of the tree (dirs, files, links): a governor's leftover folder shows up here."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(str(root)):
        for name in dirnames + filenames:
            out.add(os.path.relpath(os.path.join(dirpath, name), str(root)))
    return out


def all_bytes(root):
    """Every regular file's content, derived ones included: for backends that must not touch it."""
    out = {}
    for dirpath, _, filenames in os.walk(str(root)):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                with open(path, "rb") as fh:
                    out[path] = fh.read()
    return out


def make(kind, board, variant, root, clock):
    """The backend ``kind`` for this tree's board, built through the factory as the agent does."""
    profile = profile_for(board, variant, root)
    if kind.startswith("sysfs"):
        cfg = DvfsConfig(backend="sysfs", mode=kind.split("-")[1], sysfs_root=str(root))
        return make_backend(cfg, profile, io=FakeKernel(root, legacy_limits(board, variant)))
    return make_backend(DvfsConfig(backend="simulated" if kind == "simulated" else "none"),
                        profile, clock=clock)


# --- backends ------------------------------------------------------------------------------------

@pytest.mark.parametrize("board,variant,kind", [t + (k,) for t in FAKE_TREES for k in BACKENDS],
                         ids=["%s-%s" % (tree_id(*t), k) for t in FAKE_TREES for k in BACKENDS])
def test_backend_contract(tmp_path, board, variant, kind):
    root = tmp_path / "sys"
    build_tree(root, board, variant)
    t = [0.0]
    backend = make(kind, board, variant, root, lambda: t[0])
    profile = profile_for(board, variant, root)
    settings, paths, raw = tree_files(root), tree_paths(root), all_bytes(root)
    assert backend.kind == kind.split("-")[0]
    if kind == "null":
        assert backend.domains == () and backend.snapshot() == {} and backend.restore({}) == []
        assert all_bytes(root) == raw
        return
    # Every profile domain exists in every tree (test_profile_paths...), CPU policies first.
    assert [d.name for d in backend.domains] == sorted(
        (s.name for s in profile.domains), key=lambda n: (not n.startswith("cpu"), n))
    saved = backend.snapshot()
    pinned = kind in ("sysfs-pin", "simulated")
    for dom in backend.domains:
        levels = dom.levels_khz
        assert levels == tuple(sorted(set(levels))) == profile.domain(dom.name).levels_khz
        assert all(isinstance(f, int) for f in levels)
        assert 10000 <= levels[0] and levels[-1] <= 10000000, levels  # kHz, not Hz or MHz
        assert dom.kind == (CPU if dom.name.startswith("cpu") else "gpu")
        if not backend_applies(board, kind):
            with pytest.raises(DvfsError, match="use mode cap"):
                dom.set_level(0)
            continue
        for i in range(len(levels)):                    # 0 first (down from the top), then up
            t[0] += 1.0
            dom.set_level(i)
            assert dom.current_level() == i, (dom.name, i)
            assert dom.cap_khz() == levels[i]
            now = dom.current_khz()
            within = (now == levels[i]) if pinned else (levels[0] <= now <= levels[i])
            assert within, (dom.name, i, now)
            if kind == "simulated":
                assert dom.history[-1] == (t[0], i)      # stamped with the injected clock
        for bad in (len(levels), -1):
            with pytest.raises(IndexError):
                dom.set_level(bad)
            assert dom.current_level() == len(levels) - 1
    assert backend.restore(saved) == []
    assert backend.snapshot() == saved
    if kind == "simulated":
        assert all_bytes(root) == raw                   # in memory: the tree is never touched
    else:                                               # settings back byte for byte, no leftovers
        assert tree_files(root) == settings
        assert tree_paths(root) == paths


# --- meters --------------------------------------------------------------------------------------

METER_CASES = [t + (k,) for t in FAKE_TREES for k in METERS if meter_applies(t[0], t[1], k)]


def _bump_rapl(root, uj):
    """Advance the top-level RAPL counters, as the package would while it draws power."""
    base = root / "class/powercap"
    for zone in os.listdir(str(base)):
        if zone.count(":") == 1:
            path = base / zone / "energy_uj"
            path.write_text("%d\n" % (int(path.read_text()) + uj))


@pytest.mark.parametrize("board,variant,kind", METER_CASES,
                         ids=["%s-%s" % (tree_id(b, v), k) for b, v, k in METER_CASES])
def test_meter_contract(tmp_path, board, variant, kind):
    root = tmp_path / "sys"
    build_tree(root, board, variant)
    profile = profile_for(board, variant, root)
    if kind == "modeled":
        backend = make("sysfs-cap", board, variant, root, lambda: 0.0)
        meter = make_meter(DvfsConfig(sysfs_root=str(root), meter="modeled"), profile, backend,
                           busy=lambda: True)
    elif kind == "jtop":
        meter = JtopMeter(source=jtop_source(root))
    else:
        meter = create_meter(kind, root, runner=lambda argv: PMIC_CAPTURE)
    assert meter.kind == kind
    rails = meter.rails
    assert isinstance(rails, tuple) and len(set(rails)) == len(rails)
    assert all(isinstance(r, str) and r for r in rails) and bool(rails) == (kind != "null")
    if kind.startswith("ina3221") and expected_meter(board, variant, profile) == kind:
        assert set(profile.power.rails) <= set(rails), (profile.power.rails, rails)
    if kind == "jtop":          # the same rails and watts as the sysfs meter of this tree
        assert set(profile.power.rails) <= set(rails), (profile.power.rails, rails)
        sysfs = create_meter("ina3221-iio" if variant == "jp4" else "ina3221-hwmon", root)
        assert meter.read_w() == pytest.approx(sysfs.read_w(), abs=1e-3)
        assert meter.total_w() == pytest.approx(sysfs.total_w(), abs=1e-3)
    for _ in range(2):          # RAPL: each read covers the time since the one before
        if kind == "rapl":
            _bump_rapl(root, 2000000)
        watts = meter.read_w()
        assert set(watts) == set(rails)
        assert all(isinstance(w, float) and math.isfinite(w) and w >= 0 for w in watts.values())
        if kind == "rapl":
            _bump_rapl(root, 2000000)
        total = meter.total_w()
        assert isinstance(total, (int, float)) and math.isfinite(total) and total >= 0
        assert (total > 0) == (kind != "null")
    meter.close()
    meter.close()               # idempotent


@pytest.mark.parametrize("board,variant", FAKE_TREES, ids=TREE_IDS)
def test_tree_meters_refuse_trees_without_their_sensor(tmp_path, board, variant):
    build_tree(tmp_path, board, variant)
    for kind in TREE_METERS:
        if not meter_applies(board, variant, kind):
            with pytest.raises(PowerError):
                create_meter(kind, tmp_path)


# --- profiles against trees ----------------------------------------------------------------------

def test_every_shipped_profile_has_a_fake_tree():
    covered = {profile_for(b, v, None).name for b, v in FAKE_TREES if b != "generic-linux"}
    assert covered | {"generic-linux"} == set(PROFILE_NAMES)


@pytest.mark.parametrize("board,variant", FAKE_TREES, ids=TREE_IDS)
def test_profile_paths_exist_and_levels_are_the_kernels(tmp_path, board, variant):
    build_tree(tmp_path, board, variant)
    profile = profile_for(board, variant, tmp_path)
    io = FakeKernel(tmp_path, legacy_limits=legacy_limits(board, variant))
    for spec in profile.domains:
        directory = spec.resolve(tmp_path)
        assert directory is not None, (spec.name, spec.paths)
        listing = directory + ("/scaling_available_frequencies" if spec.driver == "cpufreq"
                               else "/available_frequencies")
        if io.exists(listing):
            divisor = 1 if spec.driver == "cpufreq" else 1000
            assert parse_levels(io.read(listing), divisor) == tuple(spec.levels_khz), spec.name


@pytest.mark.parametrize("board,variant", FAKE_TREES, ids=TREE_IDS)
def test_the_profiles_meter_reads_this_tree_and_energy_adds_up(tmp_path, board, variant):
    build_tree(tmp_path, board, variant)
    profile = profile_for(board, variant, tmp_path)
    cfg = DvfsConfig(sysfs_root=str(tmp_path))
    backend = make_backend(cfg, profile, io=FakeKernel(tmp_path, legacy_limits(board, variant)))
    meter = make_meter(cfg, profile, backend, busy=lambda: True, runner=lambda argv: PMIC_CAPTURE)
    assert meter.kind == expected_meter(board, variant, profile)
    if meter.kind != "modeled":
        assert set(profile.power.rails) <= set(meter.rails), (profile.power.rails, meter.rails)
    t = [0.0]
    counter = EnergyCounter(meter, rate_hz=10.0, clock=lambda: t[0])
    for step in range(11):
        t[0] = step * 0.1
        counter.sample_once(t[0])
    watts = meter.total_w()
    if meter.kind == "rapl":       # energy counters: the tree's counter does not move
        assert watts == 0.0
    else:
        assert 0.5 < watts < 60.0, watts
        assert counter.joules_between(0.0, 1.0) == pytest.approx(watts, rel=1e-6)


def test_modeled_power_follows_the_clock_levels(tmp_path):
    build_tree(tmp_path, "raspberry-pi-4", "")
    profile = profile_for("raspberry-pi-4", "", tmp_path)
    cfg = DvfsConfig(sysfs_root=str(tmp_path), backend="simulated")
    backend = make_backend(cfg, profile)
    busy = [True]
    meter = make_meter(cfg, profile, backend, busy=lambda: busy[0])
    top = meter.total_w()
    backend.domain("cpu0").set_level(0)
    low = meter.total_w()
    busy[0] = False
    idle = meter.total_w()
    assert idle == pytest.approx(profile.power_model.idle_w) and idle < low < top
