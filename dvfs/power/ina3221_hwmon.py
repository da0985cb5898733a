"""INA3221 power rails through the upstream hwmon driver ``ina3221`` (JetPack 5/6).

The hwmon driver has no power attribute: each rail's power is its bus voltage ``inN_input`` (mV)
times its current ``currN_input`` (mA), channels 1..3, as jtop and Zeus compute it.
"""
import logging
import os
import re
from pathlib import Path
from typing import Dict, List, Mapping, Tuple, Union

from streamfl.dvfs.power.base import PowerError, PowerMeter
from streamfl.dvfs.power.ina3221_iio import input_or_sum_w, read_attr, read_int, unique_name

log = logging.getLogger(__name__)

#: Voltage/current channels of the three INA3221 inputs; in4..in6 are shunt voltages (uV) and in7
#: their sum, which are not rails.
CHANNELS = (1, 2, 3)
#: The label NVIDIA's device trees give unconnected inputs (jtop skips them).
UNCONNECTED_LABEL = "NC"

_HWMON = re.compile(r"^hwmon(\d+)$")


class _Channel(object):
    """One labelled input: bus voltage and current files of channel ``n`` of one hwmon device."""

    def __init__(self, rail: str, device: Path, n: int):
        self.rail = rail
        self.voltage_path = device / ("in%d_input" % n)
        self.current_path = device / ("curr%d_input" % n)

    def read_w(self) -> float:
        return read_int(self.voltage_path) * read_int(self.current_path) / 1e6


class Ina3221HwmonMeter(PowerMeter):
    """Watts per rail from every hwmon device named ``ina3221`` under ``sysfs_root/class/hwmon``."""

    kind = "ina3221-hwmon"

    def __init__(self, sysfs_root: Union[str, Path] = "/sys"):
        self.sysfs_root = Path(sysfs_root)
        self._channels: List[_Channel] = []
        taken: Dict[str, _Channel] = {}
        for device in self._devices():
            for n in CHANNELS:
                label = self._label(device, n)
                if label is None:
                    continue
                channel = _Channel(unique_name(label, taken), device, n)
                taken[channel.rail] = channel
                self._channels.append(channel)
        if not self._channels:
            raise PowerError("no labelled ina3221 hwmon channels under %s/class/hwmon"
                             % self.sysfs_root)
        log.debug("ina3221 rails: %s", ", ".join(c.rail for c in self._channels))

    def _devices(self) -> List[Path]:
        """``class/hwmon/hwmonN`` whose ``name`` is ``ina3221``, in N order (N varies per boot)."""
        root = self.sysfs_root / "class" / "hwmon"
        try:
            names = os.listdir(str(root))
        except OSError:
            return []
        found = []
        for name in names:
            match = _HWMON.match(name)
            if not match or not (root / name / "name").exists():
                continue
            if read_attr(root / name / "name") == "ina3221":
                found.append((int(match.group(1)), root / name))
        return [path for _, path in sorted(found)]

    @staticmethod
    def _label(device: Path, n: int):
        """The rail label of channel ``n``, or None when the channel is not a rail to read.

        Skipped: no ``inN_label`` (the driver creates it only when the device tree
        names the input), the label ``NC`` (NVIDIA's unconnected inputs), and ``inN_enable`` = 0 (a
        disabled input, whose ``inN_input`` fails with ENODATA in the upstream driver).
        """
        label_path = device / ("in%d_label" % n)
        if not label_path.exists():
            return None
        label = read_attr(label_path)
        if not label or label.upper() == UNCONNECTED_LABEL:
            log.debug("skipping %s channel %d: label %r", device, n, label)
            return None
        enable_path = device / ("in%d_enable" % n)
        if enable_path.exists() and read_attr(enable_path) == "0":
            log.debug("skipping %s channel %d (%s): disabled", device, n, label)
            return None
        return label

    @property
    def rails(self) -> Tuple[str, ...]:
        return tuple(c.rail for c in self._channels)

    def read_w(self) -> Dict[str, float]:
        return {c.rail: c.read_w() for c in self._channels}

    def total_of(self, rails_w: Mapping[str, float]) -> float:
        """``VDD_IN`` on Orin NX/Nano and Xavier NX; the sum of the rails on AGX Orin, which has none."""
        return input_or_sum_w(rails_w)
