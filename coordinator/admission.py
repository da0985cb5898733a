"""What an update must pass before it is mixed: a known sender, its fair rate, sane values, a delta norm the fleet vouches for.

A frame that parses can still be hostile: one update whose weights are all 1e30 (finite, so the
decoder accepts it), an honest model scaled by 1000, or a flood of bounded updates from one
registered device ruins a FedAsync model. So ``UpdateAdmission.check`` looks at every update
after decoding and before any plug-in or strategy sees it:

1. **Sender.** The device must be known: enrolled (``enrollment_file``) or, without enrollment, a
   device that said Hello to this state folder. (The runtime already dropped messages whose
   ``device_id`` differs from their topic.)
2. **Rate.** A device's updates count at most as fast as its own rounds could make them
   (``coordinator/rate_limit.py``); the excess is dropped (``rejected_rate``).
3. **Magnitude.** Every value of the update must be finite and satisfy ``|w| <= max_abs_value``.
   (The decoder rejects NaN and Inf, or, for the coordinator's updates, leaves that to this step,
   whose pass over the update sums its squares beside the delta's: ``receiver_checks_finite``.)
4. **Norm.** ``d = ||update - base||_2``, with ``base`` the global model of the update's base
   version (the current one if the history no longer holds it). The bound adapts to the fleet,
   one device one vote: each device's vote is the median of its own last ``device_norms`` delta
   norms (every norm it sent, accepted, clipped or rejected), and the fleet's reference is the
   median of the votes of the devices heard within the last ``vote_ttl_s``; the bound is
   ``norm_multiplier`` times that. Until ``warmup_updates`` norms are known it is
   ``initial_norm_ratio * ||base||`` (a first round may change the model a lot, but not by more
   than the model itself). Honest deltas are heavy-tailed (a class shift, a stale base), so a
   device whose own vote is within the fleet's bound (its outliers are occasional) may use a floor
   of ``min_norm_ratio * ||base||`` instead; one whose deltas are big all the time may not. ``d`` above ``reject_multiplier x bound`` is rejected;
   above the bound it is clipped (``base + (update - base) * bound / d``), so an honest outlier
   still counts, with bounded weight.

Why votes and not a window of updates: a flood of one device's tiny deltas filled the window,
dragged the bound down to 1e-4 of the honest deltas and, since rejected updates never entered it,
locked the honest devices out for good, across restarts. A device's many updates are one vote
here, and rejected norms vote too, so once the flood stops (its vote ages out) or while the honest
devices are a majority, the bound is theirs again: no sequence of one device's messages leaves it
locked. Rejections and clips are counted by reason (``counters``), go to ``metrics.jsonl`` with
the update's record, and are logged: a WARNING per reason at most every ``WARN_INTERVAL_S`` with
the count since, for as long as they go on.
"""
import logging
import math
import statistics
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Deque, Dict, FrozenSet, Mapping, Optional

import numpy as np

from streamfl.config import bounded
from streamfl.coordinator.delta_norm import DeltaNorm, delta_of, norm_of, peak_unless_within
from streamfl.coordinator.kernels import Kernels
from streamfl.coordinator.rate_limit import DeviceRateLimit
from streamfl.coordinator.sorted_votes import SortedVotes
from streamfl.logs import RateLimitedLog
from streamfl.protocol.codec import DecodedTensors
from streamfl.protocol.messages import Tensors, Update
from streamfl.protocol.topics import NAME_RE

log = logging.getLogger(__name__)

#: Rejection reasons, the ``reason`` of an update's record.
UNKNOWN_DEVICE = "unknown_device"
MAGNITUDE = "magnitude"
NORM = "norm"
RATE = "rate"
REASONS = (UNKNOWN_DEVICE, RATE, MAGNITUDE, NORM)

#: At most one WARNING per rejection reason this often (with the count since): for as long as
#: rejections go on, the log says so, without a line per update.
WARN_INTERVAL_S = 10.0
#: Devices whose norms are kept (least recently heard first out): bounded whatever the senders.
MAX_VOTERS = 100000


