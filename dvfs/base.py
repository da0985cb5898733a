"""The DVFS interfaces: frequency domains, the backend holding them, the sysfs seam.

Units are in names. Every domain speaks kHz, whatever its files use (cpufreq is kHz, devfreq is
Hz), so policies and board profiles compare CPU and GPU levels without conversions.

Every backend reads and writes its files through a ``SysfsIO``: the real one
(``streamfl.dvfs.sysfs_io.SysfsFiles``) does plain reads and writes under a root directory and
translates ``OSError`` into ``DvfsError``; the fake kernel (``streamfl.dvfs.fake``) applies the
kernel's rules to a generated tree, so tests exercise the same write paths a board does.
"""
import abc
from typing import Dict, List, Sequence, Tuple

from streamfl.errors import StreamflError

#: Domain kinds; a policy picks the GPU domain on boards that have one (AdaCLP s4.2).
CPU, GPU = "cpu", "gpu"


class DvfsError(StreamflError):
    """A clock file could not be read or written; ``errno`` is the kernel's answer when there was one."""

    def __init__(self, message: str, errno: int = 0):
        super().__init__(message)
        self.errno = errno


class SysfsIO(abc.ABC):
    """Reads and writes sysfs attributes by path relative to the sysfs root (``"devices/..."``)."""

    @abc.abstractmethod
    def read(self, rel_path: str) -> str:
        """The attribute's content, stripped of the trailing newline (``DvfsError`` if unreadable)."""

    @abc.abstractmethod
    def write(self, rel_path: str, value: str) -> None:
        """Write ``value`` as one ``write(2)``; ``DvfsError`` carrying the errno when refused."""

    @abc.abstractmethod
    def exists(self, rel_path: str) -> bool:
        """True if the attribute (or directory) is present."""

    @abc.abstractmethod
    def listdir(self, rel_path: str) -> List[str]:
        """Sorted entry names of a directory; empty if it does not exist."""


#: A saved setting: (relative path, content) pairs in the order they must be written back.
Snapshot = List[Tuple[str, str]]


class FrequencyDomain(abc.ABC):
    """One independently clocked unit (a cpufreq policy, a GPU) with a ladder of levels."""

    #: Stable name used in plans, profiles, telemetry and the saved state (``cpu0``, ``gpu``).
    name: str
    #: ``CPU`` or ``GPU``.
    kind: str

    @property
    @abc.abstractmethod
    def levels_khz(self) -> Tuple[int, ...]:
        """The frequencies this domain can run at, ascending."""

    @abc.abstractmethod
    def current_khz(self) -> int:
        """The frequency now (as the kernel reports it)."""

    @abc.abstractmethod
    def cap_khz(self) -> int:
        """The upper limit in force (``scaling_max_freq``, devfreq ``max_freq``)."""

    def current_level(self) -> int:
        """Index of the highest level not above the cap: the level ``set_level`` last chose."""
        cap = self.cap_khz()
        levels = self.levels_khz
        below = [i for i, f in enumerate(levels) if f <= cap]
        return below[-1] if below else 0

    @abc.abstractmethod
    def set_level(self, index: int) -> None:
        """Run at most at ``levels_khz[index]`` (or exactly there when pinning); ``IndexError`` if
        out of range, ``DvfsError`` if the kernel refuses."""

    @abc.abstractmethod
    def snapshot(self) -> Snapshot:
        """The settings ``set_level`` may change, as they are now, in restore order."""

    @abc.abstractmethod
    def restore(self, snapshot: Snapshot) -> None:
        """Write a ``snapshot`` back, respecting the kernel's min/max ordering rules."""


class DvfsBackend(abc.ABC):
    """The frequency domains of one board, and whether changing them has any effect."""

    #: ``sysfs``, ``simulated`` or ``null``; shown by ``streamfl-agent dvfs status``.
    kind: str

    @property
    @abc.abstractmethod
    def domains(self) -> Sequence[FrequencyDomain]:
        """Every domain, CPU policies first."""

    def domain(self, name: str) -> FrequencyDomain:
        """The domain called ``name``; ``KeyError`` naming the known ones otherwise."""
        for dom in self.domains:
            if dom.name == name:
                return dom
        raise KeyError("no DVFS domain %r (have: %s)" % (
            name, ", ".join(d.name for d in self.domains) or "none"))

    def snapshot(self) -> Dict[str, Snapshot]:
        """Every domain's current settings, by domain name (what the guard saves before a write)."""
        return {d.name: d.snapshot() for d in self.domains}

    def restore(self, saved: Dict[str, Snapshot]) -> List[str]:
        """Write back what ``snapshot`` returned; returns the names of domains that failed.

        Every domain is tried even when one fails, so one stuck file does not leave the others
        throttled.
        """
        failed = []
        for dom in self.domains:
            if dom.name in saved:
                try:
                    dom.restore(saved[dom.name])
                except DvfsError:
                    failed.append(dom.name)
        return failed
