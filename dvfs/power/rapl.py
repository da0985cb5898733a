"""Intel RAPL package power from the powercap energy counters.

RAPL has no power attribute, only ``energy_uj``, a microjoule counter that wraps at
``max_energy_range_uj``; power is the energy difference between two reads over their time.
Used on x86 development and CI machines.
"""
import errno
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Tuple, Union

from streamfl.dvfs.power.base import PowerError, PowerMeter

log = logging.getLogger(__name__)

#: Top-level zones only (``intel-rapl:0``, not ``intel-rapl:0:0``): subzones such as ``core`` and
#: ``uncore`` are parts of their package, so summing them with it would count twice.
_ZONE = re.compile(r"^intel-rapl:(\d+)$")

#: What the agent's operator can do about a root-only ``energy_uj``.
ACCESS_HINT = (
    "energy_uj is root-only since CVE-2020-8694; the agent needs read access: run it as root, "
    "give it CAP_DAC_READ_SEARCH, or add a udev/tmpfiles rule such as "
    "'z /sys/class/powercap/intel-rapl:*/energy_uj 0440 root streamfl -'")


def _read_uj(path: Path) -> int:
    """One microjoule counter; ``PowerError`` with the errno, and the access hint on EACCES."""
    try:
        with open(str(path), "r") as handle:
            text = handle.read().strip()
    except OSError as exc:
        hint = (": " + ACCESS_HINT) if exc.errno in (errno.EACCES, errno.EPERM) else ""
        raise PowerError("cannot read %s: %s%s" % (path, exc.strerror or exc, hint),
                         exc.errno or 0) from exc
    except UnicodeDecodeError as exc:
        raise PowerError("%s is not text: %s" % (path, exc)) from exc
    try:
        value = int(text)
    except ValueError:
        raise PowerError("%s holds %r, not an integer" % (path, text[:40])) from None
    if value < 0:
        raise PowerError("%s holds a negative counter %d" % (path, value))
    return value


class _Zone(object):
    """One top-level powercap zone: its name, counter file, counter range and previous sample."""

    def __init__(self, path: Path):
        self.path = path
        self.energy_path = path / "energy_uj"
        try:
            with open(str(path / "name"), "r") as handle:
                self.name = handle.read().strip() or path.name
        except OSError:
            self.name = path.name
        self.range_uj = _read_uj(path / "max_energy_range_uj")
        if self.range_uj <= 0:
            raise PowerError("%s/max_energy_range_uj is %d" % (path, self.range_uj))
        self.last_uj = _read_uj(self.energy_path)

    def delta_uj(self, now_uj: int) -> int:
        """Energy since the previous sample, across one wrap of the counter (e2 < e1)."""
        delta = now_uj - self.last_uj
        if delta < 0:
            delta += self.range_uj
        self.last_uj = now_uj
        return delta


class RaplMeter(PowerMeter):
    """Mean watts of each RAPL package (and ``psys``) over the interval since the previous read.

    The first read has no sample before it in the meter's life, so the constructor takes one: the
    first ``read_w`` returns the mean power since construction, later ones since the previous read.
    Taking that sample early also makes a root-only ``energy_uj`` fail at startup, with the hint.
    A read with no time elapsed (a coarse or fake clock) returns the previous answer, or 0.0 W per
    zone when there is none yet.
    """

    kind = "rapl"

    def __init__(self, sysfs_root: Union[str, Path] = "/sys",
                 clock: Callable[[], float] = time.monotonic):
        self.sysfs_root = Path(sysfs_root)
        self._clock = clock
        self._lock = threading.Lock()
        root = self.sysfs_root / "class" / "powercap"
        try:
            entries = os.listdir(str(root))
        except OSError:
            entries = []
        numbered = sorted((int(m.group(1)), name) for name, m in
                          ((n, _ZONE.match(n)) for n in entries) if m)
        self._zones: List[_Zone] = [_Zone(root / name) for _, name in numbered]
        if not self._zones:
            raise PowerError("no intel-rapl zones under %s" % root)
        names = [z.name for z in self._zones]
        if len(set(names)) != len(names):
            for zone in self._zones:
                zone.name = zone.path.name
        self._last_t_s = clock()
        self._last_w: Optional[Dict[str, float]] = None

    @property
    def rails(self) -> Tuple[str, ...]:
        """Zone names: ``package-0``, ``package-1``, ``psys``..."""
        return tuple(z.name for z in self._zones)

    def read_w(self) -> Dict[str, float]:
        with self._lock:
            samples = [(zone, _read_uj(zone.energy_path)) for zone in self._zones]
            now_s = self._clock()
            dt_s = now_s - self._last_t_s
            if dt_s <= 0:
                # Keep the older baseline: this energy is counted by the next read instead.
                if self._last_w is None:
                    return {zone.name: 0.0 for zone in self._zones}
                return dict(self._last_w)
            watts = {zone.name: zone.delta_uj(value) / 1e6 / dt_s for zone, value in samples}
            self._last_t_s = now_s
            self._last_w = watts
            return dict(watts)

    def total_of(self, rails_w: Mapping[str, float]) -> float:
        """``psys`` (the whole platform, which contains the packages) where present, else the sum
        of the packages."""
        if "psys" in rails_w:
            return rails_w["psys"]
        return sum(rails_w.values())
