"""AdaCLP's federated CLP probe (AdaCLP paper, sec. 3.1.3, eq. 2-3).

Sans-I/O: the coordinator's ``clp`` plug-in (``methods/clp/coordinator.py``) calls
``ClpProbe.on_aggregation`` once per new global version and puts ``current()``, a typed
``ClpState``, in every global model's extras; the devices' ``clp`` plug-in turns it into
hyper-parameters (``streamfl.methods.clp.hparams``, eq. 4-6) and DVFS decisions (sec. 4.2).

Versions follow the paper and the coordinator core: an aggregation produces version ``T`` (the
core's version *after* ``_install``) from an update trained from ``I(T) <= T - 1``, so the staleness
``T - I(T)`` of eq. 2 is at least 1 (Fig. 5c: rounds 2, 3, 4 from versions 0, 1, 0 weigh e^-2l,
e^-2l, e^-4l). FedAvg passes the round's base version and the sample-weighted mean trace.

Choices the paper leaves open (documented here once, tested in tests/test_clp_probe.py):

* Window warm-up: while fewer than ``m`` traces have arrived, eq. 2 divides by the number present,
  not by ``m``. Dividing by ``m`` would make F_G climb by 1/k per aggregation just from filling
  the window, so eq. 3 would report a CLP for the first ``m`` aggregations whatever the traces say;
  the count keeps F_G a mean of what was measured, identical to eq. 2 once the window is full.
* Missing traces: the window holds the last ``m`` aggregations that *carried* a trace. An
  aggregation without one (device without Fisher support, FedAvg round with no traces) or with an
  invalid one (NaN, infinite, negative: treated as missing, logged) leaves F_G, F_G(T-1) and the
  CLP flag exactly as they were; only the version advances.
* Eq. 3's lag (``growth_lag``): the paper compares F_G(T) with F_G(T-1). With a window of m
  traces, F_G(T) - F_G(T-1) = (newest trace - trace leaving the window) * decay / m, so its sign
  is one noisy trace against another and the flag flickers inside every hump of F_G (seen in
  docs/results.md: 2-3x spread of per-update traces at the same model). ``growth_lag = k``
  compares F_G(T) with F_G(T-k), k traced aggregations back; k = m compares two disjoint windows,
  a trend test. Default 1, the paper literally; sigma is then growth over k aggregations. While
  fewer than k earlier estimates exist, the oldest one is used. Eq. 6's dropout keeps the
  one-step difference F_G(T) - F_G(T-1) (``fisher_global_prev``).
* Eq. 3 guards: no previous estimate -> keep the flag (training starts in the CLP: "F increases
  rapidly during initial training", sec. 3.1.1, Fig. 6 CLP [0, 2662]); F_G(T-1) == 0 -> in CLP iff
  F_G(T) > 0 (growth from zero is unbounded, 0 -> 0 is none).
* Segments (sec. 3.2): the paper partitions [0, R_end] into segments and resets eta0, B0, D0 at
  each start without saying where they start. A new segment starts (a) when the model re-enters
  the CLP (flag False -> True: the eq. 6 dropout did its job, so refinement restarts from the
  initial values) and/or (b) every ``segment_rounds`` versions (fixed partition; off by default
  because the paper says segments deliberately do not follow the data's class periodicity).
* After R_end ("we stop tracking the CLP and hyperparameter adjustments, resuming standard
  asynchronous FL"): ``regulating`` and ``in_clp`` are False (devices use the coordinator's hparams
  and DVFS leaves the low-frequency CLP mode), segments freeze; F_G is still computed for metrics.
* Damping a flapping flag (ours; off by default, the paper's eq. 3 as written). Eq. 3 is a bare
  threshold on a noisy ratio: a fleet saw the flag entered and left 36 times in 3 minutes, and
  every flip restarts a segment (eq. 4-6 reset) and moves every board's clocks. Two dampers, each
  off at 0, either or both:

  - hysteresis (``growth_hysteresis`` = h) on eq. 3's criterion: out of the CLP, the flag enters
    it only when the growth reaches sigma + h; in it, it leaves only when the growth falls below
    sigma - h. Growth inside the band keeps the flag as it is. Why: the flag then flips on a
    change of the trend, not on noise of +-h around sigma. The F_G(T-1) == 0 guard is not
    banded (growth from zero is unbounded, 0 -> 0 is none).
  - minimum dwell (``flag_min_dwell_versions``, ``flag_min_dwell_s``): once the flag changed, it
    holds for at least that many versions and that many seconds (both, where both are set),
    whatever eq. 3 says; after that it follows the criterion again. Why: it bounds the flips per
    unit of time whatever the noise, where the band needs the noise's size to be known. The
    initial "in the CLP" is not a change and is not held. The seconds are the aggregation's time
    (the coordinator's clock), not saved across a restart: the dwell in seconds restarts with
    the next change.
"""
import logging
import math
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar, Deque, Dict, List, Mapping, Optional, Tuple

