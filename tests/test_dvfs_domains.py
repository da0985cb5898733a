"""cpufreq and devfreq domains, the guard and restore, on every board's fake tree and its kernel rules."""
import json
import os

import pytest

from streamfl.dvfs.base import DvfsError
from streamfl.dvfs.fake.kernel import FakeKernel
from streamfl.dvfs.fake.tree import FAKE_TREES, build_tree, legacy_limits
from streamfl.dvfs.guard import SAVED_FILE, DvfsGuard, restore_saved
from streamfl.dvfs.null import NullBackend
from streamfl.dvfs.simulated import SimulatedBackend, SimulatedDomain
from streamfl.dvfs.sysfs_io import SysfsFiles
from streamfl.dvfs.sysfs_backend import SysfsBackend
from streamfl.dvfs.detect import discover_generic
from streamfl.dvfs.factory import sysfs_backend
from streamfl.dvfs.profiles import load_profile
from streamfl.dvfs.thermal import read_temperatures_c
from streamfl.errors import StorageError

CPUFREQ = "devices/system/cpu/cpufreq"


def profile_for(board, variant, root):
    """The shipped profile a board with this tree would get (generic-linux: discovered)."""
    if board == "generic-linux":
        return discover_generic(root)
    if (board, variant) == ("jetson-orin-nano", "jp6"):     # the tree is of a JP6.2 Super kit
        return load_profile("jetson-orin-nano-super")
    return load_profile(board)


class Board(SysfsBackend):
    """A generated tree, its fake kernel, and the backend its board profile gives."""

    def __init__(self, root, board, variant, mode="cap"):
        build_tree(root, board, variant)
        self.root, self.name = root, board
        self.profile = profile_for(board, variant, root)
        io = FakeKernel(root, legacy_limits=legacy_limits(board, variant))
        backend = sysfs_backend(self.profile, io, root, mode)
        self.cpus = [d for d in backend.domains if d.kind == "cpu"]
        self.gpus = [d for d in backend.domains if d.kind == "gpu"]
        super().__init__(io, backend.domains)


#: What the kernel computes rather than stores: the frequency now, and files derived from it.
DERIVED = {"scaling_cur_freq", "cpuinfo_cur_freq", "cur_freq", "target_freq", "scaling_setspeed",
           "affected_cpus", "trans_stat", "time_in_state", "total_trans", "load"}


