"""Board detection: match /proc/device-tree/model against the shipped profiles.

A board no profile names (or a machine without a device tree) gets generic-linux, whose CPU
domains are discovered from cpufreq under the sysfs root, so any Linux box with cpufreq can be
throttled. Both roots are arguments so tests run against trees under tmp_path.
"""
import dataclasses
import errno
import logging
import re
from pathlib import Path
from typing import List, Optional, Tuple

from streamfl.dvfs.base import DvfsError
from streamfl.dvfs.profiles import (GENERIC, PROFILE_NAMES, BoardProfile, DomainSpec, PowerModel,
                                    PowerSpec, load_profile, model_watts, validate)

log = logging.getLogger(__name__)

CPUFREQ_DIR = "devices/system/cpu/cpufreq"
RAPL_DIR = "class/powercap"
#: Ladder step where a driver publishes no table (intel_pstate): 100 MHz, the granularity of
#: x86 P-state ratios on a 100 MHz bus clock and of the Raspberry Pi's OPPs.
LADDER_STEP_KHZ = 100000
#: [U] Extra watts of all discovered CPU policies together at their top level, shared equally
#: among them: a mid-range desktop or laptop package under an all-core load. Only the modeled
#: meter and the simulator use it; measure with ``streamfl-agent dvfs probe`` for real numbers.
GENERIC_CPU_TOP_W = 15.0

_POLICY_RE = re.compile(r"^policy(\d+)$")
_RAPL_RE = re.compile(r"^intel-rapl:(\d+)$")


def read_model(proc_root: Path) -> Optional[str]:
    """The device-tree model string without its NUL terminator, or None where it cannot be read."""
    path = Path(proc_root) / "device-tree" / "model"
    try:
        raw = path.read_bytes()
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            log.info("no %s (not a device-tree machine)", path)
        else:
            log.warning("cannot read %s: %s (errno %s)", path, exc.strerror, exc.errno)
        return None
    return raw.split(b"\x00", 1)[0].decode("utf-8", "replace").strip()


def match_model(model: str) -> Optional[Tuple[str, str]]:
    """(profile name, pattern) of the longest pattern found in ``model``, or None.

    The longest match wins so that a more specific pattern beats a shorter one that happens to
    fit too; matching ignores case.
    """
    best = None  # type: Optional[Tuple[str, str]]
    lowered = model.lower()
    for name in PROFILE_NAMES:
        if name == GENERIC:
            continue
        for pattern in load_profile(name).model_patterns:
            if pattern.lower() in lowered and (best is None or len(pattern) > len(best[1])):
                best = (name, pattern)
    return best


def detect_board(proc_root: Path = Path("/proc"), sysfs_root: Path = Path("/sys")) -> BoardProfile:
    """The profile of this board: by device-tree model, else generic-linux with discovered domains."""
    model = read_model(proc_root)
    if model is not None:
        found = match_model(model)
        if found is not None:
            log.info("detected board %s: device-tree model %r contains %r",
                     found[0], model, found[1])
            return load_profile(found[0])
        log.info("device-tree model %r matches no board profile; using %s", model, GENERIC)
    else:
        log.info("no device-tree model; using %s", GENERIC)
    return discover_generic(sysfs_root)


def discover_generic(sysfs_root: Path) -> BoardProfile:
    """generic-linux with one domain per cpufreq policy and a meter chosen from what exists."""
    template = load_profile(GENERIC)
    domains = discover_cpufreq(sysfs_root)
    share_w = GENERIC_CPU_TOP_W / len(domains) if domains else 0.0
    watts = {d.name: model_watts(d.levels_khz, share_w) for d in domains}
    power = template.power
    zones = discover_rapl(sysfs_root)
    if zones:
        power = PowerSpec(meter="rapl", input_rail=None, rails=tuple(zones))
        log.info("RAPL zones found (%s): power meter rapl", ", ".join(zones))
    profile = dataclasses.replace(
        template, domains=tuple(domains), power=power,
        power_model=PowerModel(idle_w=template.power_model.idle_w, watts_per_level=watts))
    log.info("%s: %d cpufreq domain(s) discovered under %s%s", GENERIC, len(domains),
             sysfs_root, "" if domains else " (no cpufreq: nothing to throttle)")
    return validate(profile, "%s discovered under %s" % (GENERIC, sysfs_root))


