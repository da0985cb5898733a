"""A cpufreq policy as a frequency domain: capped through ``scaling_max_freq``, or pinned.

Capping is the default: the governor the board runs keeps working and only its ceiling moves,
which every generic governor honours (the kernel clamps every governor's target into
[scaling_min_freq, scaling_max_freq]). ``pin`` mode
switches to the ``userspace`` governor and writes ``scaling_setspeed`` instead, for exact clocks.
"""
import logging
from typing import Optional, Sequence, Tuple

from streamfl.dvfs.base import CPU, DvfsError, FrequencyDomain, Snapshot, SysfsIO
from streamfl.dvfs.limits import lower_min_then_cap, parse_levels, read_int, write_limits

log = logging.getLogger(__name__)

CAP, PIN = "cap", "pin"
MODES = (CAP, PIN)


class CpufreqDomain(FrequencyDomain):
    """``devices/system/cpu/cpufreq/policyN`` (kHz); ``levels_khz`` from the profile or the kernel."""

    driver = "cpufreq"

    def __init__(self, io: SysfsIO, policy_dir: str, name: Optional[str] = None,
                 levels_khz: Optional[Sequence[int]] = None, mode: str = CAP):
        if mode not in MODES:
            raise ValueError("cpufreq mode must be one of %s, got %r" % (", ".join(MODES), mode))
        self.io = io
        self.directory = policy_dir.rstrip("/")
        self.name = name or self.directory.rsplit("/", 1)[-1].replace("policy", "cpu")
        self.kind = CPU
        self.mode = mode
        self._levels = tuple(sorted(levels_khz)) if levels_khz else None

    def _file(self, attr: str) -> str:
        return "%s/%s" % (self.directory, attr)

    @property
    def levels_khz(self) -> Tuple[int, ...]:
        if self._levels is None:
            levels = parse_levels(self.io.read(self._file("scaling_available_frequencies")))
            if not levels:
                raise DvfsError("%s lists no frequencies" % self._file("scaling_available_frequencies"))
            self._levels = levels
        return self._levels

    def current_khz(self) -> int:
        return read_int(self.io, self._file("scaling_cur_freq"))

    def cap_khz(self) -> int:
        if self.mode == PIN and self.io.read(self._file("scaling_governor")).strip() == "userspace":
            return read_int(self.io, self._file("scaling_setspeed"))
        return read_int(self.io, self._file("scaling_max_freq"))

    def set_level(self, index: int) -> None:
        levels = self.levels_khz
        if not 0 <= index < len(levels):
            raise IndexError("%s has levels 0..%d, not %d" % (self.name, len(levels) - 1, index))
        target = levels[index]
        if self.mode == CAP:
            lower_min_then_cap(self.io, self._file("scaling_min_freq"),
                               self._file("scaling_max_freq"), target, levels[0])
        else:
            if self.io.read(self._file("scaling_governor")).strip() != "userspace":
                offered = self.io.read(self._file("scaling_available_governors")).split()
                if "userspace" not in offered:
                    raise DvfsError("%s: mode pin needs the userspace governor, and this driver "
                                    "offers only %s; use mode cap" % (self.name, " ".join(offered)))
                self.io.write(self._file("scaling_governor"), "userspace")
            write_limits(self.io, self._file("scaling_min_freq"), self._file("scaling_max_freq"),
                         levels[0], levels[-1])
            self.io.write(self._file("scaling_setspeed"), str(target))
        log.debug("%s set to level %d (%d kHz, %s)", self.name, index, target, self.mode)

    def snapshot(self) -> Snapshot:
        governor = self.io.read(self._file("scaling_governor")).strip()
        saved = [(self._file("scaling_governor"), governor),
                 (self._file("scaling_min_freq"), str(read_int(self.io, self._file("scaling_min_freq")))),
                 (self._file("scaling_max_freq"), str(read_int(self.io, self._file("scaling_max_freq"))))]
        if governor == "userspace":
            saved.append((self._file("scaling_setspeed"),
                          str(read_int(self.io, self._file("scaling_setspeed")))))
        return saved

    def restore(self, snapshot: Snapshot) -> None:
        restore_limits_and_governor(self.io, snapshot, "scaling_min_freq", "scaling_max_freq",
                                    "scaling_governor")


def restore_limits_and_governor(io: SysfsIO, snapshot: Snapshot, min_attr: str, max_attr: str,
                                governor_attr: str) -> None:
    """Write a cpufreq or devfreq snapshot back: limits in a safe order, the governor, the rest.

    The governor goes after the limits so that ``performance`` or ``userspace`` comes back into
    the original range; attributes that exist only under a governor (setspeed) go last.
    """
    values = dict(snapshot)
    by_attr = {path.rsplit("/", 1)[-1]: path for path, _ in snapshot}
    if min_attr in by_attr and max_attr in by_attr:
        write_limits(io, by_attr[min_attr], by_attr[max_attr],
                     int(values[by_attr[min_attr]]), int(values[by_attr[max_attr]]))
    gov_path = by_attr.get(governor_attr)
    if gov_path is not None and io.read(gov_path).strip() != values[gov_path]:
        io.write(gov_path, values[gov_path])
    for path, value in snapshot:
        if path.rsplit("/", 1)[-1] not in (min_attr, max_attr, governor_attr):
            io.write(path, value)
