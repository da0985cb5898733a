"""SFedPO on the coordinator (SFedPO paper, sec. 5): the fleet's state weights w_m, and SAW.

Every global model carries ``SfedpoTerms`` (DDS on or off, the budget alpha_n, eq. 10's a1 and b1,
eq. 12's constants, and w_m), which wakes the devices' ``sfedpo`` plug-ins. Devices send s_n and
q_n with each update (``SfedpoReport``); with ``saw`` on, update n counts by eq. 14:

    p_n  proportional to  ReLU(1/q_n - a2 s_n + b2)

The core multiplies the strategy's weight by the plug-in's factor. FedAvg normalizes the round's
factors itself, so there the factor is eq. 14's numerator as it is (with equal sample counts,
eq. 14 over the round's devices: Algorithm 1 line 14). FedAsync multiplies its mixing weight by it
(capped at 1), so there the factor is the numerator over its median across the devices' latest
reports: about 1 for a typical device, and FedAsync's alpha keeps its meaning. The core caps the
product of the methods' factors at 1 under FedAsync (a factor above 1 would let one update
replace the model at alpha 0.6), so there SAW lowers the weight of the devices below the median
and leaves the others at FedAsync's own.

w_m, the population frequency of state m (eq. 3), is the mean over devices of each device's share
of windows in state m: one device, one vote, so a device that claims a billion windows cannot
move w more than an honest one. Only devices whose state ids are shared (given by their sources)
count.

Guards (a report is a claim): q_n is clamped to [``min_availability``, 1] (0.01, the paper's
clip), s_n to [0, ``max_score``], and a device's eq. 14 value to ``max_factor`` (4) times the
median of the OTHER devices' values (``streamfl.coordinator.shares``); under FedAsync the factor
is that value over the median of the devices' capped values. So a device cannot buy the
aggregation by reporting q_n -> 0: it gets at most 4x an honest device's weight, and the honest
devices keep theirs (with a cap relative to the fleet's mean, one device claiming q_n = 1e-9
held a factor of 2.96 against the others' 0.02). A device without a report keeps
factor 1. Defaults a2 = 1, b2 = 0.5 (the middle of the paper's ranges a2 in [0.5, 2], b2 in
[0, 1]); a1 = 0.15, b1 = 0.25 likewise for eq. 10.
"""
import logging
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Mapping, Tuple

import numpy as np

