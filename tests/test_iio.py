"""Linux IIO source on a fake sysfs tree: scaling, offsets, name lookup, labels, polling, errors."""
import itertools

import numpy as np
import pytest

from streamfl.errors import SensorError
from streamfl.sensors import IioSource, ManualClock, SensorConfig, make_source
from streamfl.sensors.iio import find_device
from streamfl.sensors.window import UNLABELLED

AXES = "xyz"


def make_device(root, index=0, name="mpu6050", gyro=True, accel_scale="0.000598",
                gyro_scale="0.001064", extra=None):
    dev = root / "bus" / "iio" / "devices" / ("iio:device%d" % index)
    dev.mkdir(parents=True)
    (dev / "name").write_text(name + "\n")
    (dev / "in_accel_scale").write_text(accel_scale + "\n")
    for a in AXES:
        (dev / ("in_accel_%s_raw" % a)).write_text("0\n")
    if gyro:
        (dev / "in_anglvel_scale").write_text(gyro_scale + "\n")
        for a in AXES:
            (dev / ("in_anglvel_%s_raw" % a)).write_text("0\n")
    for fname, text in (extra or {}).items():
        (dev / fname).write_text(text + "\n")
    return dev


class SensorClock(ManualClock):
    """Virtual time; every wait lets the fake hardware produce a new sample."""

    def __init__(self, dev, step):
        super().__init__(0.0)
        self.dev = dev
        self.step = step
        self.n = 0
        self.write()

    def write(self):
        self.step(self.dev, self.n)

    def wait(self, seconds, stop):
        super().wait(seconds, stop)
        self.n += 1
        self.write()


def counting(dev, n):
    """Raw value n on accel x, 2n on accel y, -n on gyro z."""
    (dev / "in_accel_x_raw").write_text("%d\n" % n)
    (dev / "in_accel_y_raw").write_text("%d\n" % (2 * n))
    if (dev / "in_anglvel_z_raw").exists():
        (dev / "in_anglvel_z_raw").write_text("%d\n" % -n)


def test_windows_of_scaled_samples_polled_at_the_rate(tmp_path):
    dev = make_device(tmp_path)
    clock = SensorClock(dev, counting)
    src = IioSource(tmp_path, "iio:device0", rate_hz=10.0, window_len=4, stride=2, clock=clock)
    assert src.channels == 6
    ws = list(itertools.islice(src.windows(), 3))
    assert clock.waits == pytest.approx([0.1] * 7)  # 8 samples, polled every 0.1 s
    np.testing.assert_allclose(ws[0].x[:, 0], np.arange(4) * 0.000598, rtol=1e-6)
    np.testing.assert_allclose(ws[0].x[:, 1], np.arange(4) * 2 * 0.000598, rtol=1e-6)
    np.testing.assert_allclose(ws[1].x[:, 5], -np.arange(2, 6) * 0.001064, rtol=1e-6)
    assert (ws[2].x[:, [2, 3, 4]] == 0).all()
    assert [w.t_s for w in ws] == pytest.approx([0.3, 0.5, 0.7])  # time of each last sample
    assert all(w.label == UNLABELLED for w in ws)


def test_per_axis_scale_and_offsets_follow_the_iio_abi(tmp_path):
    dev = make_device(tmp_path, gyro=False, extra={
        "in_accel_x_scale": "0.5", "in_accel_offset": "10", "in_accel_z_offset": "-4"})
    for a, v in zip(AXES, (2, 3, 4)):
        (dev / ("in_accel_%s_raw" % a)).write_text("%d\n" % v)
    src = IioSource(tmp_path, "iio:device0", window_len=1, stride=1, clock=ManualClock())
    assert src.channels == 3
    # (raw + offset) * scale; per-axis files win over the shared ones
    np.testing.assert_allclose(src.read_sample(), [(2 + 10) * 0.5, (3 + 10) * 0.000598,
                                                   (4 - 4) * 0.000598], rtol=1e-6)


