"""The ``sensor:`` section of an agent or scenario config: which source, its shape and its pacing.

Defaults give the zero-dependency synthetic IMU stream shaped like ``ModelSpec``'s defaults
(6 channels, 50-sample windows, 6 classes). Bad values raise ``ValueError`` in ``__post_init__``;
the config loader turns that into ``ConfigError`` naming the file.
"""
from dataclasses import dataclass
from typing import Optional

from streamfl.config import SEED_MAX, bounded

KINDS = ("synthetic", "replay", "iio", "mqtt")
SCHEDULES = ("rotating", "all")


@dataclass(frozen=True)
class SensorConfig:
    """Where windows come from and how fast; fields a kind does not use are ignored by it."""

    #: "synthetic" (generated IMU), "replay" (an .npz file), "iio" (Linux IIO sysfs), "mqtt" (topic).
    kind: str = "synthetic"
    #: Windows handed out per second; 0 = unpaced (as fast as the consumer pulls, e.g. simulator).
    #: Ignored by iio (paced by ``sample_rate_hz``) and mqtt (paced by the publisher).
    windows_per_s: float = bounded(5.0, 0.0, 1e4)
    #: Samples per window (T); must match the model's ``window_len``.
    window_len: int = bounded(50, 1, 100000)
    #: Samples between window starts; ``stride < window_len`` overlaps windows (50% by default).
    stride: int = bounded(25, 1, 100000)
    #: Channels per sample (C): 6 = accel xyz + gyro xyz, 3 = accel only.
    channels: int = bounded(6, 1, 1024)
    #: Classes K; labels are 0..K-1. Must match the model's ``num_classes``.
    num_classes: int = bounded(6, 2, 4096)
    #: Seed of the synthetic user profile and noise, and of replay shuffling.
    seed: int = bounded(0, 0, SEED_MAX)
    #: Synthetic user (body, mounting, noise); None = derived from a stable hash of the device id.
    user_id: Optional[int] = bounded(None, 0, SEED_MAX)
    #: Order in which classes appear: "rotating" (a few at a time, per-device offset) or "all".
    schedule: str = "rotating"
    #: Classes active at once under the rotating schedule ("one or two activities at a time").
    classes_per_phase: int = bounded(2, 1, 4096)
    #: Seconds of stream time per rotating phase.
    phase_s: float = bounded(30.0, 0.0, 1e7, lo_open=True)
    #: Rotating: position in the class order where this device starts (so devices differ);
    #: None = user_id % num_classes.
    phase_offset: Optional[int] = bounded(None, 0, 10 ** 6)
    #: Replay: path of a dataset .npz (X, y, subject, classes; see streamfl.sensors.datasets).
    path: Optional[str] = None
    #: Replay: start again at the end instead of stopping.
    loop: bool = True
    #: Replay: keep only this subject's windows.
    subject: Optional[int] = bounded(None, 0, SEED_MAX)
    #: Replay: shuffle the window order (seeded by ``seed``, reshuffled every loop).
    shuffle: bool = False
    #: IIO: sysfs root (a constructor argument so tests use a fake tree).
    iio_root: str = "/sys"
    #: IIO: device directory name (``iio:device0``) or the contents of its ``name`` file.
    iio_device: str = "iio:device0"
    #: Samples per second: IIO polling rate, and the synthetic signal's sampling rate.
    sample_rate_hz: float = bounded(50.0, 0.0, 1e5, lo_open=True)
    #: IIO: text file holding the current class id (re-read every window); missing = unlabelled.
    label_path: Optional[str] = None
    #: Synthetic: sensor noise standard deviation (accel in g, gyro in rad/s) before per-user gain.
    noise: float = bounded(0.05, 0.0, 100.0)
    #: MQTT: windows held between the network thread and the consumer; the oldest is dropped.
    queue_len: int = bounded(256, 1, 10 ** 6)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError("sensor kind must be one of %s, got %r" % (", ".join(KINDS), self.kind))
        if self.schedule not in SCHEDULES:
            raise ValueError("sensor schedule must be one of %s, got %r" % (
                ", ".join(SCHEDULES), self.schedule))
        if not self.windows_per_s >= 0:
            raise ValueError("sensor windows_per_s must be >= 0 (0 = unpaced), got %r" % (
                self.windows_per_s,))
        for key in ("window_len", "stride", "channels", "classes_per_phase", "queue_len"):
            if getattr(self, key) < 1:
                raise ValueError("sensor %s must be >= 1, got %r" % (key, getattr(self, key)))
        if self.num_classes < 2:
            raise ValueError("sensor num_classes must be >= 2, got %r" % (self.num_classes,))
        if self.classes_per_phase > self.num_classes:
            raise ValueError("sensor classes_per_phase (%d) exceeds num_classes (%d)" % (
                self.classes_per_phase, self.num_classes))
        if not self.phase_s > 0:
            raise ValueError("sensor phase_s must be > 0, got %r" % (self.phase_s,))
        if not self.sample_rate_hz > 0:
            raise ValueError("sensor sample_rate_hz must be > 0, got %r" % (self.sample_rate_hz,))
        if not self.noise >= 0:
            raise ValueError("sensor noise must be >= 0, got %r" % (self.noise,))
        if self.phase_offset is not None and self.phase_offset < 0:
            raise ValueError("sensor phase_offset must be >= 0, got %r" % (self.phase_offset,))
        if self.user_id is not None and self.user_id < 0:
            raise ValueError("sensor user_id must be >= 0, got %r" % (self.user_id,))
        if self.kind == "replay" and not self.path:
            raise ValueError("sensor kind 'replay' needs a path to a dataset .npz")
        if self.kind == "synthetic" and self.channels not in (3, 6):
            raise ValueError("synthetic sensor channels must be 3 (accel) or 6 (accel + gyro), got %r"
                             % (self.channels,))
        if self.kind == "iio" and self.channels not in (3, 6):
            raise ValueError("iio sensor channels must be 3 (accel) or 6 (accel + gyro), got %r"
                             % (self.channels,))