from streamfl.config import bounded
from streamfl.coordinator.plugins.base import CoordinatorPlugin, FleetView, MethodState, Verdict
from streamfl.coordinator.shares import leave_one_out_medians
from streamfl.protocol.extras import Extra
from streamfl.protocol.messages import Update
from streamfl.methods.sfedpo.payloads import MAX_STATES, SfedpoReport, SfedpoTerms

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SfedpoConfig:
    """SFedPO's fleet settings (module docstring)."""

    #: Devices admit windows by their latent state's share (distribution-guided sampling, SFedPO eq.
    #: 10-11); false: every state at the budget.
    dds: bool = True
    #: Weigh updates by shift-aware aggregation weights (SFedPO eq. 14); false: the strategy's own
    #: weights.
    saw: bool = True
    #: alpha_n: the mean share of new windows a full buffer admits, in (0, 1).
    budget: float = bounded(0.5, 0.0, 1.0, lo_open=True, hi_open=True)
    #: Old key names (the paper's symbols) that files may still use.
    RENAMED: ClassVar[Dict[str, str]] = {
        "a1": "heterogeneity_weight", "b1": "admission_offset", "a2": "score_weight",
        "b2": "weight_offset", "g": "mismatch_scale", "l_eta_sigma2": "noise_term"}

    #: Weight of a state's class skew d_m in the buffer's admission score (SFedPO's a1, eq. 10);
    #: broadcast as ``SfedpoTerms.a1``.
    heterogeneity_weight: float = bounded(0.15, 0.0, 100.0)
    #: Offset of the admission score, either sign (SFedPO's b1, eq. 10); ``SfedpoTerms.b1``.
    admission_offset: float = bounded(0.25, -100.0, 100.0)
    #: How much a device's aggregation weight falls per unit of its heterogeneity score s_n
    #: (SFedPO's a2, eq. 14).
    score_weight: float = bounded(1.0, 0.0, 100.0)
    #: Offset of the aggregation weight (SFedPO's b2, eq. 14).
    weight_offset: float = bounded(0.5, 0.0, 100.0)
    #: Scale of s_n's sampling-mismatch terms (SFedPO's G, eq. 12); ``SfedpoTerms.g``.
    mismatch_scale: float = bounded(1.0, 0.0, 100.0)
    #: Constant gradient-noise term of s_n (SFedPO's L eta sigma^2, eq. 12);
    #: ``SfedpoTerms.l_eta_sigma2``.
    noise_term: float = bounded(0.0, 0.0, 100.0)
    #: Floor on a device's reported availability q_n (0.01, the paper's clip), so 1/q_n in eq. 14
    #: stays finite.
    min_availability: float = bounded(0.01, 0.0, 1.0, lo_open=True)
    #: Cap on a device's reported heterogeneity score s_n (a report is a claim).
    max_score: float = bounded(100.0, 0.0, 1e6, lo_open=True)
    #: Cap on a device's eq. 14 weight, as a multiple of the fleet's mean weight.
    max_factor: float = bounded(4.0, 1.0, 100.0)

    def __post_init__(self) -> None:
        if not 0.0 < self.budget < 1.0:
            raise ValueError("budget (alpha_n) must be in (0, 1), got %r" % (self.budget,))
        for key in ("heterogeneity_weight", "score_weight", "weight_offset", "mismatch_scale",
                    "noise_term"):
            if not 0.0 <= getattr(self, key) <= 100.0:
                raise ValueError("%s must be in [0, 100], got %r" % (key, getattr(self, key)))
        if not -100.0 <= self.admission_offset <= 100.0:
            raise ValueError("admission_offset must be in [-100, 100], got %r" % (self.admission_offset,))
        if not 0.0 < self.min_availability <= 1.0:
            raise ValueError("min_availability must be in (0, 1], got %r" % (self.min_availability,))
        if not 0.0 < self.max_score <= 1e6 or not self.max_factor >= 1.0:
            raise ValueError("max_score must be in (0, 1e6] and max_factor >= 1")


