#!/usr/bin/env python3
"""The board lab: the agent installed and run on the boards' own arm64 userland, under emulation.

``make board-lab`` (``python boardlab/lab.py``), for each target of ``targets.TARGETS``
(Raspberry Pi OS bookworm / Debian 12 with Python 3.11; Debian 11 bullseye with Python 3.9):

1. the target's Debian arm64 root folder, built once with ``debootstrap --foreign`` and its
   second stage under qemu-user (``rootfs.py``, cached in ``.board-cache/``), copied afresh for
   the run so every install starts from the clean suite;
2. its wheelhouse and the board install script from ``make dist TARGETS=<target>``
   (``wheelhouse.py``);
3. the install script run inside the copy as root under emulation with the network cut
   (``installer.py``: a fresh network namespace with only ``lo``, probed first);
4. the installed unit's ``ExecStart`` as its ``User=``, under emulation, against a coordinator and
   a mosquitto on this machine's loopback, for at least ``--rounds`` rounds on the fake sysfs tree
   of the target's board, stopped with SIGTERM, clocks compared (``run.py``);
5. ``systemd-analyze verify`` of the unit by the root's own systemd (``unit.py``).

It prints one JSON record per target (``record.py``), writes them with a markdown table to
``--out`` (default runs/boardlab/<time>/) and exits 1 when a target fails, 3 when the lab
cannot run here (not root, a tool missing: it says which and the apt line).
"""
import argparse
import json
import logging
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import emulation as emulation_mod  # noqa: E402
import installer  # noqa: E402
import record  # noqa: E402
import rootfs  # noqa: E402
import unit as unit_mod  # noqa: E402
import wheelhouse  # noqa: E402
from targets import BY_NAME, TARGETS, Target  # noqa: E402

log = logging.getLogger("boardlab")

CACHE = REPO / ".board-cache"
EXIT_PREREQUISITE = 3
#: Where the install script puts the venv (its default prefix), and so the venv's python.
VENV_PYTHON = "%s/venv/bin/python" % installer.PREFIX


def prerequisites(kind: str) -> List[str]:
    """What stops the lab before it starts: not root, a missing tool, no coordinator venv."""
    out = []
    if os.geteuid() != 0:
        out.append("root (debootstrap, chroot and network namespaces need it)")
    out += ["the program %s" % t for t in emulation_mod.missing_tools(kind)]
    if not (REPO / ".venv" / "bin" / "python").exists():
        out.append("the repository's .venv (make venv) for the coordinator")
    return out


def fresh_copy(cached_root: Path, work: Path) -> Path:
    """A copy of the cached root for one run (hard links would let the install edit the cache)."""
    if work.exists():
        subprocess.run(["rm", "-rf", str(work)], check=True)
    work.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", "--reflink=auto", str(cached_root), str(work)], check=True)
    return work


def lab_kit(folder: Path, target: Target, port: int) -> Path:
    """A board kit of the lab's own: the agent.yaml of the run (loopback broker, fake tree), which
    the install script puts in /etc/streamfl and which makes it enable the unit."""
    import yaml
    from run import agent_settings
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "agent.yaml").write_text(yaml.safe_dump(agent_settings(target, port, "/var/lib/streamfl-agent")))
    return folder


def free_port() -> int:
    from streamfl.sim.brokers import free_port as pick
    return pick("127.0.0.1")


