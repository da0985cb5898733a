"""A zero-dependency synthetic IMU activity stream with per-user variability.

Each class has a signature shared by the whole fleet: a gravity direction (posture), a movement
frequency, accelerometer and gyroscope amplitudes per axis and phase relations between axes.
Up to 6 classes come in pairs per posture: a calm one and a vigorous one that leans 45 degrees
away, so the tilt of a user's sensor (up to 25 degrees) blurs posture and the movement has to be
read too; more classes each get their own gravity direction. Each user, seeded by (seed, user_id), adds a sensor orientation (a random rotation of
up to 25 degrees applied to both the accel and the gyro triple), gains, a cadence factor, biases,
per-class phase habits and a noise level, so users differ but classes stay learnable by the
LSTM in ``streamfl.models`` within a few hundred SGD steps. Units: accel in g, gyro in rad/s.

The stream is rendered sample by sample in chunks of ``stride`` samples and cut by ``Windower``;
activities come in bouts (about 4 s of signal) drawn uniformly from the schedule's active classes.
"""
import math
import typing
import zlib
from typing import Iterator, List, Optional, Tuple

import numpy as np

from streamfl.errors import SensorError
from streamfl.sensors.base import SensorSource
from streamfl.sensors.config import SensorConfig
from streamfl.sensors.schedule import AllClasses, ClassSchedule
from streamfl.sensors.window import Window
from streamfl.sensors.windower import Windower

#: Fixed seed of the class signatures: every device and the coordinator must agree on them.
_CLASS_SEED = 7919
#: Largest sensor tilt of a user's mounting, degrees.
MAX_TILT_DEG = 25.0
#: Tilt of a vigorous class's gravity direction from its calm partner's, degrees.
LEAN_DEG = 45.0
#: Mean length of an activity bout, seconds of signal.
MEAN_BOUT_S = 4.0

_AXES = np.array([[0, 0, -1], [1, 0, 0], [0, -1, 0]], float)


def _directions(n: int) -> np.ndarray:
    """``n`` well separated unit vectors: axis directions up to 3, a Fibonacci sphere beyond."""
    if n <= 3:
        return _AXES[:n].copy()
    i = np.arange(n) + 0.5
    z = 1 - 2 * i / n
    r = np.sqrt(1 - z * z)
    phi = i * math.pi * (3 - math.sqrt(5))
    return np.stack([r * np.cos(phi), r * np.sin(phi), z], axis=1)


def _lean_axis(dirs: np.ndarray, p: int) -> np.ndarray:
    """Rotation axis that turns posture ``p`` away from its nearest neighbour posture."""
    others = [q for q in range(len(dirs)) if q != p]
    if not others:
        return np.cross(dirs[p], [0.0, 1.0, 0.0]) if abs(dirs[p][1]) < 0.9 else np.array([1.0, 0, 0])
    nearest = others[int(np.argmax([dirs[q] @ dirs[p] for q in others]))]
    return np.cross(dirs[nearest], dirs[p])


class ClassSignature(typing.NamedTuple):
    """What one activity looks like in the body frame, before a user's mounting and gains."""

    gravity: np.ndarray  # [3] unit vector, g
    freq_hz: float
    acc_amp: np.ndarray  # [3] g
    acc_phase: np.ndarray  # [3] rad
    harmonic: float  # relative amplitude of the second harmonic
    gyr_amp: np.ndarray  # [3] rad/s
    gyr_phase: np.ndarray  # [3] rad


def class_signatures(num_classes: int) -> List[ClassSignature]:
    """The fleet-wide signatures of classes 0..K-1 (independent of any seed or user)."""
    n_postures = int(math.ceil(num_classes / 2.0))
    dirs = _directions(n_postures)
    out = []
    for c in range(num_classes):
        rng = np.random.default_rng([_CLASS_SEED, c])
        posture, level = c % n_postures, c // n_postures
        freq = 0.9 + 1.3 * level + 0.35 * posture
        acc_scale, gyr_scale = (0.12, 0.35) if level == 0 else (0.8, 2.0)
        gravity = dirs[posture]
        if n_postures > 3:  # many classes: each its own direction, spread over the sphere
            gravity = _directions(max(num_classes, 7))[c]
        elif level:  # moving leans the sensor: tilt away from the nearest other posture
            gravity = _rotation(_lean_axis(dirs, posture), math.radians(LEAN_DEG) * level) @ gravity
        out.append(ClassSignature(
            gravity=gravity,
            freq_hz=freq,
            acc_amp=acc_scale * rng.uniform(0.3, 1.0, 3),
            acc_phase=rng.uniform(0, 2 * math.pi, 3),
            harmonic=float(rng.uniform(0.1, 0.6)),
            gyr_amp=gyr_scale * rng.uniform(0.3, 1.0, 3),
            gyr_phase=rng.uniform(0, 2 * math.pi, 3)))
    return out


