"""A stand-in for jetson-stats' ``jetson.power``, read from a fake tree's INA3221 files, so the jtop
meter runs against the same boards as the sysfs meters."""
import logging
import os
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Tuple, Union

log = logging.getLogger(__name__)

#: jtop's total is the input rail where the board has one, else the sum of the rails.
INPUT_RAILS = ("VDD_IN", "POM_5V_IN")


def _read(path: Path) -> str:
    with open(str(path)) as fh:
        return fh.read().strip()


def _iio_rails(root: Path) -> Dict[str, Tuple[int, int, float, bool]]:
    """NVIDIA's ina3221x IIO driver (JetPack 4): (mV, mA, mW, online) per ``rail_name_N``."""
    out = {}
    base = root / "bus/iio/devices"
    for dev in sorted(os.listdir(str(base))) if base.is_dir() else []:
        d = base / dev
        if not (d / "name").exists() or _read(d / "name") != "ina3221x":
            continue
        for ch in range(3):
            if (d / ("rail_name_%d" % ch)).exists():
                mv, ma, mw = (int(_read(d / ("in_%s%d_input" % (kind, ch))))
                              for kind in ("voltage", "current", "power"))
                out[_read(d / ("rail_name_%d" % ch))] = (mv, ma, mw, True)
    return out


def _hwmon_rails(root: Path) -> Dict[str, Tuple[int, int, float, bool]]:
    """The upstream ina3221 hwmon driver (JetPack 5/6): no power file, so mW = mV * mA / 1000;
    jtop leaves out inputs labelled ``NC`` and shows disabled ones offline."""
    out = {}
    base = root / "class/hwmon"
    for dev in sorted(os.listdir(str(base))) if base.is_dir() else []:
        d = base / dev
        if not (d / "name").exists() or _read(d / "name") != "ina3221":
            continue
        for ch in (1, 2, 3):
            label_path = d / ("in%d_label" % ch)
            if not label_path.exists() or _read(label_path).upper() == "NC":
                continue
            enable = d / ("in%d_enable" % ch)
            online = not enable.exists() or _read(enable) != "0"
            mv = int(_read(d / ("in%d_input" % ch))) if online else 0
            ma = int(_read(d / ("curr%d_input" % ch))) if online else 0
            out[_read(label_path)] = (mv, ma, mv * ma / 1000.0, online)
    return out


def jtop_power(sysfs_root: Union[str, Path]) -> Mapping[str, Any]:
    """``jetson.power`` as jtop would report it for this tree: ``rail`` and ``tot`` tables (mV, mA,
    mW). ``ValueError`` when the tree has no INA3221 monitor (jtop would show no rails)."""
    root = Path(sysfs_root)
    rails = _iio_rails(root) or _hwmon_rails(root)
    if not rails:
        raise ValueError("no INA3221 monitor under %s" % root)
    table = {name: {"online": online, "sensor": "ina3221", "volt": mv, "curr": ma, "power": mw,
                    "avg": mw, "warn": 0, "crit": 0}
             for name, (mv, ma, mw, online) in rails.items()}
    live = {name: r for name, r in table.items() if r["online"]}
    top = next((live[name] for name in INPUT_RAILS if name in live), None)
    total_mw = top["power"] if top else sum(r["power"] for r in live.values())
    return {"rail": table, "tot": {"power": total_mw, "avg": total_mw, "name": "ALL"}}


def jtop_source(sysfs_root: Union[str, Path]) -> Callable[[], Mapping[str, Any]]:
    """A ``JtopMeter(source=...)`` that reads the tree again on every call, as jtop polls."""
    return lambda: jtop_power(sysfs_root)
