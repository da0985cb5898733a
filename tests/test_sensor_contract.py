"""The sensor-source contract suite (as test_dvfs_contract.py: one suite per interface, every
implementation): what ``sensors/base.py`` promises, held against every kind ``sensors/factory.py``
builds (synthetic, replay of an .npz, Linux IIO on a fake sysfs tree as test_iio.py makes it, and
an MQTT topic on the in-memory broker), each built through ``make_source`` as the agent does.

Per kind, a case says how to configure it and how to give it data: the replay file is written
up front, the fake IIO device produces a new sample whenever the source waits for one, and a
publisher puts windows on the MQTT sensor topic. Kind-specific behaviour (signal realism, pacing,
IIO scaling, payload encodings) stays in the per-source test files.
"""
import itertools
import threading
import time

import numpy as np
import pytest

from streamfl.errors import SensorError, StreamflError
from streamfl.protocol.transport.memory import MemoryBroker, MemoryTransport
from streamfl.sensors import (ManualClock, SensorConfig, SensorSource, Window, encode_window_binary,
                              make_source, save_npz)
from streamfl.sensors.config import KINDS as CONFIG_KINDS
from streamfl.sensors.window import UNLABELLED
from test_iio import SensorClock, make_device

#: Every sensor source kind; a new one is a case class below and one entry here.
KINDS = ("synthetic", "replay", "iio", "mqtt")
FLEET, DEVICE = "f1", "dev-1"
TOPIC = "streamfl/v1/f1/device/dev-1/sensor"
T, STRIDE, K = 12, 6, 4
N = 12  # windows each check pulls


def take(source, n=N):
    return list(itertools.islice(source.windows(), n))


class Case:
    """Builds one kind of source with ``channels`` channels, in virtual time unless ``real``."""

    def __init__(self, tmp_path, channels):
        self.tmp_path = tmp_path
        self.channels = channels

    def config(self, **over) -> SensorConfig:
        fields = dict(kind=self.kind, window_len=T, stride=STRIDE, channels=self.channels,
                      num_classes=K, windows_per_s=0.0, seed=0)
        fields.update(self.fields())
        fields.update(over)
        return SensorConfig(**fields)

    def fields(self):
        return {}

    def build(self, real=False, **over) -> SensorSource:
        """A fresh source over the same data (``real``: real-time clock, slow enough to block)."""
        return make_source(self.config(**over), DEVICE, clock=None if real else ManualClock())

    def feed(self, source, n=N):
        """Give ``source`` the data for ``n`` windows, where it does not produce its own."""

    def close(self):
        pass


class SyntheticCase(Case):
    kind = "synthetic"

    def fields(self):
        return {"schedule": "all"}

    def build(self, real=False, **over):
        if real:
            over.setdefault("windows_per_s", 0.2)  # one window per 5 s: the source waits
        return super().build(real, **over)


class ReplayCase(Case):
    kind = "replay"

    def __init__(self, tmp_path, channels):
        super().__init__(tmp_path, channels)
        rng = np.random.default_rng(5)
        n = 30
        X = rng.normal(size=(n, T, channels)).astype(np.float32)
        y = np.arange(n) % K
        self.path = save_npz(tmp_path / "replay.npz", X, y, np.zeros(n, np.int64),
                             ["c%d" % k for k in range(K)])

    def fields(self):
        return {"path": str(self.path), "loop": True, "shuffle": True}

    def build(self, real=False, **over):
        if real:
            over.setdefault("windows_per_s", 0.2)
        return super().build(real, **over)


def moving(dev, n):
    """The fake IMU's next sample: accel x counts up (one file write: writes are slow on some CI
    disks, and test_iio.py checks every axis)."""
    (dev / "in_accel_x_raw").write_text("%d\n" % n)


class IioCase(Case):
    kind = "iio"

    def __init__(self, tmp_path, channels):
        super().__init__(tmp_path, channels)
        self.root = tmp_path / "sys"
        self.dev = make_device(self.root, gyro=channels == 6)
        self.label_file = tmp_path / "label"
        self.label_file.write_text("%d\n" % (K - 1))  # the highest class id is still in range

    def fields(self):
        return {"iio_root": str(self.root), "iio_device": "mpu6050",
                "label_path": str(self.label_file)}

    def build(self, real=False, **over):
        if real:  # a sample every 5 s; the first window is far off
            return make_source(self.config(sample_rate_hz=0.2, **over), DEVICE)
        # Every wait of the source is one sample period: the fake device moves on one sample.
        return make_source(self.config(**over), DEVICE, clock=SensorClock(self.dev, moving))


class MqttCase(Case):
    kind = "mqtt"

    def __init__(self, tmp_path, channels):
        super().__init__(tmp_path, channels)
        self.broker = MemoryBroker(propagate_errors=True)
        self.publisher = MemoryTransport(self.broker, "phone")
        self.publisher.connect()
        self.devices = []

    def build(self, real=False, **over):
        device = MemoryTransport(self.broker, "%s-%d" % (DEVICE, len(self.devices)))
        device.connect()
        self.devices.append(device)
        return make_source(self.config(**over), DEVICE, transport=device, fleet=FLEET,
                           clock=None if real else ManualClock())

    def feed(self, source, n=N):
        rng = np.random.default_rng(9)
        for i in range(n):
            window = Window(rng.normal(size=(T, self.channels)).astype(np.float32), i % K, float(i))
            assert self.publisher.publish(TOPIC, encode_window_binary(window), qos=1)

    def close(self):
        for t in self.devices + [self.publisher]:
            t.close()


