"""ST-EWC's temporal half on the coordinator (ST-EWC paper, sec. 4): periods, P and Q.

The spatial half is FedCurv's plug-in (``fedcurv``: U and V); a fleet runs ST-EWC by listing both,
TimeEWC by listing this one alone. Each period: a boundary source (``methods/stewc/periods``) says
the period ended; the next global model announces the new period and is the old one's optimum
theta*_t; devices answer with their local T-FDM at it (eq. 8); ``TemporalSums`` folds the answers
into ``P`` and ``Q`` (eq. 9), which every later global model carries so that devices train with
``lambda1 (P theta - Q)`` added to the gradient (eq. 12). The sums and the consolidation in
progress persist across coordinator restarts (``state_tensors``).
"""
import logging
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Mapping, Optional

import numpy as np

from streamfl.methods.stewc.periods import BOUNDARIES, DriftBoundary, PeriodBoundary, ScheduleBoundary
from streamfl.config import bounded
from streamfl.coordinator.plugins.base import NOTHING, Aggregation, CoordinatorPlugin, Effects, FleetView, \
    MethodState, Verdict
from streamfl.methods.stewc.temporal import TemporalSums
from streamfl.protocol.extras import Extra
from streamfl.protocol.messages import Update
from streamfl.methods.stewc.payloads import DriftSignal, PeriodFisher, PeriodTerms

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StEwcConfig:
    """ST-EWC's temporal term and how periods are found.

    temporal_strength: the temporal pull's strength (ST-EWC's lambda1, eq. 5). The paper gives no
      value (Fig. 6 only says small ones balance best). 10 is from a sweep on the digits data
      (neither of the datasets the results report; 2 seeds of the shipped scenario,
      docs/results.md "ST-EWC"): at 1 period 1 was still half forgotten, at 30 and more the later
      periods were learned worse (eq. 15's average fell below 10's), at 1000 the model barely moved past period 1. P sums over
      periods, so the pull stiffens as they pass; lower it for runs of many periods.
    fisher_samples: windows a device's T-FDM is estimated on (one backward each, once a period).
    boundary: "schedule" (every ``period_s`` seconds: the paper's given periods, a scenario's, an
      operator's calendar) or "drift" (a quorum of the devices report input drift).
    period_s: the schedule's period length (required for "schedule").
    drift_quorum, drift_window_s, min_period_s: "drift" needs this share of the reporting online
      devices to have drifted within the last drift_window_s, and the period to be this old
      (``methods/stewc/periods/drift.py``).
    fisher_quorum, fisher_wait_s: a period's T-FDM is folded once this share of the devices online
      at the boundary answered (the paper waits for all K), or this many seconds after the boundary
      with at least one answer.
    max_fisher, max_samples: each device's T-FDM element and sample count are clipped to these
      (a forged report can stiffen the pull at most this much; it can never move its target).
    max_peer_multiple: at the fold, a device's sample count, and its sample count times its
      T-FDM's total, count for at most this many times the median of the other answers' (4): a
      device that claimed 10^9 samples held 99% of P under the clips alone; capped, it holds at
      most 4 / (4 + n - 1) of it among n similar answers. Honest answers stayed within 4.7x of
      their peers' median on the adaclp-extreme scenario (capped in 1 of 20 folds; 1.1x on smoke).
    """

    #: Old key names (the paper's symbols) that files may still use.
    RENAMED: ClassVar[Dict[str, str]] = {"lambda1": "temporal_strength"}

    #: Weight of the temporal penalty (ST-EWC's lambda1, eq. 5); broadcast as
    #: ``PeriodTerms.lambda1``.
    temporal_strength: float = bounded(10.0, 0.0, 1e6)
    fisher_samples: int = bounded(100, 1, 65536)
    boundary: str = "drift"
    period_s: Optional[float] = bounded(None, 0.0, 1e8, lo_open=True)
    drift_quorum: float = bounded(0.5, 0.0, 1.0, lo_open=True)
    min_period_s: float = bounded(60.0, 0.0, 1e8)
    drift_window_s: float = bounded(30.0, 0.0, 1e8, lo_open=True)
    fisher_quorum: float = bounded(1.0, 0.0, 1.0, lo_open=True)
    fisher_wait_s: float = bounded(30.0, 0.0, 86400.0)
    max_fisher: float = bounded(1.0e4, 0.0, 1e8, lo_open=True)
    max_samples: int = bounded(100000, 1, 10 ** 9)
    max_peer_multiple: float = bounded(4.0, 1.0, 1e6)

    def __post_init__(self) -> None:
        if not self.temporal_strength >= 0:
            raise ValueError("temporal_strength must be >= 0, got %r" % (self.temporal_strength,))
        if self.fisher_samples < 1 or self.max_samples < 1:
            raise ValueError("fisher_samples and max_samples must be >= 1")
        if self.boundary not in BOUNDARIES:
            raise ValueError("boundary must be one of %s, got %r" % (", ".join(BOUNDARIES), self.boundary))
        if self.period_s is not None and not self.period_s > 0:
            raise ValueError("period_s must be > 0, got %r" % (self.period_s,))
        if self.boundary == "schedule" and self.period_s is None:
            raise ValueError("boundary: schedule needs period_s")
        if not 0 < self.drift_quorum <= 1 or not self.min_period_s >= 0 or not self.drift_window_s > 0:
            raise ValueError("drift_quorum must be in (0, 1], min_period_s >= 0, drift_window_s > 0")
        if not 0 < self.fisher_quorum <= 1 or not self.fisher_wait_s >= 0 or not self.max_fisher > 0:
            raise ValueError("fisher_quorum must be in (0, 1], fisher_wait_s >= 0, max_fisher > 0")

    def make_boundary(self) -> PeriodBoundary:
        if self.boundary == "schedule":
            return ScheduleBoundary(float(self.period_s))
        return DriftBoundary(self.drift_quorum, self.min_period_s, self.drift_window_s)


