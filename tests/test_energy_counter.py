"""The energy counter: trapezoid accuracy in virtual time, the sampling thread, the bounded ring,
RAPL counter wrap-around through the counter, and gaps left by meter errors."""
import logging
import math
import time
from pathlib import Path

import pytest

from streamfl.dvfs.power.base import PowerError, PowerMeter
from streamfl.dvfs.power.energy import EnergyCounter
from streamfl.dvfs.power.rapl import RaplMeter


class ProfileMeter(PowerMeter):
    """Power given by ``profile(t)`` at the time ``now`` points to; raises inside failure windows."""

    kind = "profile"

    def __init__(self, profile, failures=()):
        self.profile = profile
        self.failures = list(failures)  # (start_s, end_s, exception)
        self.now_s = 0.0
        self.reads = 0

    @property
    def rails(self):
        return ("board",)

    def read_w(self):
        self.reads += 1
        for start_s, end_s, exc in self.failures:
            if start_s <= self.now_s < end_s:
                raise exc
        return {"board": self.profile(self.now_s)}


def drive(counter, meter, t_start_s, t_end_s, step_s):
    """Sample in virtual time from ``t_start_s`` to ``t_end_s`` inclusive."""
    n = int(round((t_end_s - t_start_s) / step_s))
    for k in range(n + 1):
        meter.now_s = t_start_s + k * step_s
        counter.sample_once(meter.now_s)


def test_trapezoid_is_exact_for_linear_power_and_close_for_a_sine():
    meter = ProfileMeter(lambda t: 2.0 + 3.0 * t)
    counter = EnergyCounter(meter, rate_hz=10.0, clock=lambda: meter.now_s)
    drive(counter, meter, 0.0, 10.0, 0.1)
    assert counter.total_j() == pytest.approx(2.0 * 10 + 1.5 * 100)
    assert counter.joules_between(0.0, 10.0) == pytest.approx(170.0)
    assert counter.last_w() == pytest.approx(32.0)
    # Edges inside a sample interval are interpolated linearly: error below slope * dt^2.
    exact = (2.0 * 7.05 + 1.5 * 7.05 ** 2) - (2.0 * 2.05 + 1.5 * 2.05 ** 2)
    assert counter.joules_between(2.05, 7.05) == pytest.approx(exact, abs=3.0 * 0.1 ** 2)

    sine = ProfileMeter(lambda t: 5.0 + 2.0 * math.sin(t))
    counter = EnergyCounter(sine, rate_hz=10.0, clock=lambda: sine.now_s)
    drive(counter, sine, 0.0, 2 * math.pi, 2 * math.pi / 63)
    assert counter.total_j() == pytest.approx(5.0 * 2 * math.pi, abs=1e-3)
    assert counter.errors == 0 and counter.gap_s == 0.0


def test_thread_mode_at_50_hz_integrates_a_constant_meter():
    meter = ProfileMeter(lambda t: 5.0)
    with EnergyCounter(meter, rate_hz=50.0) as counter:
        assert counter.running
        t0_s = time.monotonic()
        time.sleep(0.3)
        t1_s = time.monotonic()
    assert not counter.running
    assert 5 <= meter.reads <= 40  # ~16 at 50 Hz
    assert counter.joules_between(t0_s, t1_s) == pytest.approx(5.0 * (t1_s - t0_s), rel=0.05)
    assert counter.total_j() == pytest.approx(5.0 * 0.3, rel=0.3)
    counter.stop()  # idempotent


def test_thread_keeps_going_when_every_read_fails(caplog):
    meter = ProfileMeter(lambda t: 1.0, failures=[(-1.0, 1.0, PowerError("sensor gone"))])
    counter = EnergyCounter(meter, rate_hz=50.0)
    counter.start()
    counter.start()  # idempotent: still one thread
    time.sleep(0.1)
    assert counter.running
    counter.stop()
    assert counter.errors >= 3
    assert counter.last_w() is None
    with pytest.raises(ValueError, match="no samples"):
        counter.joules_between(0.0, 1.0)
    assert sum("sensor gone" in r.getMessage() for r in caplog.records) == 1


def test_ring_is_bounded_and_wraps():
    meter = ProfileMeter(lambda t: 2.0 if t < 5.0 else 4.0)
    counter = EnergyCounter(meter, rate_hz=10.0, clock=lambda: meter.now_s, history_s=1.0)
    drive(counter, meter, 0.0, 10.0, 0.1)  # 101 samples through an 11-slot ring
    assert counter.total_j() == pytest.approx(2.0 * 5.0 + 4.0 * 5.0 + 0.1)  # one mixed interval
    assert counter.joules_between(9.0, 10.0) == pytest.approx(4.0)
    for start_s in (9.0, 9.05, 9.33, 9.5, 9.91):  # windows across the ring's physical wrap
        assert counter.joules_between(start_s, 10.0) == pytest.approx(4.0 * (10.0 - start_s))
    with pytest.raises(ValueError, match="older than the oldest sample"):
        counter.joules_between(8.95, 10.0)
    with pytest.raises(ValueError, match="before it starts"):
        counter.joules_between(9.8, 9.5)
    # Past the newest sample the newest power is held.
    assert counter.joules_between(10.0, 10.5) == pytest.approx(2.0)