def _rotation(axis: np.ndarray, angle: float) -> np.ndarray:
    """Rodrigues' rotation matrix about unit ``axis``."""
    x, y, z = axis / np.linalg.norm(axis)
    k = np.array([[0, -z, y], [z, 0, -x], [-y, x, 0]])
    return np.eye(3) + math.sin(angle) * k + (1 - math.cos(angle)) * (k @ k)


class UserProfile(typing.NamedTuple):
    """One wearer and sensor: mounting rotation, gains, cadence, biases, habits and noise."""

    user_id: int
    rotation: np.ndarray  # [3, 3]
    acc_gain: float
    gyr_gain: float
    cadence: float
    acc_bias: np.ndarray
    gyr_bias: np.ndarray
    phase_habit: np.ndarray  # [K, 6] rad added to each class's axis phases
    noise: float

    @classmethod
    def create(cls, seed: int, user_id: int, num_classes: int, noise: float) -> "UserProfile":
        """Deterministic in (seed, user_id)."""
        rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(user_id) & 0xFFFFFFFF, 1])
        axis = rng.normal(size=3)
        angle = math.radians(rng.uniform(0.0, MAX_TILT_DEG))
        return cls(
            user_id=int(user_id),
            rotation=_rotation(axis, angle),
            acc_gain=float(rng.uniform(0.8, 1.25)),
            gyr_gain=float(rng.uniform(0.8, 1.25)),
            cadence=float(rng.uniform(0.9, 1.1)),
            acc_bias=rng.normal(0, 0.02, 3),
            gyr_bias=rng.normal(0, 0.02, 3),
            phase_habit=rng.normal(0, 0.35, (num_classes, 6)),
            noise=float(noise * rng.uniform(0.7, 1.4)))


def render(sig: ClassSignature, user: UserProfile, label: int, start_sample: int, n: int,
           sample_rate_hz: float, intensity: float, rng: np.random.Generator,
           channels: int = 6) -> np.ndarray:
    """Samples ``start_sample .. start_sample + n`` of activity ``label`` for ``user``: [n, C]."""
    t = (start_sample + np.arange(n)) / sample_rate_hz
    w = 2 * math.pi * sig.freq_hz * user.cadence
    habit = user.phase_habit[label]
    arg = w * t[:, None]
    acc = sig.acc_amp * (np.sin(arg + sig.acc_phase + habit[:3])
                         + sig.harmonic * np.sin(2 * arg + 2 * sig.acc_phase))
    acc = sig.gravity + user.acc_gain * intensity * acc + user.acc_bias
    out = [acc @ user.rotation.T]
    if channels == 6:
        gyr = sig.gyr_amp * np.sin(arg + sig.gyr_phase + habit[3:])
        gyr = user.gyr_gain * intensity * gyr + user.gyr_bias
        out.append(gyr @ user.rotation.T)
    x = np.concatenate(out, axis=1)
    scale = np.array([1.0, 1.0, 1.0, 2.0, 2.0, 2.0][:channels])  # gyros are noisier
    x += rng.normal(0.0, 1.0, x.shape) * (user.noise * scale)
    return x.astype(np.float32)


def user_for_device(device_id: str) -> int:
    """A stable user id from a device id (crc32, not ``hash()``, which changes per process)."""
    return zlib.crc32(device_id.encode("utf-8")) % 100000


