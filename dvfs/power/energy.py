"""Joules from a power meter: samples ``total_w`` at a fixed rate and integrates with the trapezoid rule.

Zeus integrates Jetson and Raspberry Pi power the same way, at 10 Hz by default. A bounded
ring of ``(t, cumulative joules)`` samples answers "joules between two instants" for a training
round. The clock is injectable and ``sample_once`` lets the simulator drive the counter in virtual
time without the thread.
"""
import bisect
import logging
import math
import threading
import time
from array import array
from typing import Callable, Dict, Optional, Set

from streamfl.dvfs.power.base import PowerError, PowerMeter

log = logging.getLogger(__name__)

#: Distinct error messages logged before the counter only counts them (bounds the memory of a
#: meter whose messages carry changing numbers).
MAX_LOGGED_MESSAGES = 64


class _View(object):
    """The ring's sample times in logical order, indexable for ``bisect`` without copying."""

    def __init__(self, counter: "EnergyCounter"):
        self._c = counter

    def __len__(self) -> int:
        return self._c._count

    def __getitem__(self, k: int) -> float:
        return self._c._t[(self._c._head + k) % self._c._capacity]


class EnergyCounter(object):
    """Integrates the meter's board power (``read_total_w``) over time; ``joules_between(t0_s, t1_s)`` on the clock's scale.

    A failed read (``PowerError``, or any exception, so the thread never dies silently) is logged
    once per distinct message and counted in ``errors``; the counter keeps sampling. The power
    during such a gap is unknown, not zero: the trapezoid between the last good sample before the
    gap and the first good one after it bridges it (power assumed to move linearly across it), and
    the bridged seconds are added to ``gap_s`` so callers can tell estimated energy from measured.
    While a gap is still open, answers past the newest sample hold its power (see ``energy_at``).
    Time between ``stop()`` and a later ``start()`` is bridged the same way.
    """

    def __init__(self, meter: PowerMeter, rate_hz: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, history_s: float = 3600.0):
        if not (isinstance(rate_hz, (int, float)) and math.isfinite(rate_hz) and rate_hz > 0):
            raise ValueError("rate_hz must be a positive number, got %r" % (rate_hz,))
        if not (math.isfinite(history_s) and history_s > 0):
            raise ValueError("history_s must be a positive number, got %r" % (history_s,))
        self.meter = meter
        self.rate_hz = float(rate_hz)
        self._clock = clock
        # One more slot than history_s * rate_hz so a full history_s window stays answerable.
        self._capacity = max(2, int(math.ceil(rate_hz * history_s)) + 1)
        self._t = array("d", [0.0]) * self._capacity
        self._e = array("d", [0.0]) * self._capacity
        self._head = 0
        self._count = 0
        self._lock = threading.Lock()
        self._last_t_s: Optional[float] = None
        self._last_w: Optional[float] = None
        self._last_rails_w: Dict[str, float] = {}
        self._total_j = 0.0
        self._in_gap = False
        self._gap_s = 0.0
        self._errors = 0
        self._logged: Set[str] = set()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # -- sampling ---------------------------------------------------------------------------------

    def sample_once(self, now_s: float) -> Optional[float]:
        """Read the meter once and record it at ``now_s``; returns the watts, or None on an error.

        ``now_s`` must not go back in time (``ValueError``); a sample at the same instant as the
        previous one replaces its power without adding energy.
        """
        watts = self._read_w()
        if watts is not None:
            self._record(now_s, watts, strict=True)
        return watts

    def _read_w(self) -> Optional[float]:
        try:
            total_w, rails_w = self.meter.read_total_w()
            watts = float(total_w)
            if not math.isfinite(watts) or watts < 0:
                raise PowerError("%s meter returned %r W" % (self.meter.kind, watts))
            rails = {name: float(w) for name, w in rails_w.items() if math.isfinite(w)}
            with self._lock:
                self._last_rails_w = rails
            return watts
        except Exception as exc:  # noqa: B902 - see the class docstring
            self._record_error(exc)
            return None

    def _record_error(self, exc: Exception) -> None:
        with self._lock:
            self._errors += 1
            if self._last_t_s is not None:
                self._in_gap = True
            message = "%s: %s" % (type(exc).__name__, exc)
            first = message not in self._logged and len(self._logged) < MAX_LOGGED_MESSAGES
            if first:
                self._logged.add(message)
        if first:
            log.warning("power meter %s failed (%s); energy across the gap is interpolated, "
                        "repeats of this error are counted, not logged",
                        getattr(self.meter, "kind", "?"), message,
                        exc_info=not isinstance(exc, PowerError))

    def _record(self, now_s: float, watts: float, strict: bool) -> None:
        with self._lock:
            last_t = self._last_t_s
            if last_t is not None and now_s < last_t:
                if strict:
                    raise ValueError("sample time %.6f s is before the previous one (%.6f s)"
                                     % (now_s, last_t))
                return
            if last_t is not None and now_s == last_t:
                self._last_w = watts
                return
            if last_t is not None:
                dt_s = now_s - last_t
                self._total_j += (self._last_w + watts) / 2.0 * dt_s
                if self._in_gap:
                    self._gap_s += dt_s
            self._in_gap = False
            self._push(now_s, self._total_j)
            self._last_t_s = now_s
            self._last_w = watts

    def _push(self, t_s: float, cumulative_j: float) -> None:
        if self._count < self._capacity:
            slot = (self._head + self._count) % self._capacity
            self._count += 1
        else:
            slot = self._head
            self._head = (self._head + 1) % self._capacity
        self._t[slot] = t_s
        self._e[slot] = cumulative_j

    # -- thread -----------------------------------------------------------------------------------

    def start(self) -> "EnergyCounter":
        """Take a first sample now, then sample in a daemon thread at ``rate_hz``; idempotent.

        The thread paces itself with the injected clock, so it needs a real one.
        """
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._sample_now()
        self._thread = threading.Thread(target=self._run, name="energy-counter", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread and wait for it; idempotent. The time until a restart counts as a gap."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("energy counter thread still running after %.1f s", timeout_s)
        with self._lock:
            if self._last_t_s is not None:
                self._in_gap = True

    def __enter__(self) -> "EnergyCounter":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _sample_now(self) -> None:
        before_s = self._clock()
        watts = self._read_w()
        if watts is not None:
            # A read can take a while (pmic_read_adc ~23 ms): stamp it at its middle.
            after_s = self._clock()
            self._record(before_s + (after_s - before_s) / 2.0, watts, strict=False)

    def _run(self) -> None:
        period_s = 1.0 / self.rate_hz
        next_s = self._clock() + period_s
        while not self._stop.is_set():
            delay_s = next_s - self._clock()
            if delay_s > 0 and self._stop.wait(delay_s):
                break
            self._sample_now()
            next_s += period_s
            now_s = self._clock()
            if next_s < now_s - period_s:
                next_s = now_s + period_s  # fell behind (a slow read, a suspend): skip the ticks

    # -- queries ----------------------------------------------------------------------------------

    def energy_at(self, t_s: float) -> float:
        """Cumulative joules at ``t_s``: linear between the two samples around it; past the newest
        sample, the newest power held. ``ValueError`` before the oldest sample kept, or with none."""
        with self._lock:
            if self._count == 0:
                raise ValueError("the energy counter has no samples yet")
            cap, head = self._capacity, self._head
            oldest_s = self._t[head]
            if t_s < oldest_s:
                raise ValueError("%.3f s is older than the oldest sample kept (%.3f s; the ring "
                                 "holds %d samples, raise history_s)" % (t_s, oldest_s, cap))
            newest = (head + self._count - 1) % cap
            if t_s >= self._t[newest]:
                return self._e[newest] + self._last_w * (t_s - self._t[newest])
            k = bisect.bisect_right(_View(self), t_s) - 1
            i, j = (head + k) % cap, (head + k + 1) % cap
            frac = (t_s - self._t[i]) / (self._t[j] - self._t[i])
            return self._e[i] + frac * (self._e[j] - self._e[i])

    def joules_between(self, t0_s: float, t1_s: float) -> float:
        """Energy from ``t0_s`` to ``t1_s`` (clock seconds); ``ValueError`` if ``t1_s < t0_s`` or
        the window starts before the oldest sample the ring keeps."""
        if t1_s < t0_s:
            raise ValueError("window ends (%.3f s) before it starts (%.3f s)" % (t1_s, t0_s))
        return self.energy_at(t1_s) - self.energy_at(t0_s)

    def total_j(self) -> float:
        """Joules integrated from the first sample to the newest one."""
        with self._lock:
            return self._total_j

    def last_w(self) -> Optional[float]:
        """The newest good power reading; None before the first."""
        with self._lock:
            return self._last_w

    def last_rails_w(self) -> Dict[str, float]:
        """Watts per rail of the newest good reading (telemetry); empty before the first."""
        with self._lock:
            return dict(self._last_rails_w)

    @property
    def errors(self) -> int:
        """Meter reads that failed."""
        with self._lock:
            return self._errors

    @property
    def gap_s(self) -> float:
        """Seconds whose energy was bridged across failed reads or a stop, not measured."""
        with self._lock:
            return self._gap_s

    @property
    def running(self) -> bool:
        """True while the sampling thread runs."""
        return self._thread is not None and self._thread.is_alive()