@dataclass(frozen=True)
class AdmissionConfig:
    """How updates are bounded before mixing (the ``admission:`` section of the coordinator YAML).

    enrollment_file: text file of device ids, one per line (``#`` comments); set, only these
      devices' updates are accepted; null = any device that said Hello.
    max_abs_value: largest ``|w|`` accepted (1e4: trained weights of the models here stay below
      ~10; 1e4 leaves three orders of headroom and still stops 1e30-style poison).
    norm_multiplier: the bound is this many times the fleet's reference delta norm (3: honest
      deltas of one fleet vary ~2x with staleness and data; more would admit a scaled one).
    vote_ttl_s: a device's vote counts while it sent a norm within this many seconds (600: a
      board that stopped for ten minutes is not the fleet any more; time, not a count of norms,
      so that one device's flood cannot age the others' votes out).
    device_norms: a device's vote is the median of its own last this many delta norms (8: a few
      rounds, so one odd round does not move it).
    warmup_updates, warmup_devices: until this many norms are known, from at least this many
      devices (or every online device, in a smaller fleet), the bound is ``initial_norm_ratio``
      times the norm of the base model (1.0: no honest round moves the model by more than its own
      size). 3 and 3: a count of norms alone ended the warm-up on one device's flood, whose
      updates were then the reference; three devices' first rounds end it.
    reject_multiplier: a delta beyond this many bounds is rejected rather than clipped (10).
    min_norm_ratio: a device's bound may be this times the base model's norm (0.25) while its
      own vote (the median of its recent norms) is within the fleet's bound. Honest deltas are
      heavy-tailed: on the smartwatch and synthetic scenarios they reach 300x the running median
      at class shifts and staleness 16, yet stay below 0.15 of the model's norm; the floor keeps
      such an outlier whole, while a device that sends floor-sized deltas all the time makes its
      own median big within a few updates and is then held to the fleet's bound. (A budget of
      one floor per 10 updates cost FedAvg 0.8 and the balanced FedAsync 2 points of mean
      accuracy on the adaclp-extreme scenario, where honest devices switch class often.)
    max_updates_per_s: a device's updates count at most this often (2/s; null: only its claimed
      round times limit it). Boards here train a round in 0.2 s to minutes and the agents' round
      interval defaults to 5 s; 2/s leaves a fast board whole and holds a flood to it.
    rate_burst: updates a device may send ahead of what its rounds could have made (4: timing
      jitter, a few in flight; a board's backlog after an outage trained from an old model is paid
      for by the time since that model, ``coordinator/rate_limit.py``).
    round_time_fraction: a device's next update counts no sooner than this share of the round
      time its update claims (0.5: timing jitter; a board cannot finish rounds faster than it
      trains them).
    samples_peer_multiple: an update's claimed ``num_samples`` (FedAvg's weight, the CLP trace's
      weight) counts as at most this many times the median of the other devices' latest (4:
      devices of one fleet train the same steps and batches, and honest counts stayed within
      3.6x of their peers' median on the smoke, adaclp-extreme and sfedpo-latent scenarios; a
      claim of 10^9 would own a FedAvg round).
    """

    enrollment_file: Optional[str] = None
    max_abs_value: float = bounded(1e4, 0.0, 1e30, lo_open=True)
    norm_multiplier: float = bounded(3.0, 1.0, 1e6)
    vote_ttl_s: float = bounded(600.0, 0.0, 1e9, lo_open=True)
    device_norms: int = bounded(8, 1, 10 ** 4)
    warmup_updates: int = bounded(3, 1, 10 ** 7)
    warmup_devices: int = bounded(3, 1, 10 ** 6)
    #: During the warm-up, the norm bound as a multiple of the base model's own norm (1.0: no honest
    #: round moves the model by more than its size).
    initial_norm_ratio: float = bounded(1.0, 0.0, 1e6, lo_open=True)
    reject_multiplier: float = bounded(10.0, 1.0, 1e6)
    min_norm_ratio: float = bounded(0.25, 0.0, 1e6, lo_open=True)
    max_updates_per_s: Optional[float] = bounded(2.0, 0.0, 1e6, lo_open=True)
    rate_burst: int = bounded(4, 1, 10 ** 6)
    round_time_fraction: float = bounded(0.5, 0.0, 1.0)
    samples_peer_multiple: float = bounded(4.0, 1.0, 1e6)
    #: The enrolled ids read from ``enrollment_file`` (None: no enrollment).
    enrolled: Optional[FrozenSet[str]] = field(default=None, init=False, compare=False)

    def __post_init__(self) -> None:
        if self.enrollment_file is not None:
            object.__setattr__(self, "enrolled", read_enrollment(Path(self.enrollment_file)))


