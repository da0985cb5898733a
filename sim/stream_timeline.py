"""Schedule primitives for ``sim.streams``: call-order-free randomness, class rows, lazy timelines.

Split out of ``streams`` (to keep it short) so the kind builders and ``DeviceStream`` share one source.
Public within the simulator, for ``stream_kinds`` (the per-kind builders) and ``streams``
(``DeviceStream``, ``make_streams``):

- ``T_*``: the tags that key each kind of draw, so two draws never share a random stream;
- ``keyed_rng``, ``stream_key``, ``hash_uniform``: randomness fixed by its key, not by call order;
- ``onehot``, ``uniform_row``, ``dirichlet_row``: class-distribution rows of length K;
- ``Timeline``, ``RandomBounds``, ``Bursts``: lazily grown segments, period starts and rare bursts;
- ``AggregationClock``, ``CountedBounds``: period starts counted in aggregations;
- ``KindContext``: what every kind builder gets (dataset facts, seed, run length, ``missing``);
- ``Frames``, ``LabelChain``, ``LatentStates``: the schedule state of one kind each.
"""
import math
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

import numpy as np

from streamfl.sensors.datasets import Dataset

#: Tags: the key part after the seed in every ``keyed_rng`` / ``stream_key``, one per kind of draw.
(T_PHASE, T_CLASS, T_SAMPLE, T_ORDER, T_ROW, T_BOUNDS, T_PERM, T_FIX, T_RARE, T_BURST,
 T_FRAMES, T_CHAIN, T_STATES) = range(1, 14)
_MASK64 = 0xFFFFFFFFFFFFFFFF
_GOLDEN, _M1, _M2 = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9),
                     np.uint64(0x94D049BB133111EB))


# ---------------------------------------------------------------- randomness that ignores call order

def keyed_rng(*parts: int) -> np.random.Generator:
    """A generator fixed by its key parts (seed, tag, device, ...)."""
    return np.random.default_rng([int(p) & _MASK64 for p in parts])


def stream_key(*parts: int) -> np.uint64:
    """A 64-bit stream key for ``hash_uniform``."""
    return np.random.SeedSequence([int(p) & _MASK64 for p in parts]).generate_state(1, np.uint64)[0]


def hash_uniform(key: np.uint64, idx: np.ndarray) -> np.ndarray:
    """Uniforms in [0, 1) from splitmix64 of ``key + idx * golden``: element i depends on i only."""
    with np.errstate(over="ignore"):
        z = idx.astype(np.uint64) * _GOLDEN + key
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


# ---------------------------------------------------------------- class-distribution rows

def onehot(c: int, k: int) -> np.ndarray:
    """All of the mass on class ``c``."""
    row = np.zeros(k)
    row[int(c)] = 1.0
    return row


def uniform_row(classes, k: int) -> np.ndarray:
    """Equal mass on each of ``classes``."""
    row = np.zeros(k)
    row[np.asarray(list(classes), dtype=np.int64)] = 1.0
    return row / row.sum()


def dirichlet_row(rng: np.random.Generator, alpha: float, support: np.ndarray, k: int) -> np.ndarray:
    """Dirichlet(alpha) over ``support``; an all-underflow draw (alpha << 1) becomes one-hot."""
    g = rng.gamma(float(alpha), 1.0, len(support))
    row = np.zeros(k)
    total = g.sum()
    if total > 0 and np.isfinite(total):
        row[support] = g / total
    else:
        row[support[rng.integers(len(support))]] = 1.0
    return row


# ---------------------------------------------------------------- lazily grown timelines

