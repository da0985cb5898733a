"""Period boundary sources for ST-EWC's temporal term, by name (``base.py`` has the interface)."""
from streamfl.coordinator.periods.base import PeriodBoundary
from streamfl.coordinator.periods.drift import DriftBoundary
from streamfl.coordinator.periods.schedule import ScheduleBoundary

#: The ``boundary`` values the ``stewc`` plug-in accepts.
BOUNDARIES = (ScheduleBoundary.name, DriftBoundary.name)

__all__ = ["BOUNDARIES", "PeriodBoundary", "DriftBoundary", "ScheduleBoundary"]
