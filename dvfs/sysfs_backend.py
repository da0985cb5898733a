"""The hardware backend: a board's cpufreq policies and GPU devfreq device, through one ``SysfsIO``."""
from typing import Sequence

from streamfl.dvfs.base import DvfsBackend, FrequencyDomain, SysfsIO


class SysfsBackend(DvfsBackend):
    """The domains a board profile names (or that were discovered), sharing the ``io`` seam."""

    kind = "sysfs"

    def __init__(self, io: SysfsIO, domains: Sequence[FrequencyDomain]):
        self.io = io
        names = [d.name for d in domains]
        if len(set(names)) != len(names):
            raise ValueError("duplicate DVFS domain names: %s" % ", ".join(names))
        self._domains = tuple(sorted(domains, key=lambda d: (d.kind != "cpu", d.name)))

    @property
    def domains(self) -> Sequence[FrequencyDomain]:
        return self._domains
