"""Synchronous FedAvg with a round deadline: the baseline FedAsync is compared against.

A round collects updates trained from the current version (older ones are stale and dropped) and
aggregates them by sample-weighted average (McMahan et al. 2017) once every device that was online
at round start has reported (and at least ``min_updates`` did), or once ``deadline_s`` passed with at
least ``min_updates``; otherwise the deadline restarts. A device reporting twice in one round
replaces its earlier update, so fast devices do not count double. With ``clients_per_round`` a round
closes once that many devices reported; plug-ins (CriticalFL, client sampling) set it as they go.
A scheduler instead names the devices rounds wait for (``expect``): the online ones among them.
A round opened before any device was online waits for whoever is online when it is next checked,
not for the deadline. ``combine`` picks how a round is merged: the weighted ``mean``, or a robust
``median`` / ``trimmed_mean`` (``strategies/robust.py``) when some devices may be hostile.
"""
import logging
from typing import Any, Callable, Collection, Dict, Optional, Sequence, Set

import numpy as np

from streamfl.coordinator.strategies.base import AGGREGATED, BUFFERED, STALE, Aggregator, Outcome
from streamfl.coordinator.strategies.robust import ROBUST_NAMES, coordinate_median, trimmed_mean
from streamfl.protocol.messages import Tensors, Update

log = logging.getLogger(__name__)


def weighted_average(updates: Collection[Update], factors: Optional[Sequence[float]] = None) -> Tensors:
    """Sample-weighted mean of the updates' tensors (equal weights if no update counted samples),
    each weight times its ``factors`` entry (the methods' factors; all 1 if None)."""
    if not updates:
        raise ValueError("weighted_average needs at least one update")
    if factors is None:
        factors = [1.0] * len(updates)
    if len(factors) != len(updates):
        raise ValueError("weighted_average: %d factors for %d updates" % (len(factors), len(updates)))
    raw = [max(0, u.num_samples) * max(0.0, f) for u, f in zip(updates, factors)]
    if sum(raw) <= 0:
        raw = [max(0.0, f) for f in factors]
    total = float(sum(raw))
    if total > 0:
        weights = [r / total for r in raw]
    else:
        weights = [1.0 / len(updates)] * len(updates)
    first = next(iter(updates)).tensors
    out: Tensors = {}
    for name, ref in first.items():
        acc = np.zeros(ref.shape, dtype=np.float32)
        scratch = np.empty(ref.shape, dtype=np.float32)
        for u, w in zip(updates, weights):
            if w == 0.0:
                continue
            np.multiply(u.tensors[name], np.float32(w), out=scratch, dtype=np.float32)
            acc += scratch
        out[name] = acc
    return out


#: How a round's updates are merged.
COMBINE_NAMES = ("mean",) + ROBUST_NAMES