class Timeline:
    """Segments [start_i, start_{i+1}) with a class row each, appended in order as time advances.

    ``start_fn(i)`` and ``row_fn(i)`` are called once per segment, for i = 0, 1, 2, ... in order (so
    a row function may carry sequential state, e.g. a Markov chain); ``last`` ends the growth (the
    last segment lasts forever); ``fix(row, key)`` is the ``missing="local"`` remap.
    """

    def __init__(self, k: int, start_fn: Callable[[int], float], row_fn: Callable[[int], np.ndarray],
                 last: Optional[int] = None, fix: Optional[Callable] = None, bursts=None):
        self.k, self._start_fn, self._row_fn, self._last, self._fix = k, start_fn, row_fn, last, fix
        self.bursts = bursts
        self._starts = []  # type: List[float]
        self._rows = []  # type: List[np.ndarray]
        self._done = False
        self.starts_s = np.zeros(0)
        self.rows = np.zeros((0, k))

    def cover(self, t_s: float) -> None:
        """Grow until the segment holding ``t_s`` is closed (or is the everlasting last one)."""
        n0 = len(self._starts)
        changed = self._resolve_pending()
        while not self._done and (not self._starts or self._starts[-1] <= t_s):
            i = len(self._starts)
            start, row = float(self._start_fn(i)), np.asarray(self._row_fn(i), dtype=np.float64)
            if self._starts and not start > self._starts[-1]:
                raise ValueError("segment %d starts at %r, not after %r" % (i, start, self._starts[-1]))
            self._starts.append(start)
            self._rows.append(self._fix(row, (0, i)) if self._fix else row)
            self._done = self._last is not None and i >= self._last
        if changed or len(self._starts) != n0:
            self.starts_s = np.asarray(self._starts)
            self.rows = np.stack(self._rows)

    def _resolve_pending(self) -> bool:
        """A segment whose start was not known yet (``inf``: it begins at an aggregation count not
        reached so far, ``CountedBounds``) gets its time once the count is reached."""
        if not self._starts or not math.isinf(self._starts[-1]):
            return False
        i = len(self._starts) - 1
        start = float(self._start_fn(i))
        if math.isinf(start):
            return False
        if i and not start > self._starts[i - 1]:  # two boundaries at one instant: keep the order
            start = float(np.nextafter(self._starts[i - 1], math.inf))
        self._starts[i] = start
        return True

    def segment(self, ts: np.ndarray) -> np.ndarray:
        """Segment index of each time (times before 0 count as segment 0)."""
        if ts.size:
            self.cover(float(ts.max()))
        else:
            self.cover(0.0)
        return np.maximum(np.searchsorted(self.starts_s, ts, side="right") - 1, 0)

    def probs(self, ts: np.ndarray, seg: Optional[np.ndarray] = None) -> np.ndarray:
        """Class distribution [n, K] at each time (``seg``: its known segments), bursts included."""
        if seg is None:
            seg = self.segment(ts)
        out = self.rows[seg]  # after segment(): it may grow ``rows``
        if self.bursts is not None:
            out = self.bursts.apply(ts, out)
        return out


class RandomBounds:
    """Period starts with lengths ~ N(mu_s, sigma_s) clipped below at min_s (AdaCLP sec. 5.1)."""

    def __init__(self, rng: np.random.Generator, mu_s: float, sigma_s: float, min_s: float):
        self._rng, self.mu_s, self.sigma_s, self.min_s = rng, mu_s, sigma_s, min_s
        self._starts = [0.0]

    def start(self, i: int) -> float:
        while len(self._starts) <= i:
            length_s = max(self.min_s, self._rng.normal(self.mu_s, self.sigma_s))
            self._starts.append(self._starts[-1] + length_s)
        return self._starts[i]


class AggregationClock:
    """The virtual time of each aggregation the coordinator made, for periods counted in
    aggregations: AdaCLP's T_i ~ N(400, 50) counts server rounds, not seconds (sec. 5.1), so a
    method that aggregates less often (lower clocks, fewer rounds) also switches classes later.

    ``unit="updates"`` counts the updates merged instead: one per FedAsync version, a whole
    round's for FedAvg, so a synchronous method gets as much training per class as an
    asynchronous one in a run too short for hundreds of its rounds."""

    def __init__(self) -> None:
        self._times_s: Dict[str, List[float]] = {"aggregations": [], "updates": []}

    def record(self, t_s: float, merged: int = 1) -> None:
        """One more aggregation, at ``t_s``, of ``merged`` updates (the runtime calls this for
        every new version)."""
        self._times_s["aggregations"].append(float(t_s))
        self._times_s["updates"].extend([float(t_s)] * max(1, int(merged)))

    def time_of(self, n: int, unit: str = "aggregations") -> float:
        """When the ``n``-th aggregation (or merged update) happened (0 for n <= 0); ``inf``
        while it has not."""
        if n <= 0:
            return 0.0
        times = self._times_s[unit]
        return times[n - 1] if n <= len(times) else math.inf


