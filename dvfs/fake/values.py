"""The values the fake kernel parses and picks: sysfs store parsing (``%u``, ``%15s``), cpufreq's
and devfreq's frequency-table lookups and the CPU-range format, kept apart from ``FakeKernel``'s
rules so each reads on its own."""
import errno
import os
import re
from typing import Iterable, List, Optional, Sequence

from streamfl.dvfs.base import DvfsError

UINT = re.compile(r"^[0-9]+$")


def sysfs_error(code: int, rel: str, why: str = "") -> DvfsError:
    return DvfsError("%s: %s%s" % (rel, os.strerror(code), " (%s)" % why if why else ""), code)


def parse_uint(value: str, rel: str) -> int:
    """sscanf("%u") as the stores use it; anything but digits is EINVAL."""
    text = value.strip()
    if not UINT.match(text):
        raise sysfs_error(errno.EINVAL, rel, "not an unsigned integer: %r" % value)
    return int(text)


def parse_token(value: str, rel: str) -> str:
    """sscanf("%15s"): the first word, EINVAL when there is none."""
    words = value.split()
    if not words:
        raise sysfs_error(errno.EINVAL, rel, "empty write")
    return words[0]


def clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def pick_cpufreq(table: Optional[Sequence[int]], target: int, low: int, high: int,
                 high_rel: bool) -> int:
    """cpufreq's table lookup: RELATION_H (highest <= target) or RELATION_L (lowest >= target)
    among the entries within [low, high], after clamping the target there (4.9 freq_table)."""
    target = clamp(target, low, high)
    if not table:
        return target  # setpolicy drivers have no table: the hardware runs anywhere in range
    within = [f for f in table if low <= f <= high] or list(table)
    if high_rel:
        below = [f for f in within if f <= target]
        return max(below) if below else min(within)
    above = [f for f in within if f >= target]
    return min(above) if above else max(within)


def pick_opp(table: Sequence[int], freq: int, floor: bool) -> int:
    """devfreq_recommended_opp(): the floor OPP under LEAST_UPPER_BOUND, else the ceiling,
    falling back to the other side when none exists (4.9 and 5.x devfreq.c)."""
    below = [f for f in table if f <= freq]
    above = [f for f in table if f >= freq]
    if floor:
        return max(below) if below else min(table)
    return min(above) if above else max(table)


def cpu_ranges(cpus: Iterable[int]) -> str:
    """``0-3,5``: the format of ``devices/system/cpu/online``."""
    out: List[str] = []
    run: List[int] = []
    for cpu in sorted(cpus) + [-2]:
        if run and cpu != run[-1] + 1:
            out.append(str(run[0]) if len(run) == 1 else "%d-%d" % (run[0], run[-1]))
            run = []
        run.append(cpu)
    return ",".join(out)
