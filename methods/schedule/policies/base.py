"""The device-scheduling policy interface: a sans-I/O object that picks, each round, which of the
candidate devices train, from arrays the coordinator plug-in builds out of the fleet's reports.

A policy sees only ``Candidates`` (one row per device), the round's ``Budget`` and ``RoundInfo``;
it never talks to a device, so every policy is testable on plain arrays. FedTeddi and the paper's
seven baselines (FedTeddi paper, section V-A) are one module each beside this one.

Devices that hold nothing (zero samples or an all-zero ``p_now`` row) have nothing to train on and
are never chosen by any policy, matching ``teddi.greedy_select``; ``holds_data`` is that mask.
Devices marked ``busy`` (invited earlier and still training: FedAsync's cohort refilled as its
devices come back) are never chosen either; policies that judge a set as a whole (FedTeddi,
FedCGD, FedCBS) count them in it. The budget a policy gets is what the busy devices leave.
"""
import abc
import dataclasses
import logging
import math
from typing import Any, ClassVar, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from streamfl.methods.schedule.policies.teddi import DEFAULT_BATCH, DEFAULT_SIGMA

log = logging.getLogger(__name__)


def _frozen(name: str, x, ndim: int) -> np.ndarray:
    """A read-only float64 copy of ``x`` with ``ndim`` dimensions (the policy cannot write through
    to the caller's arrays, nor the caller change a Candidates after validation)."""
    a = np.array(x, dtype=np.float64)
    if a.ndim != ndim:
        raise ValueError("Candidates.%s must be %d-dimensional, got shape %s"
                         % (name, ndim, a.shape))
    a.setflags(write=False)
    return a


def _check_nonnegative(name: str, a: np.ndarray, allow_nan: bool, allow_inf: bool) -> None:
    if not allow_nan and np.isnan(a).any():
        raise ValueError("Candidates.%s contains NaN" % name)
    if not allow_inf and np.isinf(a).any():
        raise ValueError("Candidates.%s contains inf" % name)
    known = a[~np.isnan(a)]
    if known.size and known.min() < 0:
        raise ValueError("Candidates.%s must be >= 0, got a minimum of %r"
                         % (name, float(known.min())))