class CountedBounds:
    """Period starts after N(mu, sigma) >= minimum aggregations each: ``start(i)`` is the time the
    clock reached the i-th boundary's count, ``inf`` until it has (``Timeline`` then waits)."""

    def __init__(self, rng: np.random.Generator, mu: float, sigma: float, minimum: float,
                 clock: AggregationClock, unit: str = "aggregations"):
        self._rng, self.mu, self.sigma, self.minimum, self.clock = rng, mu, sigma, minimum, clock
        self.unit = unit
        self._counts = [0]

    def count(self, i: int) -> int:
        """The aggregation count at which period ``i`` starts."""
        while len(self._counts) <= i:
            length = max(self.minimum, self._rng.normal(self.mu, self.sigma))
            self._counts.append(self._counts[-1] + max(1, int(round(length))))
        return self._counts[i]

    def start(self, i: int) -> float:
        return self.clock.time_of(self.count(i), self.unit)


class Bursts:
    """Rare classes in bursts of ``burst_s``: gaps Exp so each class holds ``share`` of the time."""

    def __init__(self, k: int, classes: Sequence[int], rngs: List[np.random.Generator],
                 burst_s: float, share: float, fix: Optional[Callable]):
        self.classes, self._rngs, self.burst_s = [int(c) for c in classes], rngs, burst_s
        self._mean_gap_s = burst_s * (1.0 / share - 1.0)
        self._starts = [[self._rngs[j].exponential(self._mean_gap_s)] for j in range(len(rngs))]
        rows = [onehot(c, k) for c in self.classes]
        self._rows = [fix(r, (1, j)) if fix else r for j, r in enumerate(rows)]

    def _cover(self, j: int, t_s: float) -> np.ndarray:
        starts = self._starts[j]
        while starts[-1] <= t_s:
            starts.append(starts[-1] + self.burst_s + self._rngs[j].exponential(self._mean_gap_s))
        return np.asarray(starts)

    def apply(self, ts: np.ndarray, probs: np.ndarray) -> np.ndarray:
        """Override rows whose time falls inside a burst (the later-listed class wins overlaps)."""
        if not ts.size:
            return probs
        probs = probs.copy()
        for j in range(len(self.classes)):
            starts = self._cover(j, float(ts.max()))
            last = np.searchsorted(starts, ts, side="right") - 1
            inside = (last >= 0) & (ts < starts[np.maximum(last, 0)] + self.burst_s)
            probs[inside] = self._rows[j]
        return probs

    def seen(self, t_s: float) -> FrozenSet[int]:
        """Classes of bursts that started at or before ``t_s``."""
        out = set()
        for j in range(len(self.classes)):
            if self._starts[j][0] <= t_s:
                out.update(np.flatnonzero(self._rows[j] > 0).tolist())
        return frozenset(out)



# ---------------------------------------------------------------- what every kind builder gets

class KindContext:
    """What every kind builder needs: dataset facts, seed, run length and the ``missing`` remap."""

    def __init__(self, ds: Dataset, parts: List[np.ndarray], seed: int, duration_s: float,
                 missing: str, global_by_class: List[np.ndarray],
                 clock: Optional[AggregationClock] = None):
        self.ds, self.parts, self.seed = ds, parts, seed
        #: The run's aggregations, for periods counted in them (None outside a simulator run).
        self.clock = clock
        self.duration_s, self.missing = duration_s, missing
        self.k = ds.num_classes
        self.n = len(parts)
        self.present = np.asarray([c for c in range(self.k) if len(global_by_class[c])], dtype=np.int64)
        self.kp = len(self.present)
        self.has = [np.bincount(ds.y[p], minlength=self.k) > 0 for p in parts]

    def fix(self, d: int) -> Optional[Callable]:
        """``missing="local"``: move mass of classes device d lacks to a random class it has."""
        has = self.has[d]
        if self.missing != "local" or not has.any():
            return None
        own = np.flatnonzero(has)
        seed = self.seed

        def remap(row: np.ndarray, key: Tuple[int, ...]) -> np.ndarray:
            lacking = np.flatnonzero((row > 0) & ~has)
            if not len(lacking):
                return row
            row = row.copy()
            rng = keyed_rng(seed, T_FIX, d, *key)
            for c in lacking:
                row[own[rng.integers(len(own))]] += row[c]
                row[c] = 0.0
            return row
        return remap

    def pool_row(self, d: int) -> np.ndarray:
        counts = np.bincount(self.ds.y[self.parts[d]], minlength=self.k).astype(np.float64)
        return counts / counts.sum() if counts.sum() else uniform_row(self.present, self.k)


