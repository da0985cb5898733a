"""Each simulated device's labelled sensor stream over VIRTUAL time (scenarios: docs/simulation.md).

Arrivals: window i of a device arrives at ``(i + phase) / windows_per_s`` (``phase`` in [0, 1), fixed
per device), so ``windows(0, 5) + windows(5, 10) == windows(0, 10)`` however the timeline is cut.
Window i's class and sample come from a counter-based hash of (seed, device, i), not a stateful
generator, so they never depend on the call pattern. The class is drawn from ``class_distribution``
at the arrival time; the sample, with replacement, from the device's partition pool of that class.
When the pool lacks the class, the window comes from the whole training set's windows of that class
(``missing="global"``, default: the schedule is imposed, as AdaCLP's server imposes a class on every
client); ``missing="local"`` instead moves that class's probability to a random class of the pool
(AdaCLP sec. 5.1: "if a client does not have data of class C_i, it randomly picks another class").
Schedules are piecewise constant over segments ("periods") built lazily as time advances, so a long
run never materializes its timeline. Durations scale with ``duration_s`` (the papers count rounds or
frames, not seconds); each kind's defaults and their sources are in its ``_kind_*`` docstring.
"""
import math
from typing import Dict, FrozenSet, List, Optional, Tuple

import numpy as np

from streamfl.errors import ConfigError
from streamfl.sensors.datasets import Dataset
from streamfl.sim.stream_kinds import BUILDERS
from streamfl.sim.stream_timeline import (
    T_CLASS, T_PERM, T_PHASE, T_SAMPLE, AggregationClock, KindContext, Timeline, hash_uniform,
    keyed_rng, stream_key)

KINDS = ("iid", "extreme", "non_extreme", "periodic", "aperiodic_rare", "new_class_frames",
         "sessions", "domain_incremental", "latent_states")
MISSING = ("global", "local")


