"""A Jetson GPU (devfreq) as a frequency domain: Hz in the files, kHz in the interface.

Capping writes ``max_freq`` and leaves NVIDIA's ``nvhost_podgov`` governor in charge; ``pin``
switches to the ``userspace`` governor and writes ``userspace/set_freq``, which exists only while
that governor runs.
"""
import logging
from typing import Optional, Sequence, Tuple

from streamfl.dvfs.base import GPU, DvfsError, FrequencyDomain, Snapshot, SysfsIO
from streamfl.dvfs.cpufreq import CAP, MODES, restore_limits_and_governor
from streamfl.dvfs.limits import lower_min_then_cap, parse_levels, read_int, write_limits

log = logging.getLogger(__name__)

HZ_PER_KHZ = 1000


class DevfreqDomain(FrequencyDomain):
    """``.../devfreq/<gpu>`` (Hz); ``levels_khz`` from the profile or ``available_frequencies``."""

    driver = "devfreq"

    def __init__(self, io: SysfsIO, devfreq_dir: str, name: str = "gpu",
                 levels_khz: Optional[Sequence[int]] = None, mode: str = CAP):
        if mode not in MODES:
            raise ValueError("devfreq mode must be one of %s, got %r" % (", ".join(MODES), mode))
        self.io = io
        self.directory = devfreq_dir.rstrip("/")
        self.name = name
        self.kind = GPU
        self.mode = mode
        self._levels = tuple(sorted(levels_khz)) if levels_khz else None

    def _file(self, attr: str) -> str:
        return "%s/%s" % (self.directory, attr)

    def _khz(self, attr: str) -> int:
        return read_int(self.io, self._file(attr)) // HZ_PER_KHZ

    @property
    def levels_khz(self) -> Tuple[int, ...]:
        if self._levels is None:
            levels = parse_levels(self.io.read(self._file("available_frequencies")), HZ_PER_KHZ)
            if not levels:
                raise DvfsError("%s lists no frequencies" % self._file("available_frequencies"))
            self._levels = levels
        return self._levels

    def current_khz(self) -> int:
        return self._khz("cur_freq")

    def cap_khz(self) -> int:
        if self.mode != CAP and self.io.exists(self._file("userspace/set_freq")):
            text = self.io.read(self._file("userspace/set_freq")).strip()
            if text.isdigit():
                return int(text) // HZ_PER_KHZ
        return self._khz("max_freq")

    def set_level(self, index: int) -> None:
        levels = self.levels_khz
        if not 0 <= index < len(levels):
            raise IndexError("%s has levels 0..%d, not %d" % (self.name, len(levels) - 1, index))
        target_hz = levels[index] * HZ_PER_KHZ
        if self.mode == CAP:
            lower_min_then_cap(self.io, self._file("min_freq"), self._file("max_freq"),
                               target_hz, levels[0] * HZ_PER_KHZ)
        else:
            if self.io.read(self._file("governor")).strip() != "userspace":
                # The kernel would answer a bare ENODEV (4.9) or EINVAL (5.x): name the way out.
                offered = self.io.read(self._file("available_governors")).split()
                if "userspace" not in offered:
                    raise DvfsError("%s: mode pin needs the userspace governor, and this devfreq "
                                    "device offers only %s; use mode cap"
                                    % (self.name, " ".join(offered)))
                self.io.write(self._file("governor"), "userspace")
            write_limits(self.io, self._file("min_freq"), self._file("max_freq"),
                         levels[0] * HZ_PER_KHZ, levels[-1] * HZ_PER_KHZ)
            self.io.write(self._file("userspace/set_freq"), str(target_hz))
        log.debug("%s set to level %d (%d kHz, %s)", self.name, index, levels[index], self.mode)

    def snapshot(self) -> Snapshot:
        governor = self.io.read(self._file("governor")).strip()
        saved = [(self._file("governor"), governor),
                 (self._file("min_freq"), str(read_int(self.io, self._file("min_freq")))),
                 (self._file("max_freq"), str(read_int(self.io, self._file("max_freq"))))]
        if governor == "userspace" and self.io.exists(self._file("userspace/set_freq")):
            value = self.io.read(self._file("userspace/set_freq")).strip()
            if value.isdigit():  # "undefined" until the first write: nothing to put back
                saved.append((self._file("userspace/set_freq"), value))
        return saved

    def restore(self, snapshot: Snapshot) -> None:
        restore_limits_and_governor(self.io, snapshot, "min_freq", "max_freq", "governor")
