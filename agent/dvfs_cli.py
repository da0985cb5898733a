"""``streamfl-agent dvfs status|restore|probe``: look at this board's clocks, put them back, or
measure them (``probe``: seconds per sample and watts per level, see ``streamfl.agent.dvfs_probe``).

``status`` beside a running agent shows what that agent has set, from the clock record it keeps
in its state folder (``streamfl.agent.dvfs_state``), and says so, naming its pid; without one it
shows the backend as this command sees it. A simulated backend's clocks exist only inside the
agent, so without a running agent status shows their ladders and no current level, never a fresh
board's top levels as if an agent ran there. Power is printed only from a meter that measures
(INA3221 rails through hwmon, IIO or jtop, the Pi 5 PMIC, RAPL): with the modeled meter or none it
says "no measured power on this board". Choice: the model's figure is not shown at all, since
the watts an idle board's model gives are a constant the profile's author wrote down, not the
board; ``dvfs probe`` measures watts where a meter exists.

``restore`` is what the systemd unit runs as ``ExecStopPost``: after a SIGKILL, an OOM kill or a
crash, it writes back the settings the agent saved before its first clock change. It needs no
broker, no model and no torch, only the state folder and the sysfs root, and
exits 0 when nothing was saved.
"""
import argparse
import logging
import sys
from pathlib import Path
import time
from typing import List, Mapping, Optional, Sequence, Tuple

from streamfl.agent.cli_common import SYSTEM_STATE_DIR, default_state_dir, fail
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
    p.add_argument("--board", help="board profile name, or auto (the config's board; default: "
                                   "detect)")
    p.add_argument("--out", type=Path, help="probe: profile file (default <state-dir>/dvfs-probe.yaml)")
    p.add_argument("--steps", type=int, default=5, help="probe: timed training steps per level")
    p.add_argument("--domain", action="append",
                   help="probe: a domain to step (repeat for several, stepped together; default: "
                        "the GPU, else every CPU domain)")
    p.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"])
    return p


