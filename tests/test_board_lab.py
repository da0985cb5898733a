"""The board lab's pure parts (boardlab/): commands, the unit it runs, records, the clock check.

``make board-lab`` itself builds arm64 roots and runs them under qemu for most of an hour, so it
is not in the suite; this keeps its code from rotting: no emulation, no downloads, a few seconds.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAB = ROOT / "boardlab"
MODULES = ("targets", "emulation", "rootfs", "installer", "unit", "record", "run", "wheelhouse")
# The lab's modules have bare names (it is a folder of scripts, like field/), and so do other
# test helpers (tests/golden/record.py): imported here with the lab's folder first, then taken out
# of sys.modules again, so a test file collected after this one in the same process gets its own.
_SAVED = {n: sys.modules.pop(n) for n in MODULES if n in sys.modules}
sys.path.insert(0, str(LAB))

import emulation  # noqa: E402
import installer  # noqa: E402
import record  # noqa: E402
import rootfs  # noqa: E402
import run  # noqa: E402
import unit  # noqa: E402
import wheelhouse  # noqa: E402
from targets import BY_NAME, TARGETS  # noqa: E402

sys.path.remove(str(LAB))
for _name in MODULES:
    sys.modules.pop(_name, None)
sys.modules.update(_SAVED)

BOOKWORM = BY_NAME["rpios-bookworm-aarch64"]


def test_targets_are_the_issues_two_suites():
    assert [(t.suite, t.python) for t in TARGETS] == [("bookworm", "3.11"), ("bullseye", "3.9")]
    # a core without the ARMv8.1 atomics, as on a Pi 4: qemu's default has them
    assert all(t.qemu_cpu == "cortex-a72" for t in TARGETS)


def test_debootstrap_is_foreign_arm64_with_the_packages():
    argv = rootfs.debootstrap_argv("bookworm", Path("/c/root.partial"), "http://mirror.test/debian")
    assert argv[:3] == ["debootstrap", "--arch=arm64", "--foreign"]
    assert argv[-3:] == ["bookworm", "/c/root.partial", "http://mirror.test/debian"]
    include = next(a for a in argv if a.startswith("--include="))
    assert set(include.split("=", 1)[1].split(",")) >= {"python3", "systemd", "ca-certificates"}


def test_mirror_comes_from_apt_sources(tmp_path):
    deb822 = tmp_path / "debian.sources"
    deb822.write_text("Types: deb\nURIs: http://archive.test/debian\nSuites: bookworm\n\n"
                      "Types: deb\nURIs: http://archive.test/debian-security\n")
    assert rootfs.default_mirror([tmp_path / "missing", deb822]) == "http://archive.test/debian"
    legacy = tmp_path / "sources.list"
    legacy.write_text("# comment\ndeb [arch=amd64] http://other.test/debian/ bullseye main\n")
    assert rootfs.default_mirror([legacy]) == "http://other.test/debian"
    assert rootfs.default_mirror([tmp_path / "missing"]) == rootfs.FALLBACK_MIRROR


def test_a_cached_root_is_reused_only_for_the_same_packages(tmp_path):
    cache = rootfs.RootCache(tmp_path, emulation.Emulation("binfmt"), mirror="http://m.test/debian")
    assert cache.cached(BOOKWORM) is None  # nothing built
    (cache.folder(BOOKWORM) / "root.partial" / "usr/bin").mkdir(parents=True)
    cache.finish(BOOKWORM, 1.0, 2.0)
    assert cache.cached(BOOKWORM)["packages"] == list(rootfs.PACKAGES)
    stamp = cache.folder(BOOKWORM) / rootfs.STAMP
    stamp.write_text(stamp.read_text().replace('"systemd"', '"not-systemd"'))
    assert cache.cached(BOOKWORM) is None


def test_binfmt_command_cuts_the_network_and_keeps_one_process():
    root = Path("/cache/bookworm-arm64/work")
    emu = emulation.Emulation("binfmt", "test")
    argv = emu.command(root, ["sh", "/mnt/x/install_board.sh"],
                       [emulation.Bind("/host/house", "/mnt/streamfl-wheelhouse")], net_cut=True)
    assert argv[:5] == ["unshare", "--mount", "--propagation", "private", "--net"]
    script = argv[-1]
    assert script.splitlines()[-1].startswith("exec chroot /cache/bookworm-arm64/work env -i ")
    assert "ip link set lo up" in script
    assert "mount --bind /host/house /cache/bookworm-arm64/work/mnt/streamfl-wheelhouse" in script
    assert "mount -o remount,bind,ro /cache/bookworm-arm64/work/mnt/streamfl-wheelhouse" in script
    assert "QEMU_CPU" not in script  # qemu's default core unless a target names one
    # the agent's run: the host's network (its broker is on 127.0.0.1), as the unit's user, on
    # the target's core
    argv = emu.for_cpu("cortex-a72").command(root, ["/opt/streamfl/venv/bin/streamfl-agent"], user=(998, 997))
    assert "--net" not in argv[:5]
    assert "setpriv --reuid=998 --regid=997 --init-groups env -i" in argv[-1]
    assert " QEMU_CPU=cortex-a72 " in argv[-1]
    assert emu.for_cpu("cortex-a72").describe() == "binfmt (test, cpu cortex-a72)" and emu.cpu is None


def test_proot_command_when_binfmt_is_refused():
    argv = emulation.Emulation("proot").command(Path("/r"), ["python3", "-V"], net_cut=True)
    assert argv[:3] == ["unshare", "--net", "--"]
    assert "proot -0 -q qemu-aarch64-static -r /r" in argv[-1] and argv[-1].endswith("python3 -V")


def test_proot_drops_to_the_user_outside_and_signals_go_to_its_tracee():
    argv = emulation.Emulation("proot").command(Path("/r"), ["agent"], user=(998, 997))
    assert argv[:4] == ["setpriv", "--reuid=998", "--regid=997", "--clear-groups"]
    assert argv[4] == "proot" and "-0" not in argv  # -0 would fake root, not drop it
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert child.pid in emulation.children(os.getpid())
        assert emulation.Emulation("binfmt").program_pid(1234) == 1234
    finally:
        child.kill()
        child.wait()


def test_binfmt_entry_is_read(tmp_path):
    (tmp_path / "qemu-aarch64").write_text("enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\n"
                                           "flags: PF\noffset 0\nmagic 7f454c46\n")
    assert emulation.binfmt_flags(tmp_path / "qemu-aarch64") == (
        True, "/usr/libexec/qemu-binfmt/aarch64-binfmt-P", "PF")
    assert emulation.binfmt_flags(tmp_path / "nothing") is None


def test_install_runs_the_script_on_the_bound_wheelhouse():
    argv = installer.install_argv("install_board.sh", kit=False)
    assert argv == ["sh", "/mnt/streamfl-install/install_board.sh", "--wheelhouse",
                    "/mnt/streamfl-wheelhouse", "--prefix", "/opt/streamfl", "--python", "python3"]
    assert "--kit" in installer.install_argv("install_board.sh", kit=True)


def test_the_shipped_unit_is_read_as_systemd_would():
    u = unit.parse_unit((ROOT / "systemd" / unit.UNIT_NAME).read_text(), "/etc/systemd/system/x")
    assert u.user != "root" and u.exec_start[0].endswith("streamfl-agent")
    assert u.option("--config") == "/etc/streamfl/agent.yaml"
    assert u.state_directory and u.environment.get("PYTHONUNBUFFERED") == "1"
    assert unit.verify_argv(u) == ["systemd-analyze", "verify", "/etc/systemd/system/x"]
    u = unit.parse_unit("[Service]\nExecStart=-/bin/a --config=/c.yaml\nExecStart=/bin/b\n", "/u")
    assert u.exec_start == ["/bin/b"] and u.user == "root" and u.state_directory is None
    with pytest.raises(ValueError):
        unit.parse_unit("[Unit]\nDescription=x\n", "/u")


def test_clocks_restored_on_a_fake_tree(tmp_path):
    from streamfl.dvfs.fake.tree import build_tree
    tree = tmp_path / "sys"
    build_tree(tree, BOOKWORM.board)
    before = run.tree_files(tree)
    assert before and run.clocks_restored(before, run.tree_files(tree))["clocks_restored"]
    path = next(p for p in sorted(tree.rglob("scaling_max_freq")) if p.is_file())
    old = path.read_text()
    path.write_text("600000\n")
    rec = run.clocks_restored(before, run.tree_files(tree))
    assert rec["clocks_restored"] is False and rec["clocks_not_restored"] == [str(path.relative_to(tree))]
    path.write_text(old)
    assert run.clocks_restored(before, run.tree_files(tree))["clocks_restored"]
    assert run.clocks_restored({}, {})["clocks_restored"] is False  # nothing compared proves nothing


def test_agent_settings_point_at_loopback_and_the_tree():
    cfg = run.agent_settings(BOOKWORM, 18830, "/var/lib/streamfl-agent")
    assert cfg["mqtt"]["host"] == "127.0.0.1" and cfg["mqtt"]["port"] == 18830
    assert cfg["dvfs"]["sysfs_root"] == run.TREE_IN_ROOT and cfg["dvfs"]["backend"] == "sysfs"
    assert cfg["board"] == BOOKWORM.board and cfg["sensor"]["kind"] == "synthetic"


def test_rounds_are_counted_from_the_coordinators_lines():
    lines = [{"event": "update", "device": "d", "aggregated": True, "num_samples": 100,
              "seconds_per_sample": 0.05, "wall_s": 10.0},
             {"event": "update", "device": "d", "aggregated": True, "num_samples": 100,
              "seconds_per_sample": 0.03, "wall_s": 16.0},
             {"event": "update", "device": "d", "aggregated": False, "num_samples": 100,
              "seconds_per_sample": 0.04, "wall_s": 20.0},
             {"event": "update", "device": "other", "aggregated": True, "wall_s": 11.0},
             {"event": "eval", "accuracy": 0.5}]
    got = run.rounds_of(lines, "d")
    assert got == {"rounds": 3, "aggregated": 2, "train_s_per_round": 4.0, "s_between_rounds": 6.0}


def _passing():
    return {"target": "t", "network": {"interfaces": ["lo"], "reached": False, "cut": True},
            "install_exit": 0, "python": "3.11.2", "aggregated": 3, "clocks_restored": True,
            "clocks_changed_while_running": True, "agent_exit": 0, "unit_verified": True}


def test_record_passes_and_fails_for_the_right_reasons():
    assert record.finish(_passing(), 3, "3.11")["ok"] is True
    for change, words in ((dict(aggregated=2), "2 of 3 rounds"),
                          (dict(clocks_restored=False, clocks_not_restored=["a"]), "clocks not restored"),
                          (dict(clocks_changed_while_running=False), "never changed a clock"),
                          (dict(network={"interfaces": ["lo", "eth0"], "cut": False}), "not cut off"),
                          (dict(unit_verified=False), "systemd-analyze"),
                          (dict(unit_enabled=False), "did not enable"),
                          (dict(qemu_cpu="cortex-a72", cpu_atomics=True), "did not emulate"),
                          (dict(python="3.9.2"), "not 3.11"),
                          (dict(install_exit=1), "exited 1")):
        rec = record.finish(dict(_passing(), **change), 3, "3.11")
        assert rec["ok"] is False and any(words in f for f in rec["failures"]), (change, rec["failures"])
    blocked = record.finish({"target": "t", "blocked": "no torch for cp39"}, 3)
    assert blocked["ok"] is False and blocked["failures"] == ["blocked: no torch for cp39"]
    assert list(record.finish(_passing(), 3))[:3] == ["target", "ok", "failures"]


def test_table_has_a_row_per_target():
    rows = record.table([record.finish(dict(_passing(), emulation="binfmt (qemu)"), 3),
                         record.finish({"target": "u", "blocked": "x"}, 3)]).splitlines()
    assert len(rows) == 4 and rows[2].startswith("| t | binfmt |") and rows[3].endswith("| no |")
    assert rows[0].count("|") == rows[2].count("|") == rows[3].count("|")


def test_wheelhouse_is_found_under_dist(tmp_path):
    house = tmp_path / "dist" / BOOKWORM.name / "wheelhouse"
    house.mkdir(parents=True)
    (house / "numpy-1.26.4-cp311-cp311-manylinux_2_17_aarch64.whl").write_text("")
    (tmp_path / "dist" / "other" ).mkdir()
    (tmp_path / "dist" / "other" / "x-1-py3-none-any.whl").write_text("")
    assert wheelhouse.find_wheelhouse(BOOKWORM, tmp_path / "dist") == house
    assert wheelhouse.find_wheelhouse(BY_NAME["debian-bullseye-aarch64"], tmp_path / "dist") is None
    (house.parent / wheelhouse.SCRIPT).write_text("#!/bin/sh\n")
    assert wheelhouse.find_script(house, tmp_path / "dist") == house.parent / wheelhouse.SCRIPT
