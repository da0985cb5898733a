"""What an update must pass before it is mixed: a known sender, sane values, a delta norm the fleet vouches for.

A frame that parses can still be hostile: one update whose weights are all 1e30 (finite, so the
decoder accepts it) or an honest model scaled by 1000 ruins a FedAsync model at any staleness. So
``UpdateAdmission.check`` looks at every update after decoding and before any plug-in or strategy
sees it:

1. **Sender.** The device must be known: enrolled (``enrollment_file``) or, without enrollment, a
   device that said Hello to this state folder. (The runtime already dropped messages whose
   ``device_id`` differs from their topic.)
2. **Magnitude.** Every value of the update must satisfy ``|w| <= max_abs_value``.
3. **Norm.** ``d = ||update - base||_2``, with ``base`` the global model of the update's base
   version (the current one if the history no longer holds it). The bound adapts to the fleet:
   ``norm_multiplier`` times the running median of the last ``norm_window`` accepted norms, but
   never below ``min_norm_ratio * ||base||``; until ``warmup_updates`` norms are known it is
   ``initial_norm_ratio * ||base||`` (an absolute cap: a first round may change the model a lot,
   but not by more than the model itself). ``d`` above ``reject_multiplier x bound`` is rejected;
   above the bound it is clipped (``base + (update - base) * bound / d``), so an honest outlier
   still counts, with bounded weight.

Rejections and clips are counted by reason (``counters``) and go to ``metrics.jsonl`` with the
update's record. The median of *accepted* (post-clip) norms drifts by at most ``norm_multiplier``
per window even if every update were hostile, and a stream of honest ones pulls it back.
"""
import logging
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Deque, Dict, FrozenSet, Mapping, Optional

import numpy as np

from streamfl.config import bounded
from streamfl.protocol.messages import Tensors, Update
from streamfl.protocol.topics import NAME_RE

log = logging.getLogger(__name__)

#: Rejection reasons, the ``reason`` of an update's record.
UNKNOWN_DEVICE = "unknown_device"
MAGNITUDE = "magnitude"
NORM = "norm"
REASONS = (UNKNOWN_DEVICE, MAGNITUDE, NORM)


@dataclass(frozen=True)
class AdmissionConfig:
    """How updates are bounded before mixing (the ``admission:`` section of the coordinator YAML).

    enrollment_file: text file of device ids, one per line (``#`` comments); set, only these
      devices' updates are accepted; null = any device that said Hello.
    max_abs_value: largest ``|w|`` accepted (1e4: trained weights of the models here stay below
      ~10; 1e4 leaves three orders of headroom and still stops 1e30-style poison).
    norm_multiplier: the bound is this many times the running median of accepted delta norms (3:
      honest deltas of one fleet vary ~2x with staleness and data; more would admit a scaled one).
    norm_window: how many recent accepted norms the median is taken over.
    warmup_updates: until this many norms are known, the bound is ``initial_norm_ratio`` times the
      norm of the base model (1.0: no honest round moves the model by more than its own size).
    reject_multiplier: a delta beyond this many bounds is rejected rather than clipped (10).
    min_norm_ratio: the bound never falls below this times the base model's norm (0.25). Honest
      deltas are heavy-tailed: on the smartwatch and synthetic scenarios they reach 300x the
      running median at class shifts and staleness 16, yet stay below 0.15 of the model's norm;
      the floor keeps them whole, while a model scaled by 2 or more is still clipped or rejected.
    """

    enrollment_file: Optional[str] = None
    max_abs_value: float = bounded(1e4, 0.0, 1e6, lo_open=True)
    norm_multiplier: float = bounded(3.0, 1.0, 100.0)
    norm_window: int = bounded(100, 1, 100000)
    warmup_updates: int = bounded(10, 1, 100000)
    initial_norm_ratio: float = bounded(1.0, 0.0, 100.0, lo_open=True)
    reject_multiplier: float = bounded(10.0, 1.0, 1000.0)
    min_norm_ratio: float = bounded(0.25, 0.0, 10.0, lo_open=True)
    #: The enrolled ids read from ``enrollment_file`` (None: no enrollment).
    enrolled: Optional[FrozenSet[str]] = field(default=None, init=False, compare=False)

    def __post_init__(self) -> None:
        for key in ("max_abs_value", "norm_multiplier", "initial_norm_ratio", "min_norm_ratio"):
            if not getattr(self, key) > 0:
                raise ValueError("admission.%s must be > 0, got %r" % (key, getattr(self, key)))
        if not self.reject_multiplier >= 1:
            raise ValueError("admission.reject_multiplier must be >= 1, got %r" % self.reject_multiplier)
        for key in ("norm_window", "warmup_updates"):
            if getattr(self, key) < 1:
                raise ValueError("admission.%s must be >= 1, got %r" % (key, getattr(self, key)))
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