def discover_cpufreq(sysfs_root: Path) -> List[DomainSpec]:
    """One CPU domain per readable ``cpufreq/policyN``, in policy order; none without cpufreq."""
    base = Path(sysfs_root) / CPUFREQ_DIR
    try:
        entries = [e.name for e in base.iterdir()]
    except OSError as exc:
        log.info("no cpufreq under %s (%s)", base, exc.strerror)
        return []
    numbers = sorted(int(m.group(1)) for m in (_POLICY_RE.match(e) for e in entries) if m)
    domains = []
    for number in numbers:
        rel = "%s/policy%d" % (CPUFREQ_DIR, number)
        levels = _policy_levels(Path(sysfs_root) / rel)
        if levels:
            domains.append(DomainSpec(name="cpu%d" % number, kind="cpu", driver="cpufreq",
                                      paths=(rel,), levels_khz=levels))
    return domains


def _policy_levels(policy: Path) -> Tuple[int, ...]:
    """The policy's frequency table, or a 100 MHz ladder over its hardware range; () if unreadable.

    An unreadable policy (EBUSY while all its CPUs are offline) is skipped with a
    warning; a file that holds something other than numbers is ``DvfsError``.
    """
    table = _read(policy / "scaling_available_frequencies")
    if table is not None:
        # Printed "%u " per entry, so the line ends with a space: split() copes.
        levels = sorted(set(_ints(table, policy / "scaling_available_frequencies")))
        if levels:
            return tuple(levels)
    low = _read(policy / "cpuinfo_min_freq")
    high = _read(policy / "cpuinfo_max_freq")
    if low is None or high is None:
        log.warning("skipping %s: neither a frequency table nor cpuinfo_min/max_freq readable",
                    policy)
        return ()
    low_khz = _one_int(low, policy / "cpuinfo_min_freq")
    high_khz = _one_int(high, policy / "cpuinfo_max_freq")
    if low_khz <= 0 or high_khz < low_khz:
        raise DvfsError("%s: cpuinfo range %d..%d kHz is not a range" % (policy, low_khz, high_khz))
    ladder = list(range(low_khz, high_khz + 1, LADDER_STEP_KHZ))
    if ladder[-1] != high_khz:
        ladder.append(high_khz)
    log.info("%s has no scaling_available_frequencies (a driver such as intel_pstate): using "
             "%d levels from %d to %d kHz in %d kHz steps", policy, len(ladder), low_khz,
             high_khz, LADDER_STEP_KHZ)
    return tuple(ladder)


def discover_rapl(sysfs_root: Path) -> List[str]:
    """Names of the top-level RAPL zones (``package-0``, ``psys``), in zone order."""
    base = Path(sysfs_root) / RAPL_DIR
    try:
        entries = [e.name for e in base.iterdir()]
    except OSError:
        return []
    names = []
    for _, entry in sorted((int(m.group(1)), m.group(0))
                               for m in (_RAPL_RE.match(e) for e in entries) if m):
        name = _read(base / entry / "name")
        if name:
            names.append(name)
    return names


def _read(path: Path) -> Optional[str]:
    """Stripped content of a sysfs file; None when missing, with a warning when it fails otherwise."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            log.warning("cannot read %s: %s (errno %s)", path, exc.strerror, exc.errno)
        return None


def _ints(text: str, path: Path) -> List[int]:
    """Whitespace-separated integers; ``DvfsError`` naming the file otherwise."""
    try:
        return [int(word) for word in text.split()]
    except ValueError:
        raise DvfsError("%s: expected kHz numbers, got %r" % (path, text)) from None


def _one_int(text: str, path: Path) -> int:
    """Exactly one integer; ``DvfsError`` naming the file otherwise."""
    values = _ints(text, path)
    if len(values) != 1:
        raise DvfsError("%s: expected one kHz number, got %r" % (path, text))
    return values[0]
