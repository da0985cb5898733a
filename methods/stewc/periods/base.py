"""When a period ends: the ``PeriodBoundary`` ABC behind ST-EWC's temporal term (ST-EWC paper, sec. 4).

The paper's periods are given (PermutedMNIST's permutations, PACS's domains); a real fleet has to
notice them. One boundary source per file: ``schedule`` (fixed period lengths: the scenario's, or
an operator's calendar) and ``drift`` (a quorum of the devices report that their inputs moved).
The ``stewc`` coordinator plug-in asks ``due`` at every tick and calls ``started`` when it opens
a new period; a source keeps its own bookkeeping and saves it with the coordinator's state.
"""
import abc
from typing import Any, ClassVar, Collection, Dict, Mapping

from streamfl.methods.stewc.payloads import DriftSignal


class PeriodBoundary(abc.ABC):
    """Decides when the current period ends; subclasses set ``name``."""

    #: The ``boundary`` value that picks this source in the plug-in's settings.
    name: ClassVar[str] = ""

    def on_signal(self, device_id: str, signal: DriftSignal, now: float) -> None:
        """A greeted device reported its drift count (in an update or its telemetry)."""

    @abc.abstractmethod
    def due(self, now: float, online: Collection[str]) -> bool:
        """True if the period running since the last ``started`` (or the first call) has ended."""

    @abc.abstractmethod
    def started(self, now: float) -> None:
        """A new period began at ``now`` (called right after ``due`` said so)."""

    @abc.abstractmethod
    def state(self) -> Dict[str, Any]:
        """JSON-able bookkeeping for the state folder."""

    @abc.abstractmethod
    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore what ``state()`` returned; ``ValueError`` if it is malformed."""