def tree_files(root):
    """Every stored setting of the tree (regular files, not the derived ones; links not followed)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(str(root)):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path) and name not in DERIVED:
                with open(path, "rb") as fh:
                    out[os.path.relpath(path, str(root))] = fh.read()
    return out


TREE_IDS = ["%s-%s" % t if t[1] else t[0] for t in FAKE_TREES]


@pytest.fixture(params=FAKE_TREES, ids=TREE_IDS)
def board(request, tmp_path):
    return Board(tmp_path / "sys", *request.param)


def test_every_board_has_cpu_domains_and_jetsons_a_gpu(board):
    assert board.cpus
    assert bool(board.gpus) == board.name.startswith("jetson")
    for dom in board.domains:
        levels = dom.levels_khz
        assert list(levels) == sorted(set(levels)) and levels[0] > 0
        assert levels[0] <= dom.current_khz() <= levels[-1]
    for gpu in board.gpus:
        assert 10000 < gpu.levels_khz[-1] < 5000000      # kHz, converted from Hz


@pytest.mark.parametrize("mode", ["cap", "pin"])
def test_each_level_is_reached_and_the_tree_restored_exactly(tmp_path, mode):
    for board_name, variant in FAKE_TREES:
        b = Board(tmp_path / board_name / (variant or "x"), board_name, variant, mode=mode)
        before = tree_files(b.root)
        saved = b.snapshot()
        for dom in b.domains:
            if mode == "pin" and board_name == "generic-linux":     # intel_pstate: no userspace
                with pytest.raises(DvfsError, match="use mode cap"):
                    dom.set_level(0)
                continue
            for level in (0, len(dom.levels_khz) // 2, len(dom.levels_khz) - 1):
                dom.set_level(level)
                assert dom.cap_khz() == dom.levels_khz[level], (board_name, dom.name, level)
                assert dom.current_level() == level
                assert dom.current_khz() <= dom.levels_khz[level]
                if mode == "pin":
                    assert dom.current_khz() == dom.levels_khz[level]
        assert b.restore(saved) == []
        assert tree_files(b.root) == before, (board_name, variant)


def test_capping_below_a_raised_minimum_works_on_every_kernel(board):
    for dom in board.cpus:
        mid = dom.levels_khz[len(dom.levels_khz) // 2]
        board.io.write(dom.directory + "/scaling_min_freq", str(mid))   # e.g. nvpmodel raised it
        saved = dom.snapshot()
        dom.set_level(0)                       # below the minimum: needs min lowered first on 4.9
        assert dom.cap_khz() == dom.levels_khz[0]
        dom.restore(saved)
        assert int(board.io.read(dom.directory + "/scaling_min_freq")) == mid
        assert int(board.io.read(dom.directory + "/scaling_max_freq")) == dom.levels_khz[-1]


def test_legacy_kernels_really_refuse_a_max_below_the_min(tmp_path):
    legacy = [t for t in FAKE_TREES if legacy_limits(*t)]
    assert legacy, "no 4.9-kernel tree to test against"
    b = Board(tmp_path / "sys", *legacy[0])
    dom = b.cpus[0]
    b.io.write(dom.directory + "/scaling_min_freq", str(dom.levels_khz[-1]))
    with pytest.raises(DvfsError) as err:
        b.io.write(dom.directory + "/scaling_max_freq", str(dom.levels_khz[0]))
    assert err.value.errno == 22


@pytest.mark.parametrize("board_name,variant", [t for t in FAKE_TREES if t[0].startswith("jetson")])
def test_pin_mode_needs_the_userspace_devfreq_governor(tmp_path, board_name, variant):
    b = Board(tmp_path / "sys", board_name, variant, mode="pin")
    gpu = b.gpus[0]
    listing = b.root / gpu.directory / "available_governors"
    offered = [g for g in listing.read_text().split() if g != "userspace"]
    os.chmod(str(listing), 0o644)
    listing.write_text(" ".join(offered) + "\n")       # a kernel built without the governor
    before = tree_files(b.root)
    with pytest.raises(DvfsError) as err:
        gpu.set_level(0)
    assert str(err.value) == ("gpu: mode pin needs the userspace governor, and this devfreq "
                              "device offers only %s; use mode cap" % " ".join(offered))
    assert tree_files(b.root) == before                  # nothing was written
    assert b.io.read(gpu.directory + "/governor") == "nvhost_podgov"


def test_out_of_range_level_is_an_index_error(board):
    dom = board.domains[0]
    with pytest.raises(IndexError):
        dom.set_level(len(dom.levels_khz))
    with pytest.raises(IndexError):
        dom.set_level(-1)


def test_guard_saves_before_the_first_write_and_restores_on_exit(tmp_path):
    b = Board(tmp_path / "sys", "jetson-orin-nano", FAKE_TREES[[t[0] for t in FAKE_TREES].index("jetson-orin-nano")][1])
    before = tree_files(b.root)
    state = tmp_path / "state"
    with DvfsGuard(b, state) as guard:
        assert not (state / SAVED_FILE).exists()
        guard.apply({"gpu": 0, b.cpus[0].name: 1})
        doc = json.loads((state / SAVED_FILE).read_text())
        assert {d["name"] for d in doc["domains"]} == {d.name for d in b.domains}
        assert b.domain("gpu").current_level() == 0
    assert not (state / SAVED_FILE).exists()
    assert tree_files(b.root) == before


def test_guard_restores_after_an_exception(tmp_path):
    b = Board(tmp_path / "sys", "raspberry-pi-4", "")
    before = tree_files(b.root)
    with pytest.raises(RuntimeError):
        with DvfsGuard(b, tmp_path / "state") as guard:
            guard.apply({"cpu0": 0})
            raise RuntimeError("training blew up")
    assert tree_files(b.root) == before


def test_a_crashed_run_is_restored_from_the_saved_file_by_a_later_process(tmp_path):
    for board_name, variant in FAKE_TREES:
        b = Board(tmp_path / board_name / (variant or "x"), board_name, variant)
        before = tree_files(b.root)
        state = tmp_path / "state" / board_name / (variant or "x")
        guard = DvfsGuard(b, state)
        guard.apply({d.name: 0 for d in b.domains})
        assert tree_files(b.root) != before
        # The process dies here (SIGKILL): nothing restores. Later, with plain file writes, as
        # ExecStopPost's `streamfl-agent dvfs restore` does:
        assert sorted(restore_saved(state, SysfsFiles(b.root))) == sorted(d.name for d in b.domains)
        assert tree_files(b.root) == before, (board_name, variant)
        assert not (state / SAVED_FILE).exists()
        assert restore_saved(state, SysfsFiles(b.root)) is None


def test_guard_changes_nothing_when_it_cannot_save(tmp_path):
    b = Board(tmp_path / "sys", "raspberry-pi-5", "")
    before = tree_files(b.root)
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state folder should be")
    with pytest.raises(DvfsError):
        DvfsGuard(b, blocker).apply({"cpu0": 0})
    assert tree_files(b.root) == before


def test_a_damaged_save_file_is_a_storage_error_and_is_kept(tmp_path):
    (tmp_path / SAVED_FILE).write_text("{not json")
    with pytest.raises(StorageError):
        restore_saved(tmp_path, SysfsFiles(tmp_path))
    assert (tmp_path / SAVED_FILE).exists()


def test_a_failed_restore_keeps_the_save_file_for_the_next_try(tmp_path):
    b = Board(tmp_path / "sys", "raspberry-pi-4", "")
    state = tmp_path / "state"
    DvfsGuard(b, state).apply({"cpu0": 0})
    with pytest.raises(DvfsError):
        restore_saved(state, SysfsFiles(tmp_path / "elsewhere"))     # the files are not there
    assert (state / SAVED_FILE).exists()


def test_an_unrestored_earlier_save_keeps_the_true_originals(tmp_path):
    """A run whose start-up restore failed must not save its predecessor's lowered clocks as the
    originals: the earlier file's values win, so the board still ends up untouched (4.9 kernel)."""
    b = Board(tmp_path / "sys", "jetson-nano", dict(FAKE_TREES)["jetson-nano"])
    before = tree_files(b.root)
    state = tmp_path / "state"
    DvfsGuard(b, state).apply({d.name: 0 for d in b.domains})        # run 1 is SIGKILLed here
    lowered = tree_files(b.root)
    assert lowered != before
    with DvfsGuard(b, state) as guard:                                # run 2: its restore failed
        guard.apply({b.gpus[0].name: 1})
    assert tree_files(b.root) == before
    assert not (state / SAVED_FILE).exists()