def read_enrollment(path: Path) -> FrozenSet[str]:
    """The device ids listed in ``path``; ValueError naming the file and line if one is invalid."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError("admission.enrollment_file %s cannot be read: %s" % (path, exc)) from None
    ids = set()
    for number, line in enumerate(text.splitlines(), 1):
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        if not NAME_RE.match(name):
            raise ValueError("admission.enrollment_file %s line %d: %r is not a device id"
                             % (path, number, name))
        ids.add(name)
    return frozenset(ids)


@dataclass(frozen=True)
class Verdict:
    """An update's admission: ``update`` to mix (maybe clipped) or None, and why."""

    update: Optional[Update]
    reason: str = ""
    clipped: bool = False
    delta_norm: Optional[float] = None
    bound: Optional[float] = None


_norm = norm_of


class UpdateAdmission:
    """Checks each update against the sender list, its rate, the value cap and the adaptive norm bound."""

    def __init__(self, config: AdmissionConfig, kernels: Optional[Kernels] = None):
        """``kernels``: the loops that sum a delta's squares (None: ``default_kernels()``)."""
        self.config = config
        #: device -> its recent delta norms, least recently heard device first.
        self._votes: "OrderedDict[str, Deque[float]]" = OrderedDict()
        #: device -> the median of its recent norms (its vote).
        self._medians: Dict[str, float] = {}
        #: device -> its recent norms rounded as ``state()`` saves them (kept as they come: a
        #: snapshot after every update would otherwise round every device's norms again).
        self._rounded: Dict[str, Deque[float]] = {}
        #: device -> when it last voted (None: restored, counted as now at the next check).
        self._voted_at: Dict[str, Optional[float]] = {}
        #: The votes of the devices that voted within ``vote_ttl_s``, sorted: the reference is
        #: their median, read per update without sorting the fleet (coordinator/sorted_votes.py).
        self._live = SortedVotes()
        self._now = 0.0
        self._restored = False
        self._fleet_size: Optional[int] = None
        #: Norms recorded so far (the warm-up counts them).
        self._count = 0
        self._rate = DeviceRateLimit(config.max_updates_per_s, config.rate_burst,
                                     config.round_time_fraction)
        #: device -> its latest sample count as counted (sorted, least recently heard first out).
        self._samples = SortedVotes()
        self.counters: Counter = Counter()
        self._log = RateLimitedLog(log, WARN_INTERVAL_S)
        #: ``||update - base||`` in one pass where the kernels can (coordinator/delta_norm.py).
        self._delta_norm = DeltaNorm(kernels)

    def known(self, device_id: str, said_hello: bool) -> bool:
        """True if updates of ``device_id`` may count at all."""
        if self.config.enrolled is not None:
            return device_id in self.config.enrolled
        return said_hello

    def reference(self) -> Optional[float]:
        """The fleet's reference delta norm (median of the recent devices' votes), None in warm-up."""
        if self._count < self.config.warmup_updates:
            return None
        self._live.expire(self._now, self.config.vote_ttl_s)
        # Without a fleet size (a caller that does not know it), any voter ends the warm-up.
        need = 1 if self._fleet_size is None else min(self.config.warmup_devices, max(1, self._fleet_size))
        return self._live.median() if len(self._live) and len(self._live) >= need else None

    def bound(self, base: Tensors, device_id: Optional[str] = None, floor: bool = True) -> float:
        """The delta norm above which an update (of ``device_id``, trained from ``base``) is clipped;
        ``floor``: whether the device may use the model-norm floor now."""
        ref = self.reference()
        if ref is None:
            return self.config.initial_norm_ratio * _norm(base)
        fleet = self.config.norm_multiplier * ref
        return max(fleet, self.config.min_norm_ratio * _norm(base)) if floor else fleet

    def _recent(self, device_id: str) -> bool:
        at = self._voted_at.get(device_id)
        return at is None or self._now - at <= self.config.vote_ttl_s

    def _may_use_floor(self, device_id: str, ref: float) -> bool:
        """True unless the device's own vote is beyond the fleet's bound (big deltas all the time)."""
        own = self._medians.get(device_id)
        return own is None or own <= self.config.norm_multiplier * ref

    def check(self, update: Update, base: Tensors, said_hello: bool, now: float = 0.0,
              fleet_size: Optional[int] = None, base_made_s: Optional[float] = None) -> Verdict:
        """The verdict on ``update`` trained from ``base`` (made at ``base_made_s``, None: unknown),
        received at ``now`` from a fleet of ``fleet_size`` online devices (None: as many as have
        sent norms); counts it."""
        cfg = self.config
        device = update.device_id
        self._now = max(self._now, float(now))
        self._fleet_size = fleet_size
        if self._restored:  # restored votes start their time to live now
            self._voted_at = {d: self._now if at is None else at for d, at in self._voted_at.items()}
            self._restored = False
            self._live.clear()
            for d, at in self._voted_at.items():
                self._live.set(d, self._medians[d], at)
        if not self.known(device, said_hello):
            return self._reject(UNKNOWN_DEVICE, update, "device %s is %s" % (
                device, "not enrolled" if cfg.enrolled is not None else "unknown (no Hello)"))
        round_s = float(update.seconds_per_sample) * max(0, int(update.num_samples))
        if not self._rate.allow(device, round_s, now, base_made_s):
            return self._reject(RATE, update, "device %s sends faster than its rounds (%.3g s "
                                "claimed) or max_updates_per_s %s allow" % (device, round_s,
                                                                             cfg.max_updates_per_s))
        tensors = update.tensors
        measured = None  # (delta norm, sum of the update's squares) from one pass
        if isinstance(tensors, DecodedTensors) and not tensors.finite:
            # The decoder left the NaN/Inf check to this pass (receiver_checks_finite): the sums
            # are finite only if every value is; else (or a float32 sum overflowed) look at each.
            measured = self._delta_norm.norm_and_squares(tensors, base)
            if ((measured is None or not (math.isfinite(measured[0]) and math.isfinite(measured[1])))
                    and not all(np.isfinite(a).all() for a in tensors.values())):
                return self._reject(MAGNITUDE, update, "a weight is NaN or infinite")
        peak = peak_unless_within(tensors, cfg.max_abs_value,  # None: proved within
                                  measured[1] if measured is not None else None)
        if peak is not None and peak > cfg.max_abs_value:
            return self._reject(MAGNITUDE, update, "a weight of %.3g exceeds max_abs_value %.3g"
                                % (peak, cfg.max_abs_value))
        norm = measured[0] if measured is not None else self._delta_norm.norm(tensors, base)
        if norm is None:  # not float32 tensors shaped like the base's: the general path
            norm = _norm(delta_of(tensors, base))
        ref = self.reference()
        # Within the fleet's bound (the common case) the model-norm floor cannot matter: skip it.
        bound = limit = cfg.norm_multiplier * ref if ref is not None else 0.0
        floor = False
        if ref is None or norm > bound:
            # Rejection looks at the floor always; the floor clips only when the device may use it.
            limit = self.bound(base, device, True)
            floor = ref is None or self._may_use_floor(device, ref)
            bound = limit if floor else bound
        self._vote(device, norm)
        if norm > cfg.reject_multiplier * limit:
            return self._reject(NORM, update, "delta norm %.4g exceeds %g x bound %.4g"
                                % (norm, cfg.reject_multiplier, limit), norm, limit)
        clipped = norm > bound
        if clipped:
            scale = np.float32(bound / norm)
            tensors = {k: base[k] + d * scale for k, d in delta_of(update.tensors, base).items()}
            update = replace(update, tensors=tensors)
            self.counters["clipped"] += 1
            self._log.event("clipped", logging.INFO, "update %s from %s clipped: delta norm %.4g to "
                            "bound %.4g", update.update_id, device, norm, bound)
        samples = self._samples_capped(device, int(update.num_samples))
        if samples != update.num_samples:
            self.counters["samples_capped"] += 1
            self._log.event("samples_capped", logging.WARNING, "update %s from %s claims %d samples: "
                            "counted as %d (%g x the other devices' median)", update.update_id,
                            device, update.num_samples, samples, cfg.samples_peer_multiple)
            update = replace(update, num_samples=samples)
        self.counters["accepted"] += 1
        return Verdict(update, clipped=clipped, delta_norm=norm, bound=bound)

    def _samples_capped(self, device_id: str, samples: int) -> int:
        """``samples`` capped at ``samples_peer_multiple`` x the other devices' median (as counted)."""
        median = self._samples.median_without(device_id)  # as shares.capped over the others
        if median is not None:
            samples = int(min(samples, max(0.0, self.config.samples_peer_multiple * median)))
        self._samples.set(device_id, samples)
        while len(self._samples) > MAX_VOTERS:
            self._samples.discard(self._samples.oldest())
        return samples

    def _vote(self, device_id: str, norm: float) -> None:
        norms = self._votes.pop(device_id, None)
        if norms is None:
            norms = deque(maxlen=self.config.device_norms)
        norms.append(norm)
        self._votes[device_id] = norms
        rounded = self._rounded.get(device_id)
        if rounded is None:
            rounded = self._rounded[device_id] = deque(maxlen=self.config.device_norms)
        rounded.append(round(norm, 6))
        self._medians[device_id] = statistics.median(norms)
        self._count += 1
        self._voted_at[device_id] = self._now
        self._live.set(device_id, self._medians[device_id], self._now)
        while len(self._votes) > MAX_VOTERS:
            gone, _ = self._votes.popitem(last=False)
            self._medians.pop(gone, None)
            self._rounded.pop(gone, None)
            self._voted_at.pop(gone, None)
            self._live.discard(gone)

    def _reject(self, reason: str, update: Update, detail: str, norm: Optional[float] = None,
                bound: Optional[float] = None) -> Verdict:
        self.counters["rejected_" + reason] += 1
        self._log.event("rejected_" + reason, logging.WARNING, "rejected update %s from %s: %s",
                        update.update_id, update.device_id, detail)
        return Verdict(None, reason=reason, delta_norm=norm, bound=bound)

    def state(self) -> Dict[str, Any]:
        """The devices' recent norms, so a restarted coordinator keeps its bound."""
        rounded = self._rounded
        return {"votes": {d: list(rounded[d]) for d in self._votes
                          if self._recent(d)}}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore ``state()``; anything malformed is dropped (the bound then warms up again).
        The votes come back as equals (all recent): a saved state can hold no more than the
        devices' own norms, so it cannot carry a lockout past their next updates."""
        self._votes.clear()
        self._medians.clear()
        self._rounded.clear()
        self._voted_at.clear()
        self._live.clear()
        votes = state.get("votes")
        if not isinstance(votes, Mapping):
            self._count = 0
            return  # e.g. the window of norms saved before votes: the bound warms up again
        count = 0
        for device, norms in list(votes.items())[-MAX_VOTERS:]:
            if not isinstance(device, str) or not isinstance(norms, list):
                continue
            kept = deque((float(n) for n in norms[-self.config.device_norms:]
                          if isinstance(n, (int, float)) and not isinstance(n, bool)
                          and math.isfinite(n) and n >= 0), maxlen=self.config.device_norms)
            if kept:
                self._votes[device] = kept
                self._medians[device] = statistics.median(kept)
                self._rounded[device] = deque((round(n, 6) for n in kept), maxlen=self.config.device_norms)
                count += len(kept)
        self._count = count
        for device in self._votes:
            self._voted_at[device] = None
            self._live.set(device, self._medians[device])  # no time: live until the next check
        self._restored = bool(self._votes)


def admission_counters(admission: UpdateAdmission) -> Dict[str, int]:
    """Every counter with a stable key set (zeros included), for metrics and the stop summary."""
    keys = ("accepted", "clipped", "samples_capped") + tuple("rejected_" + r for r in REASONS)
    return {"admission_" + k: int(admission.counters.get(k, 0)) for k in keys}


__all__ = ["AdmissionConfig", "UpdateAdmission", "Verdict", "REASONS", "read_enrollment",
           "admission_counters"]
