"""A real IMU on Linux: poll the IIO sysfs attributes of an accelerometer (and gyroscope).

Reads ``in_accel_{x,y,z}_raw`` (and ``in_anglvel_{x,y,z}_raw`` when present) under
``{sysfs_root}/bus/iio/devices/{device}`` at ``rate_hz`` and converts them as the kernel's IIO ABI
says: ``(raw + offset) * scale``, with per-axis ``in_accel_x_scale``/``_offset`` preferred over the
shared ``in_accel_scale``/``_offset``. Units: m/s^2 and rad/s. Samples are cut into windows by
``Windower``; the class label, if any, comes from a text file that a labelling tool rewrites.
Sysfs polling suits the 50 Hz of activity recognition; the buffered ``/dev/iio:deviceN`` interface
is not used.
"""
import logging
from pathlib import Path
from typing import Iterator, List, Optional, Tuple, Union

import numpy as np

from streamfl.errors import SensorError
from streamfl.sensors.base import SensorSource
from streamfl.sensors.window import UNLABELLED, Window
from streamfl.sensors.windower import Windower

log = logging.getLogger(__name__)

AXES = ("x", "y", "z")
#: After falling this many sample periods behind, polling restarts from now instead of bursting.
MAX_LAG_PERIODS = 5


def _read_text(path: Path) -> str:
    with open(str(path), "rb") as fh:
        return fh.read().decode("ascii", "replace").strip()


def find_device(sysfs_root: Union[str, Path], device: str) -> Path:
    """The device directory for ``iio:deviceN`` or for the driver name in a device's ``name`` file."""
    base = Path(sysfs_root) / "bus" / "iio" / "devices"
    if not base.is_dir():
        raise SensorError("no IIO devices: %s does not exist (is the sensor driver loaded?)" % base)
    direct = base / device
    if direct.is_dir():
        return direct
    names = []
    for entry in sorted(base.iterdir()):
        name_file = entry / "name"
        try:
            name = _read_text(name_file)
        except OSError:
            continue
        names.append("%s (%s)" % (entry.name, name))
        if name == device:
            return entry
    raise SensorError("IIO device %r not found: no %s and no device named so (found: %s)" % (
        device, direct, ", ".join(names) or "none"))


class _Channel:
    """One axis: raw attribute path plus the offset and scale read once at start."""

    def __init__(self, dev: Path, kind: str, axis: str):
        self.raw_path = dev / ("in_%s_%s_raw" % (kind, axis))
        if not self.raw_path.is_file():
            raise SensorError("IIO channel missing: %s" % self.raw_path)
        self.scale = self._attr(dev, kind, axis, "scale", 1.0)
        self.offset = self._attr(dev, kind, axis, "offset", 0.0)

    @staticmethod
    def _attr(dev: Path, kind: str, axis: str, what: str, default: float) -> float:
        for path in (dev / ("in_%s_%s_%s" % (kind, axis, what)), dev / ("in_%s_%s" % (kind, what))):
            if path.is_file():
                try:
                    return float(_read_text(path))
                except (OSError, ValueError) as exc:
                    raise SensorError("cannot read IIO attribute %s: %s" % (path, exc)) from exc
        if what == "scale":
            log.warning("no in_%s_%s_scale or in_%s_scale under %s: using raw values", kind, axis,
                        kind, dev)
        return default

    def read(self) -> float:
        try:
            return (float(_read_text(self.raw_path)) + self.offset) * self.scale
        except OSError as exc:
            raise SensorError("cannot read IIO channel %s: %s" % (self.raw_path, exc)) from exc
        except ValueError as exc:
            raise SensorError("IIO channel %s holds no number: %s" % (self.raw_path, exc)) from exc


class IioSource(SensorSource):
    """Windows of an IIO IMU polled at ``rate_hz``; channels are accel x,y,z then gyro x,y,z.

    ``channels`` None takes the gyro when all three ``in_anglvel_*_raw`` exist; 6 requires it.
    ``label_path`` holds the current class id as text, re-read once per ``stride`` samples (once a
    window); a missing, empty or unparsable file means ``UNLABELLED``.
    """

    def __init__(self, sysfs_root: Union[str, Path] = Path("/sys"), device: str = "iio:device0",
                 rate_hz: float = 50.0, window_len: int = 50, stride: int = 25,
                 label_path: Optional[Union[str, Path]] = None, channels: Optional[int] = None,
                 clock=None, sleep=None):
        super().__init__(0.0, clock, sleep)  # paced by the sampling itself
        if not rate_hz > 0:
            raise SensorError("IIO rate_hz must be > 0, got %r" % (rate_hz,))
        if channels not in (None, 3, 6):
            raise SensorError("IIO source gives 3 (accel) or 6 (accel + gyro) channels, not %r"
                              % (channels,))
        self.device_path = find_device(sysfs_root, device)
        self.rate_hz = float(rate_hz)
        self.label_path = Path(label_path) if label_path else None
        self._windower = Windower(window_len, stride, None, self.rate_hz)
        self.stride = int(stride)
        chans: List[_Channel] = [_Channel(self.device_path, "accel", a) for a in AXES]
        gyro_present = all((self.device_path / ("in_anglvel_%s_raw" % a)).is_file() for a in AXES)
        if channels == 6 or (channels is None and gyro_present):
            chans += [_Channel(self.device_path, "anglvel", a) for a in AXES]
        self._channels = chans
        self.channels = len(chans)
        self._bad_label = None
        #: Polls that came too late by more than MAX_LAG_PERIODS (the clock was resynchronised).
        self.overruns = 0

    def read_sample(self) -> np.ndarray:
        """One sample [C] in physical units."""
        return np.array([ch.read() for ch in self._channels], dtype=np.float32)

    def read_label(self) -> int:
        """The class id in ``label_path``; ``UNLABELLED`` when absent, empty or not a class id."""
        if self.label_path is None:
            return UNLABELLED
        try:
            text = _read_text(self.label_path)
        except OSError:
            return UNLABELLED
        if not text:
            return UNLABELLED
        try:
            label = int(text)
        except ValueError:
            label = UNLABELLED
        if label < 0:
            if text != self._bad_label:
                log.warning("label file %s holds %r, not a class id: windows are unlabelled",
                            self.label_path, text)
                self._bad_label = text
            return UNLABELLED
        self._bad_label = None
        return label

    def _generate(self) -> Iterator[Window]:
        period_s = 1.0 / self.rate_hz
        next_s = self.clock.now()
        label: Tuple[int, int] = (self.read_label(), 0)  # (label, samples since it was read)
        while not self.closed:
            now_s = self.clock.now()
            if next_s > now_s:
                self.clock.wait(next_s - now_s, self._closed)
                if self.closed:
                    return
                now_s = self.clock.now()
            elif now_s - next_s > MAX_LAG_PERIODS * period_s:
                self.overruns += 1
                if self.overruns == 1 or self.overruns % 100 == 0:
                    log.warning("IIO polling fell %.3fs behind (%d times): resynchronising",
                                now_s - next_s, self.overruns)
                next_s = now_s
            if label[1] >= self.stride:
                label = (self.read_label(), 0)
            sample = self.read_sample()
            next_s += period_s
            windows = self._windower.push(sample[None, :], label[0], t_s=now_s)
            label = (label[0], label[1] + 1)
            for window in windows:
                yield window