def _norm(tensors: Mapping[str, np.ndarray]) -> float:
    return float(np.sqrt(sum(float(np.dot(a.reshape(-1), a.reshape(-1))) for a in tensors.values())))


class UpdateAdmission:
    """Checks each update against the sender list, the value cap and the adaptive norm bound."""

    def __init__(self, config: AdmissionConfig):
        self.config = config
        self._norms: Deque[float] = deque(maxlen=config.norm_window)
        self.counters: Counter = Counter()

    def known(self, device_id: str, said_hello: bool) -> bool:
        """True if updates of ``device_id`` may count at all."""
        if self.config.enrolled is not None:
            return device_id in self.config.enrolled
        return said_hello

    def bound(self, base: Tensors) -> float:
        """The delta norm above which an update is clipped, for a base model ``base``."""
        base_norm = _norm(base)
        if len(self._norms) < self.config.warmup_updates:
            return self.config.initial_norm_ratio * base_norm
        return max(self._fleet_bound(), self.config.min_norm_ratio * base_norm)

    def _fleet_bound(self) -> float:
        return self.config.norm_multiplier * float(np.median(np.asarray(self._norms)))

    def check(self, update: Update, base: Tensors, said_hello: bool) -> Verdict:
        """The verdict on ``update`` trained from ``base``; counts it."""
        cfg = self.config
        if not self.known(update.device_id, said_hello):
            return self._reject(UNKNOWN_DEVICE, update, "device %s is %s" % (
                update.device_id, "not enrolled" if cfg.enrolled is not None else "unknown (no Hello)"))
        peak = max((max(float(a.max()), -float(a.min())) for a in update.tensors.values() if a.size),
                   default=0.0)
        if peak > cfg.max_abs_value:
            return self._reject(MAGNITUDE, update, "a weight of %.3g exceeds max_abs_value %.3g"
                                % (peak, cfg.max_abs_value))
        delta = {k: np.subtract(a, base[k], dtype=np.float32) for k, a in update.tensors.items()}
        norm = _norm(delta)
        warm = len(self._norms) >= cfg.warmup_updates
        # Within the fleet's bound (the common case) the model-norm floor cannot matter: skip it.
        bound = self._fleet_bound() if warm else 0.0
        if not warm or norm > bound:
            bound = self.bound(base)
        if norm > cfg.reject_multiplier * bound:
            return self._reject(NORM, update, "delta norm %.4g exceeds %g x bound %.4g"
                                % (norm, cfg.reject_multiplier, bound), norm, bound)
        clipped = norm > bound
        if clipped:
            scale = np.float32(bound / norm)
            tensors = {k: base[k] + d * scale for k, d in delta.items()}
            update = replace(update, tensors=tensors)
            self.counters["clipped"] += 1
            log.info("update %s from %s clipped: delta norm %.4g to bound %.4g", update.update_id,
                     update.device_id, norm, bound)
        self._norms.append(min(norm, bound))
        self.counters["accepted"] += 1
        return Verdict(update, clipped=clipped, delta_norm=norm, bound=bound)

    def _reject(self, reason: str, update: Update, detail: str, norm: Optional[float] = None,
                bound: Optional[float] = None) -> Verdict:
        self.counters["rejected_" + reason] += 1
        level = logging.INFO if self.counters["rejected_" + reason] > 10 else logging.WARNING
        log.log(level, "rejected update %s from %s: %s", update.update_id, update.device_id, detail)
        return Verdict(None, reason=reason, delta_norm=norm, bound=bound)

    def state(self) -> Dict[str, Any]:
        """The recent norms, so a restarted coordinator keeps its bound."""
        return {"norms": [round(n, 6) for n in self._norms]}

    def load_state(self, state: Mapping[str, Any]) -> None:
        norms = state.get("norms") or []
        self._norms.clear()
        for value in norms:
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
                self._norms.append(float(value))


def admission_counters(admission: UpdateAdmission) -> Dict[str, int]:
    """Every counter with a stable key set (zeros included), for metrics and the stop summary."""
    keys = ("accepted", "clipped") + tuple("rejected_" + r for r in REASONS)
    return {"admission_" + k: int(admission.counters.get(k, 0)) for k in keys}


__all__ = ["AdmissionConfig", "UpdateAdmission", "Verdict", "REASONS", "read_enrollment",
           "admission_counters"]
