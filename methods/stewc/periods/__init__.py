"""Period boundary sources for ST-EWC's temporal term, by name (``base.py`` has the interface)."""
from streamfl.methods.stewc.periods.base import PeriodBoundary
from streamfl.methods.stewc.periods.drift import DriftBoundary
from streamfl.methods.stewc.periods.schedule import ScheduleBoundary

#: The ``boundary`` values the ``stewc`` plug-in accepts.
BOUNDARIES = (ScheduleBoundary.name, DriftBoundary.name)

__all__ = ["BOUNDARIES", "PeriodBoundary", "DriftBoundary", "ScheduleBoundary"]