from streamfl.config import bounded
from streamfl.methods.clp.payloads import ClpState

log = logging.getLogger(__name__)

#: Paper defaults: lambda = 0.01 (sec. 5.4.7, robust in [0.01, 0.1]); R_end = 30000 (sec. 5.4.3).
DEFAULT_LAMBDA = 0.01
DEFAULT_R_END = 30000


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class ClpProbeConfig:
    """Federated CLP regulator settings (AdaCLP paper, eq. 2-3, sec. 3.2).

    trace_window: eq. 2's window m, in traced aggregations. The paper gives no value (Fig. 5
      draws 3); 10 averages a few updates from each of several concurrent devices (per-device traces are
      noisy and non-IID) while still following the trace within ~10 versions.
    staleness_decay: eq. 2's staleness decay lambda; 0.01 is the paper's default (sec. 5.4.7).
    growth_threshold: eq. 3's growth threshold sigma per traced aggregation. The paper gives no
      value; 0.01 = 1 % growth per aggregation. F_G moves ~1/m of a trace change per step, so
      scale it down with a larger window.
    growth_lag: eq. 3 compares F_G(T) with F_G(T - growth_lag) (traced aggregations); 1 is the
      paper, trace_window a trend test robust to per-update trace noise (module docstring).
    last_regulated_version: R_end, the last regulated version (paper 30000 = 75 class periods of
      400 rounds, sec. 5.1/5.4.3).
      Scale with the run: about 75 class-switch periods, or the first ~third of the versions the
      run will make; 0 disables regulation.
    segment_rounds: fixed segment length in versions; 0 (default) = none, see module docstring.
    segment_on_reentry: start a new segment when the model re-enters the CLP (default True).
    refine_hparams: devices refine lr, batch size and dropout from the broadcast state (eq. 4-6);
      False broadcasts the CLP flag only (CriticalFL follows it with its client count, clocks
      with the clp-aware policy) and devices keep the coordinator's hparams.
    reference_traces: F_G's warm-up reference is its mean over the first this many traced
      aggregations, then frozen, and broadcast as ``fisher_reference`` (devices with
      ``fisher_reference: warmup`` read eq. 4-5 as F = F_G / reference). Eq. 4 reads F_G on an
      absolute scale that depends on the model, the loss and the class count, which the paper
      leaves open; the trace of the run's own early training is the one scale every model has.
      50 spans the first few rounds of every device of a 10-40 device fleet.
    growth_hysteresis, flag_min_dwell_versions, flag_min_dwell_s: damp a flapping CLP flag (module
      docstring); 0 each (default): eq. 3 as the paper writes it.
    flag_log_interval_s: the log says the first CLP flag change at INFO, then at most one
      summary line per this many seconds ("CLP flag changed 12 times in the last 60 s; now
      critical since version 340"), each change itself at DEBUG; 0 logs every change at INFO.
      60 s: a flapping flag costs a line a minute, and a lone change is still logged as it comes.
    max_peer_multiple: a device's Fisher trace counts capped at m x the median of the other
      devices' latest traces (m = 4). The paper's devices are honest; forged traces from one
      device moved F_G from 24 to 2.4e9 and flipped the fleet's CLP flag; capped, one device
      raises F_G by at most 4x. Honest traces spike at a class switch (measured on the
      adaclp-extreme scenario: p90 6x, p99 70x the peers' median, capped at 16% of traces; on
      smoke 2.5%), but a capped spike still grows F_G well past eq. 3's threshold, and AdaCLP's
      mean accuracy there moved by +0.5 points, its energy by +1% (seed 0, 90 s). In the
      paper's own regime (adaclp-paper-extreme, lr 0.4, seed 0) it costs AdaCLP 5.7 points
      (0.312 against 0.369 lifted): capped spikes keep the fleet in the CLP, at its lowest clocks,
      for 43% of the versions against 17%. Kept at 4 all the same: the guard is against a
      takeover, and streamfl's own CLP method does not move with it (0.472 against 0.473). No floor:
      traces of devices whose data is learned run far below their peers', and a low trace pulls
      F_G down only by the device's share of the window.
    """

    #: Old key names (the paper's symbols) that files may still use.
    RENAMED: ClassVar[Dict[str, str]] = {
        "window_m": "trace_window", "lam": "staleness_decay", "sigma": "growth_threshold",
        "r_end": "last_regulated_version"}

    #: Traced aggregations F_G averages over (AdaCLP's m, eq. 2).
    trace_window: int = bounded(10, 1, 10000)
    #: Decay of a trace's weight per version of staleness (AdaCLP's lambda, eq. 2).
    staleness_decay: float = bounded(DEFAULT_LAMBDA, 0.0, 10.0)
    #: F_G's relative growth per traced aggregation that means "in the CLP" (AdaCLP's sigma, eq. 3).
    growth_threshold: float = bounded(0.01, 0.0, 1e6)
    growth_lag: int = bounded(1, 1, 10000)
    #: The last version the CLP regulates; 0: none (AdaCLP's R_end, sec. 3.2).
    last_regulated_version: int = bounded(DEFAULT_R_END, 0, 10 ** 9)
    segment_rounds: int = bounded(0, 0, 10 ** 9)
    segment_on_reentry: bool = True
    refine_hparams: bool = True
    reference_traces: int = bounded(50, 1, 10 ** 6)
    max_peer_multiple: float = bounded(4.0, 1.0, 1e6)
    #: Band around eq. 3's threshold: the CLP flag enters at growth >= threshold + this and
    #: leaves at growth < threshold - this (0: eq. 3 as written, AdaCLP eq. 3).
    growth_hysteresis: float = bounded(0.0, 0.0, 1e6)
    #: Versions the CLP flag holds at least once it changed (0: no dwell).
    flag_min_dwell_versions: int = bounded(0, 0, 10 ** 9)
    #: Seconds the CLP flag holds at least once it changed (0: no dwell).
    flag_min_dwell_s: float = bounded(0.0, 0.0, 1e8)
    #: Seconds between the log's lines on CLP flag changes: the first change, then at most one
    #: summary per interval (0: every change at INFO).
    flag_log_interval_s: float = bounded(60.0, 0.0, 1e6)

    def __post_init__(self) -> None:
        if not isinstance(self.segment_on_reentry, bool):
            raise ValueError("clp.segment_on_reentry must be true or false, got %r"
                             % (self.segment_on_reentry,))
        if not _is_int(self.trace_window) or self.trace_window < 1:
            raise ValueError("clp.trace_window (eq. 2 window) must be an integer >= 1, got %r"
                             % (self.trace_window,))
        if not _is_int(self.growth_lag) or self.growth_lag < 1:
            raise ValueError("clp.growth_lag (eq. 3 lag, in traced aggregations) must be an integer "
                             ">= 1, got %r" % (self.growth_lag,))
        if not _finite(self.staleness_decay) or self.staleness_decay < 0:
            raise ValueError("clp.staleness_decay (eq. 2 staleness decay lambda) must be a finite"
                             " number >= 0, got %r" % (self.staleness_decay,))
        if not _finite(self.growth_threshold) or self.growth_threshold < 0:
            raise ValueError("clp.growth_threshold (eq. 3 sigma) must be a finite number >= 0, got %r"
                             % (self.growth_threshold,))
        if not _is_int(self.last_regulated_version) or self.last_regulated_version < 0:
            raise ValueError("clp.last_regulated_version (R_end) must be an integer >= 0, got %r"
                             % (self.last_regulated_version,))
        if not _is_int(self.reference_traces) or self.reference_traces < 1:
            raise ValueError("clp.reference_traces must be an integer >= 1, got %r"
                             % (self.reference_traces,))
        if not _finite(self.growth_hysteresis) or self.growth_hysteresis < 0:
            raise ValueError("clp.growth_hysteresis (band around eq. 3's threshold) must be a finite "
                             "number >= 0, got %r" % (self.growth_hysteresis,))
        if not _is_int(self.flag_min_dwell_versions) or self.flag_min_dwell_versions < 0:
            raise ValueError("clp.flag_min_dwell_versions must be an integer >= 0 (0 = no dwell), got %r"
                             % (self.flag_min_dwell_versions,))
        for key in ("flag_min_dwell_s", "flag_log_interval_s"):
            value = getattr(self, key)
            if not _finite(value) or value < 0:
                raise ValueError("clp.%s must be a finite number of seconds >= 0, got %r" % (key, value))
        if not _is_int(self.segment_rounds) or self.segment_rounds < 0:
            raise ValueError("clp.segment_rounds must be an integer >= 0 (0 = no fixed segments), "
                             "got %r" % (self.segment_rounds,))