def one_target(target: Target, args, emu, cache: rootfs.RootCache, root_info: Dict[str, Any],
               out: Path) -> Dict[str, Any]:
    """Steps 2 to 5 for one target: its record (not yet finished)."""
    folder = out / target.name
    folder.mkdir(parents=True, exist_ok=True)
    logf = folder / "lab.log"
    emu = emu.for_cpu(target.qemu_cpu)
    rec: Dict[str, Any] = {"target": target.name, "what": target.what, "emulation": emu.describe(),
                           "qemu_cpu": target.qemu_cpu,
                           "root": {k: root_info.get(k) for k in ("suite", "build_s", "first_stage_s",
                                                                  "cached", "built_at")}}
    phases: Dict[str, float] = {}
    rec["phase_s"] = phases
    if root_info.get("error"):
        rec["blocked"] = "root folder: %s" % root_info["error"]
        return rec
    given = dict(w.split("=", 1) for w in args.wheelhouse)
    if target.name in given:
        house = Path(given[target.name]).resolve()
        dist = {"wheelhouse": house, "script": wheelhouse.find_script(house, house.parent)}
    else:
        dist = wheelhouse.build(target, folder / "dist.log")
        phases["dist"] = dist.get("dist_s")
    if dist.get("blocked"):
        rec["blocked"] = dist["blocked"]
        return rec
    rec["wheelhouse"] = str(dist["wheelhouse"])
    t0 = time.monotonic()
    root = fresh_copy(cache.root(target), cache.folder(target) / "work")
    emu.prepare_root(root)
    phases["copy_root"] = round(time.monotonic() - t0, 1)
    rec["root_python"] = installer.root_python(emu, root, logf)
    rec["network"] = installer.network_probe(emu, root, cache.mirror, logf)
    port = free_port()
    kit = Path(args.kit) if args.kit else lab_kit(folder / "kit", target, port)
    rec.update(installer.install(emu, root, Path(dist["script"]), Path(dist["wheelhouse"]), kit, logf))
    phases["install"] = rec["install_s"]
    if rec["install_exit"] != 0:
        return rec
    kit_config = root / "etc/streamfl/agent.yaml"
    if args.kit and kit_config.is_file():  # its broker is not the lab's: kept aside for the run
        kit_config.rename(kit_config.with_name("agent.yaml.from-kit"))
    t0 = time.monotonic()
    rec.update(installer.import_probe(emu, root, VENV_PYTHON, logf))
    phases["import_probe"] = round(time.monotonic() - t0, 1)
    unit = unit_mod.find_unit(root)
    if unit is None:
        rec["failures"] = ["the install left no %s in the root" % unit_mod.UNIT_NAME]
        return rec
    # lexists: the link names its target inside the root (/etc/...), which the host lacks
    rec["unit_enabled"] = os.path.lexists(str(root / "etc/systemd/system/multi-user.target.wants"
                                              / unit_mod.UNIT_NAME))
    t0 = time.monotonic()
    rec.update(unit_mod.verify(emu, root, unit, logf))
    phases["unit_verify"] = round(time.monotonic() - t0, 1)
    from run import AgentRun
    t0 = time.monotonic()
    try:
        rec.update(AgentRun(target, root, emu, unit, folder / "run", REPO / ".venv" / "bin" / "python",
                            args.rounds, args.run_timeout_s, port).run())
    except Exception as exc:  # noqa: BLE001 - the record says what broke
        log.exception("%s: the agent run broke", target.name)
        rec.setdefault("failures", []).append("the agent run broke: %s" % exc)
    phases["agent_run"] = round(time.monotonic() - t0, 1)
    rec["notes"] = ["the agent ran by the unit's ExecStart as its User= in a chroot, not under "
                    "systemd: the unit's sandboxing (ProtectSystem=, ReadWritePaths=, "
                    "CapabilityBoundingSet=) was verified, not applied",
                    "agent_rss_mib is the peak resident memory of the emulated process, qemu's "
                    "own and its translated code included"]
    return rec


