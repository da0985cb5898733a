"""INA3221 power monitors in the fake trees: NVIDIA's IIO driver (JetPack 4) and
the upstream hwmon driver (JetPack 5/6), with their I2C driver and class links."""
from typing import Sequence, Tuple

from streamfl.dvfs.fake.files import RW, Tree


def _i2c_links(t: Tree, dev: str, driver: str) -> None:
    addr = dev.rsplit("/", 1)[1]
    t.link("bus/i2c/drivers/%s/%s" % (driver, addr), "../../../../" + dev)
    t.link("bus/i2c/devices/" + addr, "../../../" + dev)


def ina_iio(t: Tree, dev: str, rails: Sequence[Tuple[str, int, int, int]]) -> None:
    """NVIDIA's ina3221x IIO driver on JetPack 4: mV, mA, mW, every attribute 0644."""
    t.put(dev + "/name", "ina3221x")  # [U] exact client name
    io = dev + "/iio:device0/"
    t.put(io + "name", "ina3221x")  # [U]
    for ch, (rail, mv, ma, mw) in enumerate(rails):
        t.put(io + "rail_name_%d" % ch, rail, RW)
        t.put(io + "in_voltage%d_input" % ch, str(mv), RW)
        for kind, value in (("current", ma), ("power", mw)):
            t.put(io + "in_%s%d_input" % (kind, ch), str(value), RW)
            t.put(io + "in_%s%d_trigger_input" % (kind, ch), str(value), RW)
        # [U] limit values; formats are "%d ma" / "%d mw".
        t.put(io + "warn_current_limit_%d" % ch, "32760 ma", RW)
        t.put(io + "crit_current_limit_%d" % ch, "32760 ma", RW)
        t.put(io + "crit_power_limit_%d" % ch, "163800 mw", RW)
        t.put(io + "ui_input_%d" % ch, "%d %d" % (mv, ma), RW)
    t.put(io + "running_mode", "0", RW)  # [U] format
    _i2c_links(t, dev, "ina3221x")
    t.link("bus/iio/devices/iio:device0", "../../../" + io.rstrip("/"))  # every IIO device has one


def ina_hwmon(t: Tree, dev: str, hwmon: str, rails: Sequence[Tuple[str, int, int]],
              shunt_uohm: int, summation: bool) -> None:
    """Upstream ina3221 hwmon on JetPack 5/6: in mV, shunt in µV, curr mA, no power files.

    ``summation``: the ``curr4_*`` sum channel exists only when all shunts are equal and no input
    has summation disabled; callers say which monitors qualify.
    """
    t.put(dev + "/name", "ina3221")
    h = "%s/hwmon/%s/" % (dev, hwmon)
    t.put(h + "name", "ina3221")  # [U] exact
    full_scale_ma = 163800 * 1000 // shunt_uohm  # [U] limits: INA3221's 163.8 mV shunt range
    shunt_uv = [ma * shunt_uohm // 1000 for _, _, ma in rails]
    for i, (label, mv, ma) in enumerate(rails, 1):
        t.put(h + "in%d_label" % i, label)
        t.put(h + "in%d_input" % i, str(mv))
        t.put(h + "in%d_enable" % i, "0" if label == "NC" else "1", RW)  # [U] NC = disabled
        t.put(h + "in%d_input" % (i + 3), str(shunt_uv[i - 1]))
        t.put(h + "curr%d_input" % i, str(ma))
        for limit in ("crit", "max"):
            t.put(h + "curr%d_%s" % (i, limit), str(full_scale_ma), RW)
            t.put(h + "curr%d_%s_alarm" % (i, limit), "0")
        t.put(h + "shunt%d_resistor" % i, str(shunt_uohm), RW)
    t.put(h + "in7_input", str(sum(shunt_uv)))
    t.put(h + "in7_label", "sum of shunt voltages")
    if summation:
        t.put(h + "curr4_input", str(sum(ma for _, _, ma in rails)))
        t.put(h + "curr4_crit", str(full_scale_ma), RW)
        t.put(h + "curr4_crit_alarm", "0")
    _i2c_links(t, dev, "ina3221")
    t.link("class/hwmon/" + hwmon, "../../" + h.rstrip("/"))  # standard class link, not in s8