class ClpProbe:
    """Staleness-decayed global Fisher trace (eq. 2), CLP flag (eq. 3), segments and R_end."""

    def __init__(self, config: ClpProbeConfig = ClpProbeConfig()):
        self.config = config
        #: (version T, staleness T - I(T), F_recv(T)) for the last ``trace_window`` traced aggregations.
        self._window: Deque[Tuple[int, int, float]] = deque(maxlen=config.trace_window)
        self._fg: Optional[float] = None
        #: F_G after each of the last ``growth_lag`` traced aggregations before this one (eq. 3);
        #: its newest entry is F_G(T-1), eq. 6's previous value (``_fg_prev``).
        self._fg_history: Deque[float] = deque(maxlen=config.growth_lag)
        self._in_clp = True
        self._segment = 0
        self._segment_start = 0
        self._fg_segment_start: Optional[float] = None
        self._version = 0
        self._last_version: Optional[int] = None
        self.rounds = 0          # aggregations seen
        self.traced_rounds = 0   # ... of which carried a valid trace
        self._reference_sum = 0.0  # F_G summed over the first ``reference_traces`` traced ones
        #: The version the CLP flag last changed at (0: it never changed), and how often it did
        #: (while regulating; the forced end at R_end is not counted).
        self.flag_since_version = 0
        self.flag_changes = 0
        #: The aggregation time of that change (None: none since this probe started).
        self.flag_since_s: Optional[float] = None

    # ---- inputs -------------------------------------------------------------------------------
    def on_aggregation(self, version_T: int, base_version_I: int,
                       fisher_trace: Optional[float], now_s: Optional[float] = None) -> ClpState:
        """Account for the aggregation that produced ``version_T`` from an update (or FedAvg round)
        trained from ``base_version_I``; ``fisher_trace`` is F_recv(T), None if not measured;
        ``now_s`` its time (needed by ``flag_min_dwell_s`` only)."""
        if not _is_int(version_T) or not _is_int(base_version_I):
            raise ValueError("version_T and base_version_I must be integers, got %r and %r"
                             % (version_T, base_version_I))
        if self.config.flag_min_dwell_s > 0 and not _finite(now_s):
            raise ValueError("clp.flag_min_dwell_s needs each aggregation's time, got %r" % (now_s,))
        if self._last_version is not None and version_T <= self._last_version:
            raise ValueError("versions must increase: got %d after %d" % (version_T, self._last_version))
        self._last_version = version_T
        was_regulating = self.rounds > 0 and self._regulating(self._version)
        self._version = version_T
        self.rounds += 1
        regulating = self._regulating(version_T)

        trace = self._valid_trace(fisher_trace, version_T)
        was_in = self._in_clp
        if trace is not None:
            self.traced_rounds += 1
            self._window.append((version_T, max(0, version_T - base_version_I), trace))
            if self._fg is not None:
                self._fg_history.append(self._fg)
            self._fg = self._compute()
            if self.traced_rounds <= self.config.reference_traces:
                self._reference_sum += self._fg
            if self._fg_history:
                wanted = self._criterion(self._fg, self._fg_history[0], self._in_clp)
                if wanted == self._in_clp or not self._dwelling(version_T, now_s):
                    self._in_clp = wanted
        if not regulating:
            if was_regulating:
                log.info("v%d: CLP regulation ends (R_end=%d)", version_T, self.config.last_regulated_version)
            self._in_clp = False
            return self.current()

        if self._in_clp != was_in:
            self.flag_changes += 1
            self.flag_since_version, self.flag_since_s = version_T, now_s
            # DEBUG: the coordinator plug-in logs changes at INFO, summarized (flag_log_interval_s).
            log.debug("v%d: %s the CLP (F_G %.4g -> %.4g)", version_T,
                      "entered" if self._in_clp else "left", self._fg_prev or 0.0, self._fg or 0.0)
        reentry = self.config.segment_on_reentry and trace is not None and self._in_clp and not was_in
        periodic = (self.config.segment_rounds > 0
                    and version_T - self._segment_start >= self.config.segment_rounds)
        if reentry or periodic:
            self._segment += 1
            self._segment_start = version_T
            self._fg_segment_start = self._fg
            log.info("v%d: segment %d starts (%s)", version_T, self._segment,
                     "CLP re-entry" if reentry else "every %d versions" % self.config.segment_rounds)
        elif self._fg_segment_start is None:
            self._fg_segment_start = self._fg
        return self.current()

    # ---- outputs ------------------------------------------------------------------------------
    def current(self) -> ClpState:
        """The state after the last aggregation (version 0 before any)."""
        regulating = self._regulating(self._version)
        return ClpState(version=self._version, fisher_global=self._fg,
                        fisher_global_prev=self._fg_prev, in_clp=self._in_clp and regulating,
                        segment=self._segment, segment_start_version=self._segment_start,
                        regulating=regulating, fisher_segment_start=self._fg_segment_start,
                        fisher_reference=self.fisher_reference)

    def weights(self) -> Dict[int, float]:
        """Eq. 2 decay weight ``exp(-lambda [(T-j) - I(T-j)])`` of each version in the window."""
        return {v: math.exp(-self.config.staleness_decay * st) for v, st, _ in self._window}

    @property
    def fisher_global(self) -> Optional[float]:
        return self._fg

    @property
    def growth(self) -> Optional[float]:
        """Eq. 3's relative growth (F_G(T) - F_G(T - growth_lag)) / F_G(T - growth_lag), None
        before two estimates or from a zero one."""
        if self._fg is None or not self._fg_history or self._fg_history[0] <= 0.0:
            return None
        return (self._fg - self._fg_history[0]) / self._fg_history[0]

    @property
    def fisher_reference(self) -> Optional[float]:
        """Mean F_G over the first ``reference_traces`` traced aggregations; None until then."""
        n = self.config.reference_traces
        return self._reference_sum / n if self.traced_rounds >= n else None

    # ---- persistence --------------------------------------------------------------------------
    def state(self) -> Dict[str, Any]:
        """JSON-able state; ``load_state`` continues exactly where this left off."""
        return {"window": [[v, st, f] for v, st, f in self._window],
                "fisher_global": self._fg, "fisher_global_prev": self._fg_prev,
                "fisher_history": list(self._fg_history), "in_clp": self._in_clp,
                "segment": self._segment, "segment_start_version": self._segment_start,
                "fisher_segment_start": self._fg_segment_start, "version": self._version,
                "last_version": self._last_version, "rounds": self.rounds,
                "traced_rounds": self.traced_rounds, "reference_sum": self._reference_sum,
                "flag_since_version": self.flag_since_version, "flag_changes": self.flag_changes}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore ``state()``; a smaller ``trace_window`` keeps the newest entries (F_G recomputed)."""
        try:
            window: List[Tuple[int, int, float]] = []
            for v, st, f in state.get("window") or []:
                if not (_is_int(v) and _is_int(st) and _finite(f)):
                    raise ValueError("bad window entry %r" % ([v, st, f],))
                window.append((int(v), int(st), float(f)))
            self._window = deque(window, maxlen=self.config.trace_window)
            self._fg = self._compute() if self._window else None
            history = [_opt_float(f) for f in state.get("fisher_history") or []]
            if not history:   # a state saved before growth_lag existed
                history = [_opt_float(state.get("fisher_global_prev"))]
            self._fg_history = deque([f for f in history if f is not None],
                                     maxlen=self.config.growth_lag)
            self._in_clp = bool(state.get("in_clp", True))
            self._segment = int(state.get("segment", 0))
            self._segment_start = int(state.get("segment_start_version", 0))
            self._fg_segment_start = _opt_float(state.get("fisher_segment_start"))
            self._version = int(state.get("version", 0))
            last = state.get("last_version")
            self._last_version = None if last is None else int(last)
            self.rounds = int(state.get("rounds", 0))
            self.traced_rounds = int(state.get("traced_rounds", 0))
            self._reference_sum = float(_opt_float(state.get("reference_sum")) or 0.0)
            since, changes = state.get("flag_since_version", 0), state.get("flag_changes", 0)
            if not (_is_int(since) and _is_int(changes) and since >= 0 and changes >= 0):
                raise ValueError("flag_since_version and flag_changes must be integers >= 0, got %r "
                                 "and %r" % (since, changes))
            self.flag_since_version, self.flag_changes = since, changes
            self.flag_since_s = None  # a time of the coordinator's clock before the restart
        except (TypeError, ValueError) as exc:
            raise ValueError("invalid CLP probe state: %s" % exc) from exc

    # ---- internals ----------------------------------------------------------------------------
    def _regulating(self, version: int) -> bool:
        return version <= self.config.last_regulated_version

    def _compute(self) -> float:
        """Eq. 2, divided by the number of traces in the window (= m once it is full)."""
        lam = self.config.staleness_decay
        total = sum(math.exp(-lam * st) * f for _, st, f in self._window)
        return total / len(self._window)

    def _criterion(self, fg: float, prev: float, in_clp: bool) -> bool:
        """Eq. 3 with the F_G(T-1) == 0 guard and the ``growth_hysteresis`` band: ``in_clp`` (the
        flag now) stays unless the growth crosses the band's far side (module docstring)."""
        if prev <= 0.0:
            return fg > 0.0
        band = self.config.growth_hysteresis
        threshold = self.config.growth_threshold - band if in_clp else self.config.growth_threshold + band
        return (fg - prev) / prev >= threshold

    def _dwelling(self, version: int, now_s: Optional[float]) -> bool:
        """True while the last flag change is younger than the minimum dwell (versions, seconds)."""
        if self.flag_changes == 0:
            return False
        c = self.config
        if version - self.flag_since_version < c.flag_min_dwell_versions:
            return True
        return (c.flag_min_dwell_s > 0 and self.flag_since_s is not None
                and now_s - self.flag_since_s < c.flag_min_dwell_s)

    @property
    def _fg_prev(self) -> Optional[float]:
        """F_G(T-1): the newest of the earlier estimates (None before the second trace)."""
        return self._fg_history[-1] if self._fg_history else None

    @staticmethod
    def _valid_trace(trace: Any, version: int) -> Optional[float]:
        if trace is None:
            return None
        if not _finite(trace) or trace < 0:
            log.warning("v%d: ignoring invalid Fisher trace %r (must be finite and >= 0)", version, trace)
            return None
        return float(trace)


def _opt_float(value: Any) -> Optional[float]:
    if value is None:
        return None
    if not _finite(value):
        raise ValueError("expected a finite number or null, got %r" % (value,))
    return float(value)