CASES = {c.kind: c for c in (SyntheticCase, ReplayCase, IioCase, MqttCase)}


@pytest.fixture(params=[(kind, c) for kind in KINDS for c in (3, 6)],
                ids=["%s-%dch" % (kind, c) for kind in KINDS for c in (3, 6)])
def case(request, tmp_path):
    kind, channels = request.param
    made = CASES[kind](tmp_path, channels)
    try:
        yield made
    finally:
        made.close()


def test_every_configurable_kind_is_under_contract():
    assert set(KINDS) == set(CONFIG_KINDS) == set(CASES)


def windows_of(case, **over):
    source = case.build(**over)
    case.feed(source)
    return source, take(source)


def test_windows_have_the_configured_shape_dtype_and_labels(case):
    source, ws = windows_of(case)
    assert len(ws) == N and source.emitted == N
    for w in ws:
        assert isinstance(w, Window)
        assert w.x.shape == (T, case.channels) and w.x.dtype == np.float32
        assert np.isfinite(w.x).all()
        assert isinstance(w.label, int) and (0 <= w.label < K or w.label == UNLABELLED)
        assert isinstance(w.t_s, float) and np.isfinite(w.t_s)
    assert all(0 <= w.label < K for w in ws)          # every case here labels its windows
    assert len({w.x.tobytes() for w in ws}) > 1       # a stream, not one window repeated
    times = [w.t_s for w in ws]
    assert times == sorted(times)                      # stream time never goes back
    source.close()


def test_the_same_setup_gives_the_same_windows(case):
    _, a = windows_of(case)
    _, b = windows_of(case)
    assert [w.label for w in a] == [w.label for w in b]
    assert [w.t_s for w in a] == [w.t_s for w in b]
    for wa, wb in zip(a, b):
        np.testing.assert_array_equal(wa.x, wb.x)


#: Kinds whose config has a seed that changes the stream (synthetic: the user's signal; replay:
#: the shuffled order); the others replay what their hardware or publisher gives.
SEEDED = ("synthetic", "replay")


@pytest.mark.parametrize("kind", SEEDED)
def test_another_seed_gives_another_stream(tmp_path, kind):
    case = CASES[kind](tmp_path, 6)
    a = take(case.build(seed=1))
    b = take(case.build(seed=2))
    assert not all(np.array_equal(wa.x, wb.x) for wa, wb in zip(a, b))


def test_close_ends_the_stream_and_is_idempotent(case):
    source = case.build()
    case.feed(source, 2 * N)
    it = source.windows()
    first = next(it)
    assert isinstance(first, Window) and not source.closed
    source.close()
    assert source.closed
    assert list(it) == []                  # the running iterator ends
    assert take(source) == []              # and a new one yields nothing
    source.close()                         # a second close is harmless
    assert source.emitted == 1


def test_leaving_a_with_block_closes_the_source(case):
    with case.build() as source:
        case.feed(source)
        assert take(source, 1)
    assert source.closed and take(source) == []


def test_close_from_another_thread_interrupts_a_blocked_consumer(case):
    """base.py: ``close()`` is safe from any thread and a blocked ``windows()`` returns promptly
    (pacing waits on the real clock, an IIO poll, an empty MQTT queue)."""
    source = case.build(real=True)
    got = []
    started = threading.Event()

    def consume():
        started.set()
        for w in source.windows():
            got.append(w)

    th = threading.Thread(target=consume, daemon=True)
    th.start()
    assert started.wait(5)
    time.sleep(0.1)                        # now blocked: the next window is seconds away
    t0 = time.monotonic()
    source.close()
    th.join(2.0)
    assert not th.is_alive(), "windows() still blocked after close()"
    assert time.monotonic() - t0 < 0.5    # (an MQTT source polls its queue once a second)
    assert len(got) <= 1 and source.closed


#: How each kind's sensor can be missing, and what the error must name; synthetic has no sensor.
MISSING = {
    "replay": (lambda tmp: dict(path=str(tmp / "nope.npz")), "nope.npz"),
    "iio": (lambda tmp: dict(iio_root=str(tmp / "empty")), "empty"),
    "iio-device": (lambda tmp: dict(iio_device="lsm6ds3"), "lsm6ds3"),
    "mqtt": (None, "transport"),
}


def test_every_kind_with_a_sensor_has_a_missing_sensor_case():
    assert {k.split("-")[0] for k in MISSING} == set(KINDS) - {"synthetic"}


@pytest.mark.parametrize("missing", sorted(MISSING))
def test_a_missing_sensor_is_a_clear_sensor_error(tmp_path, missing):
    kind = missing.split("-")[0]
    case = CASES[kind](tmp_path, 6)
    over, named = MISSING[missing]
    try:
        with pytest.raises(SensorError, match=named) as info:
            if over is None:                               # mqtt: no transport to listen on
                make_source(case.config(), DEVICE, transport=None, fleet=FLEET)
            else:
                case.build(**over(tmp_path))
    finally:
        case.close()
    assert isinstance(info.value, StreamflError)