def parse(argv: List[str]):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--targets", default=",".join(t.name for t in TARGETS),
                   help="comma-separated targets (default: all): %s" % ", ".join(BY_NAME))
    p.add_argument("--rounds", type=int, default=5,
                   help="rounds the agent must have aggregated (at least 3; 5 give the per-round "
                        "medians something to take the middle of)")
    p.add_argument("--run-timeout-s", type=float, default=1800.0,
                   help="longest the agent may take for its rounds under emulation")
    p.add_argument("--wheelhouse", action="append", default=[], metavar="TARGET=DIR",
                   help="a wheelhouse built elsewhere for TARGET, instead of make dist")
    p.add_argument("--kit", help="a board kit folder (streamfl provision) to hand to the install "
                   "script instead of the lab's own; its agent.yaml is set aside for the run, which "
                   "needs the lab's broker")
    p.add_argument("--emulation", choices=("auto", "binfmt", "proot"), default="auto")
    p.add_argument("--mirror", help="Debian archive for debootstrap (default: the one apt uses here)")
    p.add_argument("--roots-only", action="store_true", help="build (or check) the cached roots, then stop")
    p.add_argument("--cache", default=str(CACHE), help="where the roots are kept (default .board-cache/)")
    p.add_argument("--out", default=None, help="results folder (default runs/boardlab/<time>)")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    args.names = [n for n in args.targets.split(",") if n]
    unknown = [n for n in args.names if n not in BY_NAME]
    if unknown:
        p.error("unknown target(s) %s; known: %s" % (", ".join(unknown), ", ".join(BY_NAME)))
    for w in args.wheelhouse:
        if "=" not in w or w.split("=", 1)[0] not in BY_NAME:
            p.error("--wheelhouse takes TARGET=DIR with TARGET one of %s" % ", ".join(BY_NAME))
    if args.rounds < 3:
        p.error("--rounds must be at least 3 (what the lab is there to show)")
    args.out = Path(args.out or REPO / "runs" / "boardlab" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s boardlab %(levelname)s %(message)s")
    missing = prerequisites(args.emulation)
    if missing:
        print(json.dumps({"summary": "board lab cannot run here", "missing": missing,
                          "install": emulation_mod.APT_HINT}), flush=True)
        return EXIT_PREREQUISITE
    try:
        emu = emulation_mod.detect(args.emulation)
    except emulation_mod.EmulationUnavailable as exc:
        print(json.dumps({"summary": "board lab cannot run here", "missing": [str(exc)]}), flush=True)
        return EXIT_PREREQUISITE
    started = time.monotonic()
    targets = [BY_NAME[n] for n in args.names]
    cache = rootfs.RootCache(Path(args.cache).resolve(), emu, args.mirror)

    def root_of(target: Target) -> Dict[str, Any]:
        try:
            return cache.ensure(target)
        except Exception as exc:  # noqa: BLE001 - that target is blocked, the others go on
            log.exception("%s: no root folder", target.name)
            return {"error": str(exc)}
    # the first stage is downloads: both roots at once
    with ThreadPoolExecutor(len(targets)) as pool:
        roots = dict(zip([t.name for t in targets], pool.map(root_of, targets)))
    if args.roots_only:
        print(json.dumps({"summary": "board lab roots", "roots": roots}, default=str), flush=True)
        return 1 if any(r.get("error") for r in roots.values()) else 0
    args.out.mkdir(parents=True, exist_ok=True)
    records = []
    for target in targets:  # one at a time: two emulated agents on 2 cores would time each other
        try:
            rec = one_target(target, args, emu, cache, roots[target.name], args.out)
        except Exception as exc:  # noqa: BLE001 - that target fails, the others go on
            log.exception("%s broke", target.name)
            rec = {"target": target.name, "emulation": emu.describe(), "failures": ["the lab broke: %s" % exc]}
        rec = record.finish(rec, args.rounds, target.python)
        records.append(rec)
        print(json.dumps(rec, default=str), flush=True)
    summary = {"summary": "board lab", "targets": len(records),
               "passed": sum(1 for r in records if r["ok"]),
               "failed": [r["target"] for r in records if not r["ok"]],
               "duration_s": round(time.monotonic() - started, 1), "out": str(args.out)}
    (args.out / "results.json").write_text(json.dumps({"summary": summary, "records": records},
                                                      indent=1, default=str) + "\n")
    (args.out / "table.md").write_text(record.table(records) + "\n")
    print(json.dumps(summary), flush=True)
    return 0 if not summary["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