class DeviceStream:
    """One device's windows over virtual time; built by ``make_streams`` (see the module docstring)."""

    def __init__(self, ds: Dataset, pool: np.ndarray, device: int, kind: str, seed: int,
                 windows_per_s: float, duration_s: float, timeline: Timeline,
                 global_by_class: List[np.ndarray], num_periods: Optional[int] = None,
                 domain: Optional[str] = None, params: Optional[Dict] = None, meta: Optional[Dict] = None,
                 states: Optional[List[int]] = None):
        self.ds, self.pool, self.device, self.kind = ds, np.asarray(pool, dtype=np.int64), device, kind
        self.seed, self.windows_per_s = int(seed), float(windows_per_s)
        self.duration_s = float(duration_s)
        self.timeline, self.params, self.meta = timeline, dict(params or {}), dict(meta or {})
        self.num_classes = ds.num_classes
        self._num_periods, self._domain, self._states = num_periods, domain, states
        self.phase = float(hash_uniform(stream_key(seed, T_PHASE, device), np.zeros(1))[0])
        self._k_class, self._k_sample = stream_key(seed, T_CLASS, device), stream_key(seed, T_SAMPLE, device)
        pool_y = ds.y[self.pool]
        self._by_class = [self.pool[pool_y == c] for c in range(self.num_classes)]
        self._global = global_by_class
        self._perms = {}  # type: Dict[int, np.ndarray]

    # -- arrivals
    def _index_range(self, t0_s: float, t1_s: float) -> Tuple[int, int]:
        lo = max(0, int(math.ceil(t0_s * self.windows_per_s - self.phase)))
        hi = max(0, int(math.ceil(t1_s * self.windows_per_s - self.phase)))
        return lo, max(lo, hi)

    def count(self, t0_s: float, t1_s: float) -> int:
        """How many windows arrive in [t0_s, t1_s)."""
        lo, hi = self._index_range(t0_s, t1_s)
        return hi - lo

    def arrival_times_s(self, t0_s: float, t1_s: float) -> np.ndarray:
        """Arrival times (float64) of the windows in [t0_s, t1_s)."""
        lo, hi = self._index_range(t0_s, t1_s)
        return (np.arange(lo, hi, dtype=np.float64) + self.phase) / self.windows_per_s

    def draw(self, t0_s: float, t1_s: float) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(dataset row int64 [n], label int64 [n], period int64 [n]) of the windows in [t0_s, t1_s)."""
        lo, hi = self._index_range(t0_s, t1_s)
        idx = np.arange(lo, hi, dtype=np.int64)
        ts = (idx + self.phase) / self.windows_per_s
        seg = self.timeline.segment(ts)
        probs = self.timeline.probs(ts, seg)
        cdf = np.cumsum(probs, axis=1)
        cdf /= cdf[:, -1:]
        u = hash_uniform(self._k_class, idx)
        y = np.minimum((cdf <= u[:, None]).sum(axis=1), self.num_classes - 1).astype(np.int64)
        v = hash_uniform(self._k_sample, idx)
        rows = np.empty(len(idx), dtype=np.int64)
        for c in np.unique(y):
            at = np.flatnonzero(y == c)
            src = self._by_class[c] if len(self._by_class[c]) else self._global[c]
            rows[at] = src[np.minimum((v[at] * len(src)).astype(np.int64), len(src) - 1)]
        return rows, y, seg.astype(np.int64)

    def windows(self, t0_s: float, t1_s: float) -> Tuple[np.ndarray, np.ndarray]:
        """(X float32 [n, T, C], y int64 [n]) of the windows arriving in [t0_s, t1_s)."""
        X, y, _ = self.windows_with_states(t0_s, t1_s)
        return X, y

    def windows_with_states(self, t0_s: float, t1_s: float) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``windows`` with each window's latent state (int64 [n]; -1 but for "latent_states")."""
        rows, y, period = self.draw(t0_s, t1_s)
        if self._states is None:
            states = np.full(len(rows), -1, dtype=np.int64)
        else:
            states = np.asarray([self._states[p] for p in period.tolist()], dtype=np.int64)
        X = self.ds.X[rows]
        if self._domain is not None and len(rows):
            for p in np.unique(period):
                at = np.flatnonzero(period == p)
                X[at] = self.transform(X[at], int(p))
        return X, y, states

    # -- the schedule
    def class_distribution(self, t_s: float) -> np.ndarray:
        """Class probabilities [K] (float64, sum 1) of a window arriving at ``t_s``."""
        return self.timeline.probs(np.asarray([float(t_s)]))[0].copy()

    def period(self, t_s: float) -> int:
        """Index of the period (segment: period, phase, frame, session, state slot) holding ``t_s``."""
        return int(self.timeline.segment(np.asarray([float(t_s)]))[0])

    def classes_seen(self, t_s: float) -> FrozenSet[int]:
        """Classes with positive probability at any time in [0, t_s]."""
        p = self.period(t_s)
        seen = set(np.flatnonzero(self.timeline.rows[:p + 1].max(axis=0) > 0).tolist())
        if self.timeline.bursts is not None:
            seen |= self.timeline.bursts.seen(t_s)
        return frozenset(int(c) for c in seen)

    def state(self, t_s: float) -> Optional[int]:
        """Latent state at ``t_s`` ("latent_states" only; None for other kinds)."""
        if self._states is None:
            return None
        return int(self._states[self.period(t_s)])

    @property
    def period_bounds_s(self) -> np.ndarray:
        """Start times of the periods that begin before ``duration_s`` (float64, first is 0)."""
        self.timeline.cover(self.duration_s)
        starts = self.timeline.starts_s
        return starts[starts < self.duration_s].copy()

    @property
    def num_periods(self) -> int:
        """Periods in the run: fixed for "domain_incremental", else those starting before duration_s."""
        if self._num_periods is not None:
            return self._num_periods
        return int(len(self.period_bounds_s))

    def transform(self, X: np.ndarray, period: int) -> np.ndarray:
        """Inputs as seen in ``period``: identity, except "domain_incremental", where period p > 0
        applies its fixed change of ``domain`` (ST-EWC sec. 5; ``sim.stream_kinds``): "pixels"
        permutes the flattened window (PermutedMNIST), "channels" the last axis, "rotation" turns
        each x/y/z channel triple by the period's random rotation (channels past the last whole
        triple stay as they are)."""
        if self._domain is None or int(period) == 0:
            return X
        X = np.asarray(X)
        p = int(period)
        if p not in self._perms:
            rng = keyed_rng(self.seed, T_PERM, p)
            if self._domain == "rotation":
                q, r = np.linalg.qr(rng.normal(size=(3, 3)))
                q = q * np.sign(np.diag(r))  # uniform on O(3); flip one axis if needed for SO(3)
                self._perms[p] = (q if np.linalg.det(q) > 0 else q * np.array([1.0, 1.0, -1.0])).astype(X.dtype)
            else:
                size = X.shape[-1] if self._domain == "channels" else int(np.prod(X.shape[1:]))
                self._perms[p] = rng.permutation(size)
        if self._domain == "channels":
            return X[..., self._perms[p]]
        if self._domain == "rotation":
            out = np.array(X, copy=True)
            for c in range(0, X.shape[-1] - 2, 3):
                out[..., c:c + 3] = X[..., c:c + 3] @ self._perms[p].T
            return out
        flat = X.reshape(X.shape[0], -1)
        return flat[:, self._perms[p]].reshape(X.shape)

    def __repr__(self) -> str:
        return "DeviceStream(device=%d, kind=%r, pool=%d windows, %.3g windows/s)" % (
            self.device, self.kind, len(self.pool), self.windows_per_s)



