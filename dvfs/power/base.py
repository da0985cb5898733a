"""The power-meter interface: watts per rail now, from whatever the board offers."""
import abc
from typing import Dict, Mapping, Tuple

from streamfl.dvfs.base import DvfsError


class PowerError(DvfsError):
    """A power sensor is missing, unreadable or returned something that is not a number."""


class PowerMeter(abc.ABC):
    """Instantaneous power of a board's rails, in watts."""

    #: ``ina3221-iio``, ``ina3221-hwmon``, ``rpi5-pmic``, ``rapl``, ``jtop``, ``modeled``, ``null``.
    kind: str
    #: Whether its watts come from a sensor on this board. False for ``modeled`` (a board
    #: profile's power model) and ``null``: nothing may present their figures as measured power.
    measured: bool = True

    @property
    @abc.abstractmethod
    def rails(self) -> Tuple[str, ...]:
        """Rail names as the hardware labels them (``VDD_IN``, ``VDD_CPU_GPU_CV``, ...)."""

    @abc.abstractmethod
    def read_w(self) -> Dict[str, float]:
        """Watts per rail now; ``PowerError`` if the sensor cannot be read."""

    def total_of(self, rails_w: Mapping[str, float]) -> float:
        """Board power from one ``read_w``: the input rail where the board has one, else the sum."""
        return sum(rails_w.values())

    def read_total_w(self) -> Tuple[float, Dict[str, float]]:
        """(board watts, watts per rail) from ONE read, so telemetry's rails and the energy
        counter's total agree, and meters whose reads have side effects (RAPL) are read once."""
        rails_w = self.read_w()
        return self.total_of(rails_w), rails_w

    def total_w(self) -> float:
        """Board power now (see ``total_of``)."""
        return self.read_total_w()[0]

    def close(self) -> None:
        """Release handles (subprocesses, jtop connections); idempotent."""