class SyntheticSource(SensorSource):
    """An endless labelled IMU stream for one user, with classes following a ``ClassSchedule``.

    Stream time (the schedule's clock and each window's ``t_s``) is ``time_fn()`` when given (the
    simulator's virtual clock), else window index / ``windows_per_s``, or, unpaced, the signal's
    own time (window index * stride / sample_rate_hz).
    """

    def __init__(self, cfg: SensorConfig, user_id: int = 0, schedule: Optional[ClassSchedule] = None,
                 clock=None, sleep=None, time_fn: Optional[typing.Callable[[], float]] = None):
        super().__init__(cfg.windows_per_s, clock, sleep)
        if cfg.channels not in (3, 6):
            raise SensorError("synthetic source makes 3 or 6 channels, config asks for %d"
                              % cfg.channels)
        self.cfg = cfg
        self.user_id = int(user_id)
        self.schedule = schedule or AllClasses(cfg.num_classes)
        self.profile = UserProfile.create(cfg.seed, user_id, cfg.num_classes, cfg.noise)
        self._signatures = class_signatures(cfg.num_classes)
        self._time_fn = time_fn
        self._rng = np.random.default_rng([int(cfg.seed) & 0xFFFFFFFF, self.user_id, 2])
        self._made = 0

    def stream_time(self, index: int) -> float:
        """Stream time of window ``index`` (see the class docstring)."""
        if self._time_fn is not None:
            return float(self._time_fn())
        if self.windows_per_s > 0:
            return index / self.windows_per_s
        return index * self.cfg.stride / self.cfg.sample_rate_hz

    def _pick(self, t_s: float) -> int:
        """A class drawn uniformly from those the schedule has active at ``t_s``."""
        active = tuple(int(c) for c in self.schedule.active_classes(t_s))
        bad = [c for c in active if not 0 <= c < self.cfg.num_classes]
        if not active or bad:
            raise SensorError("schedule gave classes %r at t=%.1fs; valid ids are 0..%d" % (
                active, t_s, self.cfg.num_classes - 1))
        return int(self._rng.choice(active))

    def _generate(self) -> Iterator[Window]:
        cfg = self.cfg
        windower = Windower(cfg.window_len, cfg.stride, cfg.channels, cfg.sample_rate_hz)
        chunk = cfg.stride
        p_switch = min(1.0, chunk / (MEAN_BOUT_S * cfg.sample_rate_hz))
        sample = 0
        label = -1
        intensity = 1.0
        while not self.closed:
            t_s = self.stream_time(self._made)
            if label not in self.schedule.active_classes(t_s) or self._rng.random() < p_switch:
                label = self._pick(t_s)
                intensity = float(self._rng.uniform(0.85, 1.15))
            x = render(self._signatures[label], self.profile, label, sample, chunk,
                       cfg.sample_rate_hz, intensity, self._rng, cfg.channels)
            sample += chunk
            for window in windower.push(x, label):
                window.t_s = self.stream_time(self._made)
                self._made += 1
                yield window


def synthetic_dataset(n_windows: int, users, seed: int, cfg: Optional[SensorConfig] = None
                      ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A fixed, class-balanced held-out set: ``(X [N, T, C] float32, y [N] int64, subject [N])``.

    ``users`` is a count (ids 0..users-1) or a sequence of user ids; user profiles come from
    ``cfg.seed`` as on the devices, ``seed`` drives window phases, intensities and noise.
    Window i has class ``i % K`` and user ``users[(i // K) % len(users)]``.
    """
    cfg = cfg or SensorConfig()
    if n_windows < 0:
        raise ValueError("n_windows must be >= 0, got %r" % n_windows)
    user_ids = list(range(users)) if isinstance(users, (int, np.integer)) else [int(u) for u in users]
    if not user_ids:
        raise ValueError("synthetic_dataset needs at least one user")
    if cfg.channels not in (3, 6):
        raise SensorError("synthetic data has 3 or 6 channels, config asks for %d" % cfg.channels)
    k, t = cfg.num_classes, cfg.window_len
    sigs = class_signatures(k)
    profiles = {u: UserProfile.create(cfg.seed, u, k, cfg.noise) for u in set(user_ids)}
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, 3])
    X = np.empty((n_windows, t, cfg.channels), dtype=np.float32)
    y = np.arange(n_windows, dtype=np.int64) % k
    subject = np.array([user_ids[(i // k) % len(user_ids)] for i in range(n_windows)], dtype=np.int64)
    for i in range(n_windows):
        start = int(rng.integers(0, 10 ** 6))
        X[i] = render(sigs[y[i]], profiles[int(subject[i])], int(y[i]), start, t, cfg.sample_rate_hz,
                      float(rng.uniform(0.85, 1.15)), rng, cfg.channels)
    return X, y, subject