def make_streams(ds: Dataset, parts: List[np.ndarray], kind: str, seed: int, windows_per_s: float,
                 duration_s: float, clock: Optional[AggregationClock] = None,
                 **params) -> List[DeviceStream]:
    """One ``DeviceStream`` per partition in ``parts`` over the training set ``ds``.

    ``params`` override the kind's defaults (sources in the ``_kind_*`` docstrings; K = classes,
    D = ``duration_s``); every kind also takes ``missing`` ("global" | "local", module docstring):

    - iid: mix="uniform" | "pool"
    - extreme: mu_s=D/(2K), sigma_s=mu_s/8, min_s=mu_s/4, shared_order=False; or periods counted
      in the run's aggregations (``clock``): mu_aggregations, sigma_aggregations=mu/8, min=mu/4
    - non_extreme: as extreme, beta=0.2, shared=False
    - periodic: period_s=D/3, phases=K, beta=0.2 (None: one class per phase)
    - aperiodic_rare: as extreme, n_rare=1, rare_prob=0.01, burst_s=mu_s/10
    - new_class_frames: frame_s=D/3, initial_frac=0.6, new_frac=0.4, two_class_frac=1/3, new_frames=2, first_frame_s=frame_s
    - sessions: session_s=D/5, label_overlap=0.2, dirichlet_alpha=0.3, labels_per_session=K//2,
      per_device=False
    - domain_incremental: num_periods=5, period_s=D/num_periods, mix="uniform" | "pool",
      domain="pixels" | "channels" | "rotation"
    - latent_states: n_states=12, concentrations=(0.05, 0.1, 0.2, 0.5, 1, 100), state_s=D/50,
      access="full" | "partial", states_per_device=n_states/6, stay_prob=0, high_het_frac=0.5

    Each stream's ``params`` holds the resolved values, ``meta`` kind facts (rare_classes,
    initial_classes; latent: state_probs, accessible_states, state_class_probs). Unknown kinds or
    parameters raise ``ConfigError``.
    """
    if kind not in BUILDERS:
        raise ConfigError("unknown stream kind %r (choose one of %s)" % (kind, ", ".join(KINDS)))
    if not windows_per_s > 0 or not duration_s > 0:
        raise ConfigError("streams need windows_per_s > 0 and duration_s > 0, got %r and %r" % (
            windows_per_s, duration_s))
    if not parts:
        raise ConfigError("streams need at least one device partition")
    params = dict(params)
    missing = params.pop("missing", "global")
    if missing not in MISSING:
        raise ConfigError("missing must be one of %s, got %r" % (", ".join(MISSING), missing))
    global_by_class = [np.flatnonzero(ds.y == c) for c in range(ds.num_classes)]
    ctx = KindContext(ds, [np.asarray(p, dtype=np.int64) for p in parts], int(seed), float(duration_s),
               missing, global_by_class, clock)
    if ctx.kp == 0:
        raise ConfigError("the training set holds no windows")
    timelines, resolved = BUILDERS[kind](ctx, params)
    metas = resolved.pop("_metas", None)
    resolved["missing"] = missing
    meta_common = {k: resolved[k] for k in ("rare_classes", "initial_classes") if k in resolved}
    out = []
    for d, timeline in enumerate(timelines):
        meta = dict(meta_common, **(metas[d] if metas else {}))
        out.append(DeviceStream(
            ds, ctx.parts[d], d, kind, int(seed), windows_per_s, duration_s, timeline,
            global_by_class, num_periods=int(resolved["num_periods"]) if kind == "domain_incremental"
            else None, domain=resolved.get("domain") if kind == "domain_incremental" else None,
            params=resolved, meta=meta,
            states=meta.pop("states", None)))
    return out


__all__ = ["KINDS", "MISSING", "DeviceStream", "make_streams"]