def test_counter_over_a_wrapping_rapl_counter(tmp_path):
    max_uj = 262143328850
    zone = Path(tmp_path) / "class/powercap/intel-rapl:0"
    zone.mkdir(parents=True)
    (zone / "name").write_text("package-0\n")
    (zone / "max_energy_range_uj").write_text("%d\n" % max_uj)
    energy_uj = [max_uj - 2000000]
    (zone / "energy_uj").write_text("%d\n" % energy_uj[0])
    clock = [0.0]
    meter = RaplMeter(sysfs_root=tmp_path, clock=lambda: clock[0])
    counter = EnergyCounter(meter, rate_hz=10.0, clock=lambda: clock[0])
    for _ in range(20):  # 5 W: 0.5 J per 0.1 s; the counter wraps after 0.4 s
        clock[0] += 0.1
        energy_uj[0] = (energy_uj[0] + 500000) % max_uj
        (zone / "energy_uj").write_text("%d\n" % energy_uj[0])
        assert counter.sample_once(clock[0]) == pytest.approx(5.0)
    assert energy_uj[0] < 10000000  # it did wrap
    assert counter.joules_between(0.1, 2.0) == pytest.approx(5.0 * 1.9)


def test_error_gap_is_bridged_not_zeroed_and_logged_once(caplog):
    caplog.set_level(logging.WARNING, logger="streamfl.dvfs.power.energy")
    meter = ProfileMeter(lambda t: 4.0 if t < 1.5 else 8.0,
                         failures=[(0.95, 1.55, PowerError("read failed: EAGAIN")),
                                   (1.55, 1.95, RuntimeError("driver bug"))])
    counter = EnergyCounter(meter, rate_hz=10.0, clock=lambda: meter.now_s)
    drive(counter, meter, 0.0, 3.0, 0.1)
    # Reads at 1.0 .. 1.9 failed: 6 PowerErrors and 4 RuntimeErrors.
    assert counter.errors == 10
    assert counter.gap_s == pytest.approx(1.1)  # last good 0.9 s, next good 2.0 s
    # 0..0.9 at 4 W, then the trapezoid (4 + 8) / 2 over 1.1 s, then 2.0..3.0 at 8 W.
    assert counter.total_j() == pytest.approx(3.6 + 6.6 + 8.0)
    assert counter.joules_between(0.9, 2.0) == pytest.approx(6.6)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("EAGAIN" in m for m in messages) == 1
    assert sum("driver bug" in m for m in messages) == 1


def test_open_gap_holds_the_last_power_and_bad_values_are_errors():
    values = iter([3.0, float("nan"), -1.0])
    meter = ProfileMeter(lambda t: next(values))
    counter = EnergyCounter(meter, rate_hz=10.0, clock=lambda: meter.now_s)
    assert counter.sample_once(0.0) == 3.0
    assert counter.sample_once(0.1) is None  # NaN
    assert counter.sample_once(0.2) is None  # negative
    assert counter.errors == 2
    assert counter.last_w() == 3.0
    assert counter.joules_between(0.0, 1.0) == pytest.approx(3.0)


def test_stop_counts_the_stopped_time_as_a_gap():
    meter = ProfileMeter(lambda t: 2.0)
    counter = EnergyCounter(meter, rate_hz=10.0, clock=lambda: meter.now_s)
    drive(counter, meter, 0.0, 1.0, 0.1)
    counter.stop()
    drive(counter, meter, 5.0, 5.0, 0.1)
    assert counter.gap_s == pytest.approx(4.0)
    assert counter.total_j() == pytest.approx(10.0)


def test_time_must_not_go_back_and_equal_times_replace_power():
    meter = ProfileMeter(lambda t: 1.0 if t < 1.0 else 3.0)
    counter = EnergyCounter(meter, rate_hz=10.0, clock=lambda: meter.now_s)
    meter.now_s = 0.5
    counter.sample_once(1.0)
    meter.now_s = 1.5
    counter.sample_once(1.0)  # same instant: power replaced, no energy
    assert counter.total_j() == 0.0 and counter.last_w() == 3.0
    with pytest.raises(ValueError, match="before the previous"):
        counter.sample_once(0.5)


@pytest.mark.parametrize("rate_hz", [0, -1.0, float("nan"), float("inf")])
def test_bad_rate_is_a_value_error(rate_hz):
    with pytest.raises(ValueError, match="rate_hz"):
        EnergyCounter(ProfileMeter(lambda t: 1.0), rate_hz=rate_hz)


def test_bad_history_is_a_value_error():
    with pytest.raises(ValueError, match="history_s"):
        EnergyCounter(ProfileMeter(lambda t: 1.0), history_s=0)


def test_rails_and_total_come_from_one_read_of_a_hwmon_tree(tmp_path):
    from streamfl.dvfs.fake.tree import build_tree
    from streamfl.dvfs.power.ina3221_hwmon import Ina3221HwmonMeter
    build_tree(tmp_path, "jetson-orin-nano", "jp5")
    meter = Ina3221HwmonMeter(sysfs_root=tmp_path)
    counter = EnergyCounter(meter, rate_hz=10.0, clock=lambda: 0.0)
    assert counter.last_rails_w() == {}
    watts = counter.sample_once(1.0)
    rails = counter.last_rails_w()
    assert set(rails) == set(meter.rails) and "VDD_IN" in rails
    assert watts == pytest.approx(rails["VDD_IN"])          # the input rail is the board's power
    assert all(w >= 0 for w in rails.values())


def test_a_failed_read_keeps_the_last_good_rails():
    meter = ProfileMeter(lambda t: 4.0, failures=[(1.0, 2.0, PowerError("gone"))])
    counter = EnergyCounter(meter, rate_hz=10.0, clock=lambda: meter.now_s)
    drive(counter, meter, 0.0, 1.5, 0.5)
    assert counter.last_rails_w() == {"board": 4.0}
