"""Temperatures for telemetry from ``class/thermal/thermal_zoneN`` (millidegrees C)."""
import logging
from typing import Dict, Optional, Sequence

from streamfl.dvfs.base import DvfsError, SysfsIO

log = logging.getLogger(__name__)

ZONES_DIR = "class/thermal"


def read_temperatures_c(io: SysfsIO, zone_types: Optional[Sequence[str]] = None) -> Dict[str, float]:
    """Degrees C by zone type (``cpu-thermal``...), only ``zone_types`` when given.

    A zone that cannot be read is left out: Orin's cv*-thermal zones answer EAGAIN for good, and a
    disabled zone may read empty; telemetry is best effort.
    """
    wanted = set(zone_types) if zone_types else None
    temps: Dict[str, float] = {}
    for entry in io.listdir(ZONES_DIR):
        if not entry.startswith("thermal_zone"):
            continue
        zone = "%s/%s" % (ZONES_DIR, entry)
        try:
            kind = io.read(zone + "/type").strip()
            if wanted is not None and kind not in wanted:
                continue
            temps[kind] = int(io.read(zone + "/temp").strip()) / 1000.0
        except (DvfsError, ValueError) as exc:
            log.debug("thermal zone %s unreadable: %s", zone, exc)
    return temps