@dataclasses.dataclass(frozen=True, eq=False)
class Candidates:
    """The devices a round may choose from, as arrays (row i = device_ids[i]). Compared by identity
    (``eq=False``): a field-wise ``==`` on arrays has no single truth value."""

    device_ids: Tuple[str, ...]
    #: [N, C] float64 >= 0: each device's current class counts (or shares).
    p_now: np.ndarray
    #: [N, C] the previous frame's class counts (equal to p_now when no frame change).
    p_prev: np.ndarray
    #: [N] sample counts D_n (>= 0).
    samples: np.ndarray
    #: [C] per-class weights of eq. 18 (>= 0).
    L: np.ndarray
    #: [N] budget units device i uses if chosen (Hz of bandwidth in the shared-channel mode; 0.0
    #: when there is no bandwidth budget); inf = it cannot meet the deadline and is never chosen.
    cost: np.ndarray
    #: [N] L2 norm of the device's latest local gradient/update; nan = unknown.
    grad_norm: np.ndarray
    #: [N] the device's latest local training loss; nan = unknown.
    loss: np.ndarray
    #: [N] channel quality P|H|^2/N0 (Hz); nan = unknown.
    snr_hz: np.ndarray
    #: [N] estimated round latency (compute + upload) in seconds; nan = unknown.
    latency_s: np.ndarray
    #: [N] bool: already in the set (invited, not back yet), never chosen again; None: nobody.
    busy: Optional[np.ndarray] = None

    def __post_init__(self):
        ids = tuple(self.device_ids)
        if any(not isinstance(d, str) or not d for d in ids):
            raise ValueError("Candidates.device_ids must be non-empty strings, got %r" % (ids,))
        if len(set(ids)) != len(ids):
            dup = sorted({d for d in ids if ids.count(d) > 1})
            raise ValueError("Candidates.device_ids has duplicates: %s" % ", ".join(dup))
        object.__setattr__(self, "device_ids", ids)
        n = len(ids)
        p_now = _frozen("p_now", self.p_now, 2)
        if p_now.shape[0] != n:
            raise ValueError("Candidates.p_now has %d rows, expected %d (one per device id)"
                             % (p_now.shape[0], n))
        c = p_now.shape[1]
        fields = {"p_now": p_now, "p_prev": _frozen("p_prev", self.p_prev, 2)}
        if fields["p_prev"].shape != p_now.shape:
            raise ValueError("Candidates.p_prev has shape %s, p_now has %s"
                             % (fields["p_prev"].shape, p_now.shape))
        fields["L"] = _frozen("L", self.L, 1)
        if fields["L"].shape[0] != c:
            raise ValueError("Candidates.L has length %d, expected %d (one per class)"
                             % (fields["L"].shape[0], c))
        for name in ("samples", "cost", "grad_norm", "loss", "snr_hz", "latency_s"):
            a = _frozen(name, getattr(self, name), 1)
            if a.shape[0] != n:
                raise ValueError("Candidates.%s has length %d, expected %d (one per device id)"
                                 % (name, a.shape[0], n))
            fields[name] = a
        for name in ("p_now", "p_prev", "samples", "L"):
            _check_nonnegative(name, fields[name], allow_nan=False, allow_inf=False)
        _check_nonnegative("cost", fields["cost"], allow_nan=False, allow_inf=True)
        for name in ("grad_norm", "snr_hz", "latency_s"):
            _check_nonnegative(name, fields[name], allow_nan=True, allow_inf=True)
        busy = np.zeros(n, dtype=bool) if self.busy is None else np.array(self.busy, dtype=bool)
        if busy.shape != (n,):
            raise ValueError("Candidates.busy has shape %s, expected (%d,)" % (busy.shape, n))
        busy.setflags(write=False)
        fields["busy"] = busy
        for name, a in fields.items():
            object.__setattr__(self, name, a)

    @property
    def num_devices(self) -> int:
        """N, the number of candidate devices."""
        return len(self.device_ids)

    @property
    def num_classes(self) -> int:
        """C, the number of classes."""
        return int(self.p_now.shape[1])

    def holds_data(self) -> np.ndarray:
        """[N] bool: the device has samples and a non-empty class distribution to train on."""
        return (self.samples > 0) & (self.p_now.sum(axis=1) > 0)


@dataclasses.dataclass(frozen=True)
class Budget:
    """What one round may spend: a total of ``Candidates.cost`` and a cap on the set's size."""

    #: The sum of cost over the chosen set must be <= total.
    total: float = math.inf
    #: Cap on the set's size (None: no cap); >= 1 when given.
    max_devices: Optional[int] = None

    def __post_init__(self):
        total = float(self.total)
        if math.isnan(total) or total < 0:
            raise ValueError("Budget.total must be >= 0 (inf for no budget), got %r"
                             % (self.total,))
        object.__setattr__(self, "total", total)
        m = self.max_devices
        if m is not None:
            if isinstance(m, bool) or not isinstance(m, (int, np.integer)):
                raise ValueError("Budget.max_devices must be an integer or None, got %r" % (m,))
            if m < 1:
                raise ValueError("Budget.max_devices must be >= 1, got %d" % m)
            object.__setattr__(self, "max_devices", int(m))


@dataclasses.dataclass(frozen=True)
class RoundInfo:
    """Where the round stands in its frame, and eq. 17's noise parameters."""

    #: Round index within the current frame (0 at a frame start).
    k: int
    #: Planned rounds per frame (> 0).
    K: int
    #: Gradient-noise scale for eq. 17.
    sigma: float = DEFAULT_SIGMA
    #: Local batch size b of eq. 17.
    batch: int = DEFAULT_BATCH

    def __post_init__(self):
        if not self.k >= 0:
            raise ValueError("RoundInfo.k must be >= 0, got %r" % (self.k,))
        if not self.K > 0:
            raise ValueError("RoundInfo.K must be > 0, got %r" % (self.K,))
        if not (math.isfinite(self.sigma) and self.sigma >= 0):
            raise ValueError("RoundInfo.sigma must be finite and >= 0, got %r" % (self.sigma,))
        if not self.batch >= 1:
            raise ValueError("RoundInfo.batch must be >= 1, got %r" % (self.batch,))


