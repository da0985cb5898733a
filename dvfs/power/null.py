"""A power meter for boards without one (Raspberry Pi 4): it measures nothing."""
from typing import Dict, Mapping, Tuple

from streamfl.dvfs.power.base import PowerMeter


class NullMeter(PowerMeter):
    """Measures nothing: no rails, ``read_w() == {}`` and ``total_w() == 0.0``; energy counts stay 0."""

    kind = "null"
    measured = False

    @property
    def rails(self) -> Tuple[str, ...]:
        return ()

    def read_w(self) -> Dict[str, float]:
        return {}

    def total_of(self, rails_w: Mapping[str, float]) -> float:
        return 0.0
