"""``streamfl-agent dvfs status|restore|probe``: look at this board's clocks, put them back, or
measure them (``probe``: seconds per sample and watts per level, see ``streamfl.agent.dvfs_probe``).

``restore`` is what the systemd unit runs as ``ExecStopPost``: after a SIGKILL, an OOM kill or a
crash, it writes back the settings the agent saved before its first clock change. It needs no
broker, no model and no torch, only the state folder and the sysfs root, and
exits 0 when nothing was saved.
"""
import argparse
import logging
import sys
from pathlib import Path
from typing import List, Mapping, Optional, Tuple

from streamfl.agent.cli_common import default_state_dir, fail
from streamfl.config import build, given_flags, load_with_flags, merge, read_yaml
from streamfl.dvfs.config import DvfsConfig
from streamfl.errors import ConfigError, StreamflError
from streamfl.logs import setup_logging

log = logging.getLogger("streamfl.agent.dvfs_cli")

PROG = "streamfl-agent dvfs"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Inspect, restore or probe this board's clocks.")
    p.add_argument("action", choices=["status", "restore", "probe"],
                   help="status: board, domains, levels, power; restore: put back saved clocks; "
                        "probe: time training and measure watts at each level")
    p.add_argument("--config", type=Path, help="agent YAML file (its state_dir and dvfs section)")
    p.add_argument("--state-dir", type=Path, help="the agent's state folder")
    p.add_argument("--sysfs-root", help="where sysfs is mounted (dvfs.sysfs_root, default /sys)")
    p.add_argument("--board", help="board profile name (dvfs.board; default: detect)")
    p.add_argument("--out", type=Path, help="probe: profile file (default <state-dir>/dvfs-probe.yaml)")
    p.add_argument("--steps", type=int, default=5, help="probe: timed training steps per level")
    p.add_argument("--domain", action="append",
                   help="probe: a domain to step (repeat for several, stepped together; default: "
                        "the GPU, else every CPU domain)")
    p.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"])
    return p


#: Each flag's argparse ``dest`` -> the agent config key it overrides.
FLAG_KEYS = {"state_dir": "state_dir", "sysfs_root": "dvfs.sysfs_root", "board": "dvfs.board"}


def main(argv: Optional[List[str]] = None, environ: Optional[Mapping[str, str]] = None) -> int:
    """Run one action; exit 0 on success, 1 on a hardware error, 2 on a configuration error."""
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, environ=environ)
    if args.action == "restore":
        return _restore_action(args)
    from streamfl.agent.config import load_agent_config
    try:
        cfg = load_with_flags(lambda overrides: load_agent_config(args.config, overrides),
                              given_flags(args, FLAG_KEYS))
    except ConfigError as exc:
        return fail(exc, ConfigError.exit_code)
    state_dir = cfg.state_dir or default_state_dir()
    try:
        if args.action == "probe":
            from streamfl.agent.dvfs_probe import run_probe
            return run_probe(cfg, state_dir, args.out, args.steps, args.domain)
        return _status(cfg, state_dir)
    except ConfigError as exc:
        return fail(exc, ConfigError.exit_code)
    except StreamflError as exc:
        return fail(exc, 1)


def _restore_action(args: argparse.Namespace) -> int:
    """``restore``: from the flags, the file's ``state_dir`` and its ``dvfs`` section only."""
    try:
        sysfs_root, state_dir = _restore_paths(args)
    except ConfigError as exc:
        # A config edited into something broken must not keep a killed agent's board throttled:
        # restore needs only the state folder and the sysfs root, which the flags can give.
        log.warning("%s; restoring from --state-dir/--sysfs-root (or their defaults) instead", exc)
        sysfs_root, state_dir = args.sysfs_root or "/sys", args.state_dir
    try:
        return _restore(sysfs_root, state_dir or default_state_dir())
    except StreamflError as exc:
        return fail(exc, 1)


def _restore_paths(args: argparse.Namespace) -> Tuple[str, Optional[Path]]:
    """The sysfs root and the state folder (None: the default), read without building the whole
    agent config: that loads the models and torch, which a board being restored may lack the
    memory or the time for (the systemd unit runs this as ExecStopPost)."""
    data = read_yaml(args.config) if args.config else {}
    source = str(args.config) if args.config else "defaults"
    section = data.get("dvfs") or {}
    if not isinstance(section, dict):
        raise ConfigError("%s: key 'dvfs': expected a mapping, got %r" % (source, section))
    dvfs = build(DvfsConfig, merge(section, {"sysfs_root": args.sysfs_root, "board": args.board}),
                 "%s: key 'dvfs'" % source)
    state_dir = args.state_dir or data.get("state_dir")
    if state_dir is not None and not isinstance(state_dir, (str, Path)):
        raise ConfigError("%s: key 'state_dir': expected a path, got %r" % (source, state_dir))
    return dvfs.sysfs_root, Path(state_dir) if state_dir is not None else None


def _restore(sysfs_root: str, state_dir: Path) -> int:
    from streamfl.dvfs.guard import restore_saved
    from streamfl.dvfs.sysfs_io import SysfsFiles
    restored = restore_saved(state_dir, SysfsFiles(Path(sysfs_root)))
    if restored is None:
        print("nothing to restore: no saved clock settings in %s" % state_dir)
    else:
        print("restored: %s" % ", ".join(restored))
    return 0


def _status(cfg, state_dir: Path) -> int:
    from streamfl.dvfs.factory import board_profile, describe, make_backend, make_meter
    from streamfl.dvfs.guard import SAVED_FILE
    from streamfl.dvfs.sysfs_io import SysfsFiles
    from streamfl.dvfs.thermal import read_temperatures_c
    dcfg = cfg.dvfs
    profile = board_profile(dcfg) if dcfg.backend != "none" else None
    backend = make_backend(dcfg, profile)
    out = ["board: %s" % (profile.name if profile else "none"),
           "backend: %s (mode %s, policy %s)" % (backend.kind, dcfg.mode, dcfg.policy)]
    out += ["  %s" % line for line in describe(backend)]
    for dom in backend.domains:
        governor_file = getattr(dom, "directory", None)
        if governor_file:
            attr = "scaling_governor" if dom.kind == "cpu" else "governor"
            try:
                out.append("  %s governor: %s" % (dom.name, dom.io.read("%s/%s" % (dom.directory, attr))))
            except StreamflError as exc:
                out.append("  %s governor: unreadable (%s)" % (dom.name, exc))
    meter = make_meter(dcfg, profile, backend, busy=lambda: False)
    try:
        out.append("power now: %.2f W (%s meter; rails: %s)" % (
            meter.total_w(), meter.kind, ", ".join(meter.rails) or "none"))
    except StreamflError as exc:
        out.append("power now: unreadable (%s)" % exc)
    finally:
        meter.close()
    if dcfg.backend == "sysfs":
        temps = read_temperatures_c(SysfsFiles(Path(dcfg.sysfs_root)))
        out.append("temperatures: %s" % (", ".join("%s %.1f C" % kv for kv in sorted(temps.items()))
                                         or "none readable"))
    if profile is not None and profile.name.startswith("jetson"):
        from streamfl.dvfs.jtop_status import read_jtop
        seen = read_jtop()
        out.append("jtop: %s" % ("not installed or not running" if seen is None else
                                 ", ".join("%s %s" % kv for kv in sorted(seen.items()))))
    saved = Path(state_dir) / SAVED_FILE
    out.append("saved original clocks: %s" % (saved if saved.exists() else "none (clocks untouched)"))
    sys.stdout.write("\n".join(out) + "\n")
    return 0
