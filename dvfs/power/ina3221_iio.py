"""INA3221 power rails through NVIDIA's IIO driver ``ina3221x`` (JetPack 4 / L4T R32).

Jetson Nano and Xavier NX on JetPack 4 expose three channels per monitor as
``iio:deviceN/rail_name_K``, ``in_powerK_input`` (mW), ``in_voltageK_input`` (mV) and
``in_currentK_input`` (mA). This module also holds the small file helpers and
the input-rail rule the hwmon and jtop meters share.
"""
import errno
import logging
import os
import re
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple, Union

from streamfl.dvfs.power.base import PowerError, PowerMeter

log = logging.getLogger(__name__)

#: Rails that carry the whole module input; ``total_w`` uses them instead of a sum, because the other
#: rails are downstream of them (jtop's rule: ``VDD_IN`` or ``POM_5V_IN``).
INPUT_RAILS = ("VDD_IN", "POM_5V_IN")

_IIO_DEVICE = re.compile(r"^iio:device(\d+)$")
_RAIL_NAME = re.compile(r"^rail_name_(\d+)$")


def read_attr(path: Path) -> str:
    """A sysfs attribute's text without surrounding whitespace; ``PowerError`` keeping the errno."""
    try:
        with open(str(path), "r") as handle:
            return handle.read().strip()
    except OSError as exc:
        hint = ""
        if exc.errno == errno.EACCES:
            # Some JetPack 4 images make the INA files root-only.
            hint = "; the agent needs read access (a udev or tmpfiles rule, or run as root)"
        raise PowerError("cannot read %s: %s%s" % (path, exc.strerror or exc, hint),
                         exc.errno or 0) from exc
    except UnicodeDecodeError as exc:
        raise PowerError("%s is not text: %s" % (path, exc)) from exc


def read_int(path: Path) -> int:
    """A sysfs attribute holding one decimal integer; ``PowerError`` if it holds anything else."""
    text = read_attr(path)
    try:
        return int(text)
    except ValueError:
        raise PowerError("%s holds %r, not an integer" % (path, text[:40])) from None


def input_or_sum_w(watts: Mapping[str, float]) -> float:
    """Board power: the input rail where there is one (``INPUT_RAILS``), else the sum of the rails."""
    for name in INPUT_RAILS:
        if name in watts:
            return watts[name]
    return sum(watts.values())


def unique_name(name: str, taken: Mapping[str, object]) -> str:
    """``name``, or ``name#2``, ``name#3``... when two monitors label a rail the same."""
    candidate, k = name, 2
    while candidate in taken:
        candidate, k = "%s#%d" % (name, k), k + 1
    return candidate


def _index(name: str, pattern) -> int:
    match = pattern.match(name)
    return int(match.group(1)) if match else -1


def _listdir(path: Path) -> List[str]:
    try:
        return os.listdir(str(path))
    except OSError:
        return []


class _Channel(object):
    """One monitored rail: where its power comes from."""

    def __init__(self, rail: str, device: Path, index: int):
        self.rail = rail
        self.power_path = device / ("in_power%d_input" % index)
        self.voltage_path = device / ("in_voltage%d_input" % index)
        self.current_path = device / ("in_current%d_input" % index)
        # The driver computes in_power from the same bus/shunt registers; jtop and Zeus both
        # prefer it when present, so V x I is only the fallback for images without it.
        self.use_power_file = self.power_path.exists()

    def read_w(self) -> float:
        if self.use_power_file:
            return read_int(self.power_path) / 1e3
        return read_int(self.voltage_path) * read_int(self.current_path) / 1e6


class Ina3221IioMeter(PowerMeter):
    """Watts per rail from every ``ina3221x`` IIO device under ``sysfs_root``."""

    kind = "ina3221-iio"

    def __init__(self, sysfs_root: Union[str, Path] = "/sys"):
        self.sysfs_root = Path(sysfs_root)
        self._channels: List[_Channel] = []
        seen: Dict[str, _Channel] = {}
        for device in self._devices():
            for entry in sorted(_listdir(device), key=lambda n: _index(n, _RAIL_NAME)):
                index = _index(entry, _RAIL_NAME)
                if index < 0:
                    continue
                rail = read_attr(device / entry)
                if not rail:
                    log.debug("skipping %s/%s: empty rail name", device, entry)
                    continue
                channel = _Channel(unique_name(rail, seen), device, index)
                seen[channel.rail] = channel
                self._channels.append(channel)
        if not self._channels:
            raise PowerError("no ina3221x IIO rails under %s/bus/iio/devices" % self.sysfs_root)
        log.debug("ina3221x rails: %s", ", ".join(c.rail for c in self._channels))

    def _devices(self) -> List[Path]:
        """IIO devices of the ina3221x driver, each once, in ``iio:deviceN`` order.

        Discovery keys on the ``rail_name_K`` attributes, which only NVIDIA's ina3221x driver
        creates: the content of the IIO ``name`` file on stock images is unconfirmed ([U] on
        the Nano). ``bus/iio/devices`` is the kernel's index of IIO devices; the driver's own
        ``bus/i2c/drivers/ina3221x/<addr>/`` directory is searched too, as jtop and Zeus do.
        """
        candidates: List[Tuple[int, Path]] = []
        iio_root = self.sysfs_root / "bus" / "iio" / "devices"
        for name in _listdir(iio_root):
            if _IIO_DEVICE.match(name):
                candidates.append((_index(name, _IIO_DEVICE), iio_root / name))
        driver_root = self.sysfs_root / "bus" / "i2c" / "drivers" / "ina3221x"
        for client in sorted(_listdir(driver_root)):
            for name in _listdir(driver_root / client):
                if _IIO_DEVICE.match(name):
                    candidates.append((_index(name, _IIO_DEVICE), driver_root / client / name))
        devices, real_paths = [], set()
        for _, path in sorted(candidates, key=lambda item: item[0]):
            real = os.path.realpath(str(path))
            if real in real_paths:
                continue
            if any(_index(n, _RAIL_NAME) >= 0 for n in _listdir(path)):
                real_paths.add(real)
                devices.append(path)
        return devices

    @property
    def rails(self) -> Tuple[str, ...]:
        return tuple(c.rail for c in self._channels)

    def read_w(self) -> Dict[str, float]:
        return {c.rail: c.read_w() for c in self._channels}

    def total_of(self, rails_w: Mapping[str, float]) -> float:
        """``POM_5V_IN`` (Nano) or ``VDD_IN`` (Xavier NX) when present: the other rails are parts of it."""
        return input_or_sum_w(rails_w)

    def power_source(self, rail: str) -> Optional[str]:
        """``in_power`` or ``in_voltage*in_current``: which files feed ``rail`` (for ``dvfs status``)."""
        for channel in self._channels:
            if channel.rail == rail:
                return "in_power" if channel.use_power_file else "in_voltage*in_current"
        return None
