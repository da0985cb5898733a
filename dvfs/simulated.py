"""In-memory frequency domains for the demo and the simulator: levels from a board profile, every
change stamped with a (possibly virtual) clock so runs can plot clock levels and model energy."""
import time
from typing import Callable, List, Optional, Sequence, Tuple

from streamfl.dvfs.base import DvfsBackend, FrequencyDomain, Snapshot


class SimulatedDomain(FrequencyDomain):
    """A domain whose level is a number in memory; starts at the top level, like a fresh boot."""

    driver = "simulated"

    def __init__(self, name: str, kind: str, levels_khz: Sequence[int],
                 clock: Callable[[], float] = time.monotonic, start_level: Optional[int] = None):
        if not levels_khz:
            raise ValueError("simulated domain %s needs at least one level" % name)
        self.name = name
        self.kind = kind
        self._levels = tuple(sorted(int(f) for f in levels_khz))
        self._clock = clock
        self._level = len(self._levels) - 1 if start_level is None else int(start_level)
        if not 0 <= self._level < len(self._levels):
            raise ValueError("start level %d outside 0..%d" % (self._level, len(self._levels) - 1))
        #: (time_s, level) at the start and after every change
        self.history: List[Tuple[float, int]] = [(self._clock(), self._level)]

    @property
    def levels_khz(self) -> Tuple[int, ...]:
        return self._levels

    def current_khz(self) -> int:
        return self._levels[self._level]

    def cap_khz(self) -> int:
        return self._levels[self._level]

    def current_level(self) -> int:
        return self._level

    def set_level(self, index: int) -> None:
        if not 0 <= index < len(self._levels):
            raise IndexError("%s has levels 0..%d, not %d" % (self.name, len(self._levels) - 1, index))
        if index != self._level:
            self._level = index
            self.history.append((self._clock(), index))

    def snapshot(self) -> Snapshot:
        return [(self.name, str(self._level))]

    def restore(self, snapshot: Snapshot) -> None:
        for _, value in snapshot:
            self.set_level(int(value))


class SimulatedBackend(DvfsBackend):
    """The domains of a board profile, simulated; what ``streamfl demo`` and the simulator use."""

    kind = "simulated"

    def __init__(self, domains: Sequence[SimulatedDomain]):
        self._domains = tuple(domains)

    @property
    def domains(self) -> Sequence[FrequencyDomain]:
        return self._domains