class SfedpoPlugin(CoordinatorPlugin):
    """Broadcasts SFedPO's terms, keeps the devices' reports, weighs updates by SAW (eq. 14)."""

    name = "sfedpo"
    Config = SfedpoConfig

    def __init__(self, config: SfedpoConfig, fleet: FleetView, peers: Mapping[str, CoordinatorPlugin]):
        super().__init__(config, fleet, peers)
        #: Each device's latest (s_n, q_n), clamped.
        self.reports: Dict[str, Tuple[float, float]] = {}
        #: Each device's latest state shares (devices with shared state ids only).
        self.shares: Dict[str, Dict[int, float]] = {}

    def on_update_admitted(self, update: Update, now: float) -> Verdict:
        """Keeps the update's report (s_n, q_n, state shares), then weighs it by SAW (eq. 14)."""
        report = update.extras.get(SfedpoReport.KIND)
        if not isinstance(report, SfedpoReport):
            return Verdict(weight=self._saw_factor(update))
        c = self.config
        q = min(1.0, max(c.min_availability, report.availability))
        s = min(c.max_score, max(0.0, report.score))
        self.reports[update.device_id] = (s, q)
        total = float(sum(report.counts))
        if report.shared_ids and total > 0:
            self.shares[update.device_id] = {st: n / total for st, n in zip(report.states, report.counts) if n}
        fields = {"sfedpo_score": round(s, 4), "availability": round(q, 4)}
        factor = self._saw_factor(update)
        if c.saw:
            fields["saw_factor"] = round(factor, 4)
        if report.admission_rate is not None:
            fields["admission_rate"] = round(report.admission_rate, 4)
        return Verdict(weight=factor, fields=fields)

    def raw(self, score: float, availability: float) -> float:
        """Eq. 14's numerator, ReLU(1/q - a2 s + b2)."""
        return max(0.0, 1.0 / availability - self.config.score_weight * score + self.config.weight_offset)

    def _saw_factor(self, update: Update) -> float:
        """Eq. 14's factor for ``update``'s device, capped against its peers (1.0 with SAW off or
        before the device reported)."""
        if not self.config.saw or update.device_id not in self.reports:
            return 1.0
        values = self._capped_values()
        return self._factor(values[update.device_id], values)

    def _capped_values(self) -> Dict[str, float]:
        """Each reporting device's eq. 14 value, capped at ``max_factor`` x its peers' median."""
        raws = {d: self.raw(s, q) for d, (s, q) in self.reports.items()}
        refs = leave_one_out_medians(raws)
        m = self.config.max_factor
        return {d: v if refs[d] is None else min(v, m * refs[d]) for d, v in raws.items()}

    def _factor(self, raw: float, values: Mapping[str, float]) -> float:
        """The factor of a device whose capped value is ``raw`` among ``values``."""
        if self.fleet.normalizes_weights:
            factor = raw
        else:
            # Over the median of the devices' capped values: a device that inflates its own
            # value moves neither its peers' factors nor its own cap.
            median = float(np.median(list(values.values())))
            if median <= 0:
                return 1.0
            factor = raw / median
        return factor

    def describe(self, now: float) -> MethodState:
        """Whether DDS and SAW run, the latent states in w_m and the most frequent one with its
        weight; per reporting device its SAW weight (the factor its next update gets, eq. 14; 1.0
        with SAW off; under FedAvg the round normalizes it), its heterogeneity score s_n, its
        availability q_n and its most frequent latent state (None where its ids are not shared)."""
        w = self.state_weights()
        values = self._capped_values() if self.config.saw else {}
        devices: Dict[str, Dict[str, Any]] = {}
        for d, (s, q) in self.reports.items():
            shares = self.shares.get(d)
            top = max(shares.items(), key=lambda kv: (kv[1], -kv[0]))[0] if shares else None
            weight = self._factor(values[d], values) if self.config.saw else 1.0
            devices[d] = {"saw_weight": round(float(weight), 4), "score": round(float(s), 4),
                          "availability": round(float(q), 4), "state": top}
        return MethodState(
            fleet={"dds": bool(self.config.dds), "saw": bool(self.config.saw), "states": len(w),
                   "top_state": w[0][0] if w else None,
                   "top_state_weight": round(float(w[0][1]), 4) if w else None},
            devices=devices)

    def state_weights(self) -> List[Tuple[int, float]]:
        """w_m: the mean over reporting devices of their state shares, the most frequent first."""
        if not self.shares:
            return []
        w: Dict[int, float] = {}
        for shares in self.shares.values():
            for st, p in shares.items():
                w[st] = w.get(st, 0.0) + p / len(self.shares)
        return sorted(w.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_STATES]

    def before_publish(self) -> List[Extra]:
        c = self.config
        w = sorted(self.state_weights())
        return [SfedpoTerms(dds=c.dds, saw=c.saw, budget=c.budget,
                            a1=c.heterogeneity_weight, b1=c.admission_offset, g=c.mismatch_scale,
                            l_eta_sigma2=c.noise_term, states=tuple(s for s, _ in w),
                            weights=tuple(round(p, 6) for _, p in w))]

    def state(self) -> Dict[str, Any]:
        return {"reports": {d: [s, q] for d, (s, q) in self.reports.items()},
                "shares": {d: {str(st): p for st, p in sh.items()} for d, sh in self.shares.items()}}

    def load_state(self, state: Mapping[str, Any]) -> None:
        c = self.config
        reports, shares = {}, {}
        for device, pair in dict(state.get("reports") or {}).items():
            s, q = float(pair[0]), float(pair[1])
            reports[str(device)] = (min(c.max_score, max(0.0, s)), min(1.0, max(c.min_availability, q)))
        for device, sh in dict(state.get("shares") or {}).items():
            shares[str(device)] = {int(st): float(p) for st, p in dict(sh).items()
                                   if int(st) >= 0 and 0.0 <= float(p) <= 1.0}
        self.reports, self.shares = reports, shares