class StEwcPlugin(CoordinatorPlugin):
    """Cuts periods, collects each period's T-FDM and broadcasts ``lambda1``, P and Q."""

    name = "stewc"
    Config = StEwcConfig

    def __init__(self, config: StEwcConfig, fleet: FleetView, peers: Mapping[str, CoordinatorPlugin]):
        super().__init__(config, fleet, peers)
        if fleet.model is None:
            raise ValueError("stewc needs the fleet's model (FleetView.model)")
        self.boundary = config.make_boundary()
        self.sums = TemporalSums(config.max_fisher, config.max_samples, config.max_peer_multiple)
        #: The current period (0 first).
        self.period = 0
        #: A boundary fired; the next aggregation announces the period and anchors theta*.
        self._announce = False
        self._saved_meta: Dict[str, Any] = {}
        #: The latest period each device's T-FDM counted for (not saved: shown to the operator).
        self.answered: Dict[str, int] = {}

    # ---- inputs -------------------------------------------------------------------------------
    def on_update_admitted(self, update: Update, now: float) -> Verdict:
        fisher = update.extras.get(PeriodFisher.KIND)
        if isinstance(fisher, PeriodFisher) and self.sums.add(update.device_id, fisher):
            log.debug("stewc: T-FDM of period %d from %s", fisher.period, update.device_id)
            self.answered[update.device_id] = int(fisher.period)
        self._signal(update.device_id, update.extras, now)
        return Verdict(fields={"period": self.period})

    def on_device_report(self, device_id: str, extras: Mapping[str, Extra], now: float) -> Effects:
        self._signal(device_id, extras, now)
        return NOTHING

    def _signal(self, device_id: str, extras: Mapping[str, Extra], now: float) -> None:
        signal = extras.get(DriftSignal.KIND)
        if isinstance(signal, DriftSignal):
            self.boundary.on_signal(device_id, signal, now)

    def on_tick(self, now: float) -> Effects:
        online = list(self.fleet.online())
        events = []
        if self.sums.ready(now, online, self.config.fisher_quorum, self.config.fisher_wait_s):
            events += self._fold(now)
        if not self._announce and self.boundary.due(now, online):
            self.boundary.started(now)
            if self.sums.pending is not None:  # the last period's answers are all it gets
                events += self._fold(now)
            self.period += 1
            self._announce = True
            log.info("stewc: period %d ends at %.1f s (%s)", self.period - 1, now, self.boundary.name)
        return Effects(events=tuple(events)) if events else NOTHING

    def on_model_made(self, aggregation: Aggregation) -> Effects:
        if not self._announce:
            return NOTHING
        self._announce = False
        self.sums.begin(self.period - 1, self.fleet.model(), aggregation.version, aggregation.time_s,
                        self.fleet.online())
        return Effects(events=({"event": "period", "period": self.period, "version": aggregation.version,
                                "time_s": aggregation.time_s, "boundary": self.boundary.name},))

    def _fold(self, now: float) -> List[Dict[str, Any]]:
        """Consolidate the pending period; its metrics event (none if no device answered)."""
        done = self.sums.fold()
        if done is None:
            log.warning("stewc: no device sent its T-FDM; that period is not consolidated")
            return []
        log.info("stewc: period %d consolidated from %d devices", done["period"], done["devices"])
        return [dict(done, event="consolidated", time_s=now)]

    # ---- outputs ------------------------------------------------------------------------------
    def describe(self, now: float) -> MethodState:
        """The period index, the period whose T-FDM is being collected (None: none) with the
        answers so far, the periods consolidated into P and Q and the boundary source; per device
        the latest period its T-FDM counted for, and whether the open consolidation still waits
        for it (devices online at the boundary that have not answered)."""
        pending = self.sums.pending
        waiting = set() if pending is None else pending.expected - pending.devices
        devices: Dict[str, Dict[str, Any]] = {d: {"fisher_period": p, "awaited": d in waiting}
                                              for d, p in self.answered.items()}
        for d in waiting:
            devices.setdefault(d, {"fisher_period": None, "awaited": True})
        return MethodState(
            fleet={"period": self.period, "consolidating": None if pending is None else pending.period,
                   "answers": 0 if pending is None else len(pending.answers),
                   "periods_consolidated": self.sums.folded, "boundary": self.boundary.name},
            devices=devices)

    def before_publish(self) -> List[Extra]:
        pending = self.sums.pending
        return [PeriodTerms(period=self.period, lambda1=float(self.config.temporal_strength),
                            fisher_samples=int(self.config.fisher_samples),
                            consolidating=None if pending is None else pending.period,
                            P=self.sums.P, Q=self.sums.Q if self.sums.P is not None else None)]

    # ---- persistence --------------------------------------------------------------------------
    def state(self) -> Optional[Dict[str, Any]]:
        return {"period": self.period, "announce": self._announce, "boundary": self.boundary.state(),
                "sums": self.sums.meta()}

    def load_state(self, state: Mapping[str, Any]) -> None:
        period = state.get("period", 0)
        if type(period) is not int or period < 0 or not isinstance(state.get("sums", {}), dict):
            raise ValueError("stewc: bad saved state")
        self.boundary.load_state(dict(state.get("boundary") or {}))
        self.period, self._announce = period, bool(state.get("announce", False))
        self._saved_meta = dict(state.get("sums") or {})
        self.sums.folded = int(self._saved_meta.get("folded", 0))

    def state_tensors(self) -> Optional[Dict[str, np.ndarray]]:
        return self.sums.arrays() or None

    def load_state_tensors(self, tensors: Mapping[str, np.ndarray]) -> None:
        self.sums.load(self._saved_meta, tensors)
        log.info("stewc: %d consolidated periods restored%s", self.sums.folded,
                 "" if self.sums.pending is None else ", period %d's T-FDM still open" % self.sums.pending.period)