class SchedulingPolicy(abc.ABC):
    """Picks the devices that train this round; randomized policies draw from ``self.rng`` only, so
    two instances with the same seed make the same picks from the same inputs."""

    #: The name ``make_policy`` knows it by (the registry key).
    name: ClassVar[str] = ""
    #: Option name -> default value; the only keyword options ``__init__`` accepts.
    defaults: ClassVar[Mapping[str, Any]] = {}

    def __init__(self, seed: int = 0, **options):
        unknown = sorted(set(options) - set(self.defaults))
        if unknown:
            raise ValueError("scheduling policy %s: unknown option%s %s (known: %s)" % (
                self.name, "s" if len(unknown) > 1 else "", ", ".join(unknown),
                ", ".join(sorted(self.defaults)) or "none"))
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        merged = dict(self.defaults)
        merged.update(options)
        self.options: Dict[str, Any] = self.check_options(merged)

    def check_options(self, options: Dict[str, Any]) -> Dict[str, Any]:
        """``options`` (defaults filled in) validated; ValueError naming the bad one. Override."""
        return options

    @abc.abstractmethod
    def select(self, c: Candidates, budget: Budget, info: RoundInfo) -> np.ndarray:
        """Indices into c (int64, unique, in the order chosen) of the devices to train this
        round."""

    def __repr__(self):
        return "%s(seed=%r, %s)" % (type(self).__name__, self.seed, ", ".join(
            "%s=%r" % kv for kv in sorted(self.options.items())))


def option_number(policy: str, key: str, value: Any, positive: bool = False) -> float:
    """A policy option that must be a finite number >= 0 (> 0 when ``positive``), as a float."""
    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
          and (value > 0 if positive else value >= 0))
    if not ok:
        raise ValueError("%s: %s must be a finite number %s 0, got %r"
                         % (policy, key, ">" if positive else ">=", value))
    return float(value)


def affordable(c: Candidates, budget: Budget) -> np.ndarray:
    """[N] bool: devices a round could take on their own: not busy, data to train on, a finite cost
    (inf means it cannot meet the deadline, even under an infinite total) within the whole budget."""
    return ~c.busy & c.holds_data() & np.isfinite(c.cost) & (c.cost <= budget.total)


def fill(order: Sequence[int], c: Candidates, budget: Budget) -> np.ndarray:
    """Take devices in ``order`` while they fit: skip a device with infinite cost, one that holds no
    data, or one whose cost would overflow the remaining total (then try the next one), stop at
    max_devices."""
    order = np.asarray(order, dtype=np.int64).reshape(-1)
    limit = c.num_devices if budget.max_devices is None else budget.max_devices
    if order.size == 0 or limit == 0:
        return np.zeros(0, dtype=np.int64)
    order = order[affordable(c, budget)[order]]
    cost = c.cost[order]
    if not np.isfinite(budget.total) or cost.sum() <= budget.total:
        return order[:limit].copy()  # everything fits: a prefix
    chosen = []
    remaining = budget.total
    for i, cost_i in zip(order.tolist(), cost.tolist()):
        if cost_i <= remaining:
            chosen.append(i)
            remaining -= cost_i
            if len(chosen) >= limit:
                break
    return np.asarray(chosen, dtype=np.int64)


def order_by(key: np.ndarray, descending: bool) -> np.ndarray:
    """Device indices sorted by ``key`` (NaN last), ties by index."""
    key = np.asarray(key, dtype=np.float64)
    unknown = np.isnan(key)
    value = np.where(unknown, 0.0, -key if descending else key)
    return np.lexsort((np.arange(key.size), value, unknown)).astype(np.int64)