def test_device_found_by_name(tmp_path):
    make_device(tmp_path, 0, name="ina3221")
    dev = make_device(tmp_path, 1, name="bmi160")
    assert find_device(tmp_path, "bmi160") == dev
    assert find_device(tmp_path, "iio:device1") == dev
    with pytest.raises(SensorError, match=r"'lsm6ds3' not found.*iio:device0 \(ina3221\)"):
        find_device(tmp_path, "lsm6ds3")
    src = make_source(SensorConfig(kind="iio", iio_root=str(tmp_path), iio_device="bmi160"), "d",
                      clock=ManualClock())
    assert src.device_path == dev and src.channels == 6


def test_label_file_is_reread_every_window(tmp_path):
    dev = make_device(tmp_path)
    label_file = tmp_path / "label"

    def labelled(d, n):
        counting(d, n)
        if n == 4:
            label_file.write_text("3\n")
        elif n == 8:
            label_file.write_text("")
        elif n == 10:
            label_file.write_text("walking\n")
        elif n == 12:
            label_file.write_text("1")

    clock = SensorClock(dev, labelled)
    src = IioSource(tmp_path, "iio:device0", window_len=4, stride=4, label_path=label_file,
                    clock=clock)
    labels = [w.label for w in itertools.islice(src.windows(), 4)]
    # samples 0-3 before the file exists; 4-7 read "3"; 8-11 empty; 12-15 "1"
    assert labels == [UNLABELLED, 3, UNLABELLED, 1]


def test_majority_label_when_the_label_changes_mid_window(tmp_path):
    dev = make_device(tmp_path)
    label_file = tmp_path / "label"
    label_file.write_text("2")

    def switch(d, n):
        counting(d, n)
        if n == 4:
            label_file.write_text("5")

    clock = SensorClock(dev, switch)
    src = IioSource(tmp_path, "iio:device0", window_len=6, stride=2, label_path=label_file,
                    clock=clock)
    ws = list(itertools.islice(src.windows(), 3))
    # the file is read every 2 samples: samples 0-3 are labelled 2, then 5 from sample 4 on
    assert [w.label for w in ws] == [2, 5, 5]  # 2,2,2,2,5,5 | 2,2,5,5,5,5 | 5,5,5,5,5,5
    np.testing.assert_allclose(ws[0].x[:, 0], np.arange(6) * 0.000598, rtol=1e-6)


def test_missing_device_or_channel_names_the_path(tmp_path):
    with pytest.raises(SensorError, match=str(tmp_path / "bus" / "iio" / "devices")):
        IioSource(tmp_path)
    dev = make_device(tmp_path, gyro=False)
    with pytest.raises(SensorError, match=r"in_anglvel_x_raw"):
        IioSource(tmp_path, channels=6)
    (dev / "in_accel_y_raw").unlink()
    with pytest.raises(SensorError, match=str(dev / "in_accel_y_raw")):
        IioSource(tmp_path)
    with pytest.raises(SensorError, match="iio:device7"):
        IioSource(tmp_path, "iio:device7")


def test_unreadable_values_become_sensor_errors(tmp_path):
    dev = make_device(tmp_path, gyro=False)
    src = IioSource(tmp_path, window_len=2, stride=1, clock=ManualClock())
    (dev / "in_accel_z_raw").write_text("oops")
    with pytest.raises(SensorError, match="in_accel_z_raw holds no number"):
        src.read_sample()
    (dev / "in_accel_z_raw").unlink()
    with pytest.raises(SensorError, match="cannot read IIO channel .*in_accel_z_raw"):
        next(src.windows())
    (dev / "in_accel_scale").write_text("x")
    with pytest.raises(SensorError, match="in_accel_scale"):
        IioSource(tmp_path)


def test_falling_behind_resynchronises_instead_of_bursting(tmp_path):
    make_device(tmp_path, gyro=False)
    clock = ManualClock()
    src = IioSource(tmp_path, rate_hz=10.0, window_len=1, stride=1, clock=clock)
    it = src.windows()
    next(it)
    clock.advance(3.0)  # 30 periods late
    next(it)
    next(it)
    assert src.overruns == 1
    assert clock.waits == pytest.approx([0.1])

