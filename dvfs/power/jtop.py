"""Jetson rail power read through jetson-stats' ``jtop`` service, an optional reader.

jtop reads the same INA3221 files as the sysfs meters, through a root service on ``/run/jtop.sock``
(group ``jtop``). It is imported only when this meter is built, so boards without it never load it;
jetson-stats is AGPL and stays an optional extra.
"""
import importlib
import logging
import numbers
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from streamfl.dvfs.power.base import PowerError, PowerMeter
from streamfl.dvfs.power.ina3221_iio import input_or_sum_w

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install streamfl[jetson]"

#: Returns ``jetson.power``: ``{'rail': {name: {'volt': mV, 'curr': mA, 'power': mW, 'online':
#: bool, ...}}, 'tot': {'power': mW, ...}}``.
StatsSource = Callable[[], Mapping[str, Any]]


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise PowerError("jtop %s is %r, not a number" % (what, value))
    return float(value)


def parse_power(stats: Mapping[str, Any]) -> Tuple[Dict[str, float], Optional[float]]:
    """Watts per online rail and jtop's total (None if absent) from a ``jetson.power`` dict."""
    if not isinstance(stats, Mapping) or not isinstance(stats.get("rail"), Mapping):
        raise PowerError("jtop power stats have no 'rail' table: %r" % (stats,))
    watts = {}
    for name, rail in stats["rail"].items():
        if not isinstance(rail, Mapping):
            raise PowerError("jtop rail %r is %r, not a table" % (name, rail))
        if rail.get("online") is False:
            continue
        if "power" in rail:
            watts[str(name)] = _number(rail["power"], "power of %s" % name) / 1e3
        elif "volt" in rail and "curr" in rail:
            volt_mv = _number(rail["volt"], "volt of %s" % name)
            watts[str(name)] = volt_mv * _number(rail["curr"], "curr of %s" % name) / 1e6
        else:
            raise PowerError("jtop rail %r has neither power nor volt and curr" % name)
    total = stats.get("tot")
    total_w = None
    if isinstance(total, Mapping) and "power" in total:
        total_w = _number(total["power"], "total power") / 1e3
    return watts, total_w


class JtopMeter(PowerMeter):
    """Watts per rail from jtop; ``source`` replaces the jtop connection (tests, other readers).

    jtop's own total is used for ``total_w``: it is ``VDD_IN``/``POM_5V_IN`` where present, else the
    sum of the rails, the same rule as the sysfs INA3221 meters.
    """

    kind = "jtop"

    def __init__(self, source: Optional[StatsSource] = None, interval_s: float = 0.5):
        self._jetson: Any = None
        if source is None:
            source = self._connect(interval_s)
        self._source = source
        self._rails = tuple(self.read_w())

    def _connect(self, interval_s: float) -> StatsSource:
        """Start a jtop client; ``PowerError`` when jetson-stats is missing or its service is down."""
        try:
            module = importlib.import_module("jtop")
        except ImportError as exc:
            raise PowerError("jetson-stats (jtop) is not installed: %s (%s)"
                             % (INSTALL_HINT, exc)) from None
        try:
            jetson = module.jtop(interval=interval_s)
            jetson.start()
        except Exception as exc:  # jtop raises its own JtopException and socket errors
            raise PowerError("cannot connect to the jtop service: %s (is jtop.service running and "
                             "the agent's user in group jtop?)" % exc) from exc
        self._jetson = jetson
        return lambda: jetson.power

    def _stats(self) -> Mapping[str, Any]:
        try:
            return self._source()
        except PowerError:
            raise
        except Exception as exc:  # the jtop client's errors are not ours to know by type
            raise PowerError("jtop read failed: %s" % exc) from exc

    @property
    def rails(self) -> Tuple[str, ...]:
        return self._rails

    def read_w(self) -> Dict[str, float]:
        watts, _ = parse_power(self._stats())
        return watts

    def read_total_w(self) -> Tuple[float, Dict[str, float]]:
        """jtop's own total where it reports one, else the input rail or the sum."""
        watts, total_w = parse_power(self._stats())
        return (total_w if total_w is not None else input_or_sum_w(watts)), watts

    def close(self) -> None:
        jetson, self._jetson = self._jetson, None
        if jetson is not None:
            try:
                jetson.close()
            except Exception as exc:  # closing must not mask the caller's own error
                log.warning("closing jtop failed: %s", exc)
