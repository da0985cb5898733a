"""Builds a power meter by its ``kind`` (board profiles name one) or by probing what the board has.

Meters import lazily here so that, for example, a Raspberry Pi never loads the jtop reader.
"""
import logging
from pathlib import Path
from typing import Callable, List, Optional, Union

from streamfl.dvfs.power.base import PowerError, PowerMeter
from streamfl.errors import ConfigError

log = logging.getLogger(__name__)

#: Kinds ``create_meter`` builds; ``modeled`` needs domains and a power model, so its callers
#: build ``ModeledMeter`` themselves.
KINDS = ("ina3221-hwmon", "ina3221-iio", "rpi5-pmic", "rapl", "jtop", "null")
#: The order ``detect_meter`` tries: JetPack 5/6 before 4, then the Pi 5 PMIC, then x86 RAPL.
DETECT_ORDER = ("ina3221-hwmon", "ina3221-iio", "rpi5-pmic", "rapl")


def create_meter(kind: str, sysfs_root: Union[str, Path] = "/sys",
                 runner: Optional[Callable[[List[str]], str]] = None) -> PowerMeter:
    """The meter of ``kind``; ``PowerError`` if its sensor is absent, ``ConfigError`` if the kind is
    unknown. ``runner`` replaces the command runner of ``rpi5-pmic``."""
    if kind == "ina3221-hwmon":
        from streamfl.dvfs.power.ina3221_hwmon import Ina3221HwmonMeter
        return Ina3221HwmonMeter(sysfs_root)
    if kind == "ina3221-iio":
        from streamfl.dvfs.power.ina3221_iio import Ina3221IioMeter
        return Ina3221IioMeter(sysfs_root)
    if kind == "rpi5-pmic":
        from streamfl.dvfs.power.rpi5_pmic import Rpi5PmicMeter
        return Rpi5PmicMeter(runner=runner)
    if kind == "rapl":
        from streamfl.dvfs.power.rapl import RaplMeter
        return RaplMeter(sysfs_root)
    if kind == "jtop":
        from streamfl.dvfs.power.jtop import JtopMeter
        return JtopMeter()
    if kind == "null":
        from streamfl.dvfs.power.null import NullMeter
        return NullMeter()
    raise ConfigError("unknown power meter kind %r (known: %s; 'modeled' is built from a board "
                      "profile)" % (kind, ", ".join(KINDS)))


def detect_meter(sysfs_root: Union[str, Path] = "/sys",
                 runner: Optional[Callable[[List[str]], str]] = None) -> PowerMeter:
    """The first meter in ``DETECT_ORDER`` whose sensor answers, else the null meter (which says so
    in the log: energy will read 0 J)."""
    for kind in DETECT_ORDER:
        try:
            meter = create_meter(kind, sysfs_root, runner)
        except PowerError as exc:
            log.debug("no %s power meter: %s", kind, exc)
            continue
        log.info("power meter: %s (rails: %s)", kind, ", ".join(meter.rails))
        return meter
    log.warning("no power sensor found under %s; energy will be reported as 0 J", sysfs_root)
    return create_meter("null")