# ---------------------------------------------------------------- per-kind schedule state

class Frames:
    """FedTeddi's frames: each device's class set per frame, grown frame by frame (shared by all)."""

    def __init__(self, ctx: KindContext, p: Dict):
        self._rng = keyed_rng(ctx.seed, T_FRAMES)
        self.n, self.k, self.p = ctx.n, ctx.k, p
        order = self._rng.permutation(ctx.present)
        n_init = min(ctx.kp, max(1, int(math.ceil(p["initial_frac"] * ctx.kp))))
        self.initial, new = order[:n_init], order[n_init:]
        self.blocks = np.array_split(new, min(len(new), int(p["new_frames"]))) if len(new) else []
        held = np.zeros((ctx.n, ctx.k), dtype=bool)
        firsts = self._rng.permutation(ctx.n)
        for j, dev in enumerate(firsts):  # round robin over the initial classes: all are covered
            held[dev, self.initial[j % n_init]] = True
            if n_init > 1 and self._rng.random() < p["two_class_frac"]:
                others = np.setdiff1d(self.initial, [self.initial[j % n_init]])
                held[dev, others[self._rng.integers(len(others))]] = True
        self.held = [held]

    def classes(self, frame: int, d: int) -> np.ndarray:
        while len(self.held) <= frame:
            self._grow()
        return np.flatnonzero(self.held[frame][d])

    def _grow(self) -> None:
        frame = len(self.held)
        held = self.held[-1].copy()
        block = self.blocks[frame - 1] if frame - 1 < len(self.blocks) else np.zeros(0, dtype=np.int64)
        introduced = np.concatenate([self.initial] + list(self.blocks[:frame]))
        n_sel = int(round(self.p["new_frac"] * self.n))
        for j, dev in enumerate(self._rng.choice(self.n, n_sel, replace=False)):
            if len(block) and not held[dev, block[j % len(block)]]:
                held[dev, block[j % len(block)]] = True  # round robin: every new class arrives
                continue
            lacking = introduced[~held[dev, introduced]]
            if len(lacking):
                held[dev, lacking[self._rng.integers(len(lacking))]] = True
        self.held.append(held)



class LabelChain:
    """Label sets per session; session s keeps round(overlap * L) labels of session s - 1."""

    def __init__(self, rng: np.random.Generator, present: np.ndarray, size: int, overlap: float):
        self._rng, self._present, self._size, self._overlap = rng, present, size, overlap
        self.sets = [np.sort(rng.choice(present, size, replace=False))]

    def labels(self, s: int) -> np.ndarray:
        while len(self.sets) <= s:
            prev = self.sets[-1]
            keep = self._rng.choice(prev, int(round(self._overlap * self._size)), replace=False)
            fresh = self._rng.permutation(np.setdiff1d(self._present, prev))
            refill = self._rng.permutation(np.setdiff1d(prev, keep))  # when too few fresh labels
            pick = np.concatenate([fresh, refill])[:self._size - len(keep)]
            self.sets.append(np.sort(np.concatenate([keep, pick]).astype(np.int64)))
        return self.sets[s]



class LatentStates:
    """SFedPO App. H.1 state space: M states in clusters, each with a Dirichlet(concentration) mix."""

    def __init__(self, ctx: KindContext, p: Dict):
        m, concs = int(p["n_states"]), [float(c) for c in p["concentrations"]]
        rng = keyed_rng(ctx.seed, T_STATES)
        self.conc = np.asarray([concs[j * len(concs) // m] for j in range(m)])
        self.class_probs = np.stack([dirichlet_row(rng, a, ctx.present, ctx.k) for a in self.conc])
        self.high = np.flatnonzero(self.conc <= 0.1)  # SFedPO's high-heterogeneity clusters
        n_high = int(round(p["high_het_frac"] * ctx.n))
        self.high_devices = set(rng.permutation(ctx.n)[:n_high].tolist())