def test_an_unreadable_earlier_save_blocks_clock_changes(tmp_path):
    b = Board(tmp_path / "sys", "raspberry-pi-4", "")
    before = tree_files(b.root)
    state = tmp_path / "state"
    state.mkdir()
    (state / SAVED_FILE).write_text("{not json")
    with pytest.raises(DvfsError):
        DvfsGuard(b, state).apply({"cpu0": 0})
    assert tree_files(b.root) == before


@pytest.mark.parametrize("board_name", ["jetson-nano", "jetson-orin-nano"])
def test_restore_gets_through_a_cap_file_left_empty_by_a_kill(tmp_path, board_name):
    """A SIGKILL between truncate and write leaves an empty file on a fake tree; the restore
    must still put every setting back, through the kernel's write rules."""
    variant = dict(FAKE_TREES)[board_name]
    b = Board(tmp_path / "sys", board_name, variant)
    before = tree_files(b.root)
    state = tmp_path / "state"
    DvfsGuard(b, state).apply({d.name: 0 for d in b.domains})
    gpu_max = [p for p in before if p.endswith("max_freq") and "devfreq" in p][0]
    (b.root / gpu_max).write_bytes(b"")
    io = FakeKernel(b.root, legacy_limits=legacy_limits(board_name, variant))
    assert sorted(restore_saved(state, io)) == sorted(d.name for d in b.domains)
    assert tree_files(b.root) == before


def test_null_and_simulated_backends():
    assert NullBackend().domains == () and NullBackend().snapshot() == {}
    t = [0.0]
    sim = SimulatedBackend([SimulatedDomain("gpu", "gpu", [300000, 600000, 900000], clock=lambda: t[0])])
    guard = DvfsGuard(sim, None)
    t[0] = 5.0
    guard.apply({"gpu": 0})
    gpu = sim.domain("gpu")
    assert gpu.current_khz() == 300000 and gpu.history == [(0.0, 2), (5.0, 0)]
    t[0] = 9.0
    assert guard.restore() and gpu.current_level() == 2 and gpu.history[-1] == (9.0, 2)
    with pytest.raises(KeyError):
        sim.domain("cpu0")


def test_temperatures_skip_zones_that_answer_eagain(tmp_path):
    build_tree(tmp_path, "jetson-orin-nano", FAKE_TREES[[t[0] for t in FAKE_TREES].index("jetson-orin-nano")][1])
    zones = {}
    for entry in os.listdir(str(tmp_path / "class/thermal")):
        if entry.startswith("thermal_zone"):
            zones[(tmp_path / "class/thermal" / entry / "type").read_text().strip()] = entry
    eagain = ["class/thermal/%s/temp" % zones[k] for k in zones if k.startswith("cv")]
    temps = read_temperatures_c(FakeKernel(tmp_path, eagain_paths=eagain))
    assert temps and not any(k.startswith("cv") for k in temps)
    assert all(0.0 < v < 120.0 for v in temps.values())
    only = read_temperatures_c(FakeKernel(tmp_path), ["gpu-thermal"])
    assert list(only) == ["gpu-thermal"]