class FedAvgAggregator(Aggregator):
    """Deadline-bounded synchronous rounds; ``online_devices`` is the registry's view of who is
    online (a set-like view, asked at round start and per update)."""

    name = "fedavg"
    normalizes_weights = True
    runs_rounds = True

    def __init__(self, deadline_s: float = 30.0, min_updates: int = 1,
                 online_devices: Callable[[], Collection[str]] = lambda: (),
                 clients_per_round: Optional[int] = None, combine: str = "mean",
                 trim_ratio: float = 0.1):
        super().__init__()
        if combine not in COMBINE_NAMES:
            raise ValueError("fedavg combine must be one of %s, got %r" % (", ".join(COMBINE_NAMES), combine))
        self.combine = combine
        self.trim_ratio = float(trim_ratio)
        if deadline_s <= 0:
            raise ValueError("fedavg deadline_s must be > 0, got %r" % deadline_s)
        if min_updates < 1:
            raise ValueError("fedavg min_updates must be >= 1, got %r" % min_updates)
        self.deadline_s = float(deadline_s)
        self.min_updates = int(min_updates)
        self.online_devices = online_devices
        self.rounds = 0
        self.deadline_restarts = 0
        self.round_start_s: Optional[float] = None
        self.round_version: Optional[int] = None
        self.expected: Set[str] = set()
        self.pending: Dict[str, Update] = {}
        #: The methods' weight factor of each pending update (robust combines ignore it).
        self._factors: Dict[str, float] = {}
        #: Devices a round waits for (None: every device online at round start).
        self.clients_per_round: Optional[int] = clients_per_round
        #: The devices rounds wait for, as a scheduler chose them (None: every online device).
        self._chosen: Optional[Set[str]] = None

    def set_round_size(self, clients: Optional[int]) -> None:
        """Rounds wait for ``clients`` devices from now on (None: every online device)."""
        self.clients_per_round = clients

    def expect(self, devices: Optional[Collection[str]]) -> None:
        """Make rounds wait for ``devices`` (those online) instead of every online device, from the
        round open now or the next one; None goes back to every online device."""
        self._chosen = None if devices is None else set(devices)
        if self.round_start_s is not None:
            self.expected = self._waited_for()

    def _waited_for(self) -> Set[str]:
        online = set(self.online_devices())
        return online if self._chosen is None else online & self._chosen

    def _ensure_round(self, version: int, now: float) -> None:
        if self.round_start_s is None or self.round_version != version:
            self.round_start_s = now
            self.round_version = version
            self.expected = self._waited_for()
            self.pending = {}
            self._factors = {}

    def _complete(self) -> bool:
        if not self.expected:  # opened before any device was online: wait for who is online now
            self.expected = self._waited_for()
        if len(self.pending) < self.min_updates:
            return False
        if self.clients_per_round is not None and len(self.pending) >= self.clients_per_round:
            return True
        # Complete when no device it waits for is both missing and online. Checked per update, so
        # it stops at the first such device instead of building the online set: with n devices a
        # round cost O(n^2), which at thousands of boards is seconds of the coordinator's time.
        online = self.online_devices()
        return bool(self.expected) and not any(
            d in online for d in self.expected if d not in self.pending)

    def _aggregate(self, version: int) -> Outcome:
        updates = tuple(self.pending.values())
        log.info("fedavg round from version %d: averaging %d updates (%d expected)", version,
                 len(updates), len(self.expected))
        self.rounds += 1
        self.round_start_s = None
        self.round_version = None
        factors = [self._factors.get(u.device_id, 1.0) for u in updates]
        self.pending = {}
        self._factors = {}
        if self.combine == "median":
            model = coordinate_median(updates)
        elif self.combine == "trimmed_mean":
            model = trimmed_mean(updates, self.trim_ratio)
        else:
            model = weighted_average(updates, factors)
        # A round shares its weight out among its updates: no single update's mixing weight.
        return Outcome(AGGREGATED, model, updates)

    def on_update(self, model: Tensors, version: int, update: Update, now: float,
                  weight: float = 1.0) -> Outcome:
        self._ensure_round(version, now)
        if update.base_version < version:
            self.stale_dropped += 1
            log.debug("fedavg: dropping update of %s from version %d (round is %d)",
                      update.device_id, update.base_version, version)
            return Outcome(STALE)
        self.pending[update.device_id] = update
        self._factors[update.device_id] = float(weight)
        if self._complete():
            return self._aggregate(version)
        return Outcome(BUFFERED)

    def on_tick(self, model: Tensors, version: int, now: float) -> Optional[Outcome]:
        self._ensure_round(version, now)
        if self.pending and self._complete():
            return self._aggregate(version)
        if now - self.round_start_s < self.deadline_s:
            return None
        if len(self.pending) >= self.min_updates:
            return self._aggregate(version)
        # Deadline passed without enough updates: restart it, waiting for whoever is online now.
        self.deadline_restarts += 1
        self.round_start_s = now
        self.expected = self._waited_for()
        return None

    def state(self) -> Dict[str, Any]:
        state = super().state()
        state.update(rounds=self.rounds, deadline_restarts=self.deadline_restarts)
        return state

    def load_state(self, state: Dict[str, Any]) -> None:
        # Buffered updates are not persisted: after a restart the round starts over.
        super().load_state(state)
        self.rounds = int(state.get("rounds", 0))
        self.deadline_restarts = int(state.get("deadline_restarts", 0))
