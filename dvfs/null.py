"""The backend for ``dvfs: none`` and boards without clock control: no domains, no writes."""
import logging
from typing import Sequence

from streamfl.dvfs.base import DvfsBackend, FrequencyDomain

log = logging.getLogger(__name__)


class NullBackend(DvfsBackend):
    """Changes nothing and says so once, so a log reader knows the clocks were left alone."""

    kind = "null"

    def __init__(self, reason: str = "DVFS disabled"):
        self.reason = reason
        log.info("%s: clocks are left as they are", reason)

    @property
    def domains(self) -> Sequence[FrequencyDomain]:
        return ()