#: Each flag's argparse ``dest`` -> the agent config key it overrides.
FLAG_KEYS = {"state_dir": "state_dir", "sysfs_root": "dvfs.sysfs_root", "board": "board"}


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
        return _status(cfg, [state_dir] if cfg.state_dir else _state_dirs(state_dir))
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
    dvfs = build(DvfsConfig, merge(section, {"sysfs_root": args.sysfs_root}),
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


def _state_dirs(default: Path) -> List[Path]:
    """Where an agent's clock record may be when no state folder is given: this user's default,
    then the system service's and the per-user one (a user who cannot write /var/lib still reads
    the service's record there)."""
    out: List[Path] = []
    for path in (default, SYSTEM_STATE_DIR, Path.home() / ".local" / "state" / "streamfl-agent"):
        if path not in out:
            out.append(path)
    return out


def _find_record(state_dirs: Sequence[Path]):
    """(state folder, record, problems): the first folder whose record's writer still runs, else
    the first with any record, else the first folder and None; a record that cannot be read is
    reported among the problems, not fatal."""
    from streamfl.agent.dvfs_state import read_record
    found = []
    problems = []
    for path in state_dirs:
        try:
            record = read_record(path)
        except StreamflError as exc:
            problems.append(str(exc))
            continue
        if record is not None:
            found.append((path, record))
    live = [(path, rec) for path, rec in found if rec.alive()]
    chosen = (live or found or [(state_dirs[0], None)])[0]
    return chosen[0], chosen[1], problems


def _ago(time_s: float) -> str:
    """A record's time, in UTC and as an age."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(time_s))
    return "%s, %.0f s ago" % (stamp, max(0.0, time.time() - time_s))


def record_lines(record) -> List[str]:
    """What the clock record says: who set the clocks, and each domain's MHz and level."""
    who = "%s pid %d" % (record.owner, record.pid)
    head = ("clocks set by the running %s (backend %s, policy %s, mode %s, board %s; recorded %s):"
            % (who, record.backend, record.policy, record.mode, record.board or "unknown",
               _ago(record.time_s)))
    if not record.alive():
        how = "stopped cleanly" if not record.running else "ended without a clean stop"
        head = ("last clocks recorded by %s, which is not running (%s; backend %s, recorded %s):"
                % (who, how, record.backend, _ago(record.time_s)))
    lines = [head]
    for name, dom in sorted(record.domains.items()):
        lines.append("  %s %.0f MHz (level %d of 0..%d)" % (name, dom.mhz, dom.level, dom.levels - 1))
    if not record.domains:
        lines.append("  no clock domains (DVFS off)")
    if not record.alive() and record.backend == "simulated":
        lines.append("  (simulated clocks lived in that process's memory: they are gone)")
    return lines


def ladder_lines(backend) -> List[str]:
    """Each domain's ladder in MHz, without a current level (simulated clocks have none outside
    the agent that runs them)."""
    return ["  %s (%s): %d levels %.0f..%.0f MHz" % (
        dom.name, dom.kind, len(dom.levels_khz), dom.levels_khz[0] / 1000.0,
        dom.levels_khz[-1] / 1000.0) for dom in backend.domains]


def power_line(meter, simulated: bool) -> str:
    """Power now, only where a sensor measures it."""
    if simulated or not getattr(meter, "measured", True):
        if simulated:
            why = "simulated backend: its watts would be the board profile's power model"
        elif meter.kind == "modeled":
            why = ("the board profile's power model stands in for a sensor; its figure is an "
                   "estimate, not shown")
        else:
            why = "%s meter: no sensor found, or dvfs backend or meter none" % meter.kind
        return "power now: no measured power on this board (%s)" % why
    try:
        return "power now: %.2f W (%s meter, measured; rails: %s)" % (
            meter.total_w(), meter.kind, ", ".join(meter.rails) or "none")
    except StreamflError as exc:
        return "power now: unreadable (%s)" % exc


def _status(cfg, state_dirs: Sequence[Path]) -> int:
    """``status``: the board, what a running agent set (its clock record), this command's view of
    the backend, measured power, temperatures and any saved originals; exit code 0."""
    from streamfl.dvfs.factory import board_profile, describe, make_backend, make_meter
    from streamfl.dvfs.guard import SAVED_FILE
    from streamfl.dvfs.sysfs_io import SysfsFiles
    from streamfl.dvfs.thermal import read_temperatures_c
    dcfg = cfg.dvfs
    state_dir, record, problems = _find_record(state_dirs)
    profile = board_profile(dcfg) if dcfg.backend != "none" else None
    backend = make_backend(dcfg, profile)
    simulated = dcfg.backend == "simulated"
    out = ["board: %s" % (profile.name if profile else "none")]
    out += ["clock record: %s" % problem for problem in problems]
    if record is not None:
        out += record_lines(record)
    else:
        out.append("clocks set by an agent: none recorded in %s (no agent has run there)"
                   % ", ".join(str(p) for p in state_dirs))
    out.append("backend: %s (mode %s, policy %s)%s" % (
        backend.kind, dcfg.mode, dcfg.policy,
        ": this command's view of the kernel's clocks" if dcfg.backend == "sysfs" else ""))
    if simulated:
        running = record is not None and record.alive() and record.backend == "simulated"
        out.append("  simulated clocks exist only inside the agent that runs them; %s" % (
            "its levels are above" if running else
            "no agent runs them now (an agent starts them at the top level)"))
        out += ladder_lines(backend)
    else:
        out += ["  %s" % line for line in describe(backend)]
    for dom in backend.domains:
        governor_file = getattr(dom, "directory", None)
        if governor_file:
            attr = "scaling_governor" if dom.kind == "cpu" else "governor"
            try:
                out.append("  %s governor: %s" % (dom.name, dom.io.read("%s/%s" % (dom.directory, attr))))
            except StreamflError as exc:
                out.append("  %s governor: unreadable (%s)" % (dom.name, exc))
    if simulated:
        out.append(power_line(None, simulated=True))
    else:
        meter = make_meter(dcfg, profile, backend, busy=lambda: False)
        try:
            out.append(power_line(meter, simulated=False))
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
