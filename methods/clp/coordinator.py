"""AdaCLP on the coordinator: the federated CLP probe fed by the devices' Fisher traces (eq. 2-3).

After every aggregation the probe takes the sample-weighted mean Fisher trace of what was merged
(one update under FedAsync, a round under FedAvg) and the oldest base version among them; every
global model then carries the probe's ``ClpState``. Devices that see it compute a Fisher trace per
round, refine their hyper-parameters (eq. 4-6, unless ``refine_hparams`` is off) and follow the
CLP flag with their clocks (the ``clp`` agent plug-in and the ``clp-aware`` DVFS policy).

The flag's changes are logged through ``FlagChangeLog`` (the first at INFO, then a summary at most
every ``flag_log_interval_s``); ``describe`` shows the operator the flag, since when and how often
it changed, F_G and its growth, the segment and whether devices refine their hparams, and each
device's latest Fisher trace as it counted.
"""
import dataclasses
import logging
import math
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from streamfl.methods.clp.flag_log import FLAG_NAMES, FlagChangeLog
from streamfl.methods.clp.probe import ClpProbeConfig, ClpProbe
from streamfl.coordinator.plugins.base import Aggregation, CoordinatorPlugin, Effects, FleetView, MethodState, \
    NOTHING, Verdict
from streamfl.protocol.extras import Extra
from streamfl.protocol.messages import Update
from streamfl.methods.clp.payloads import ClpState, FisherTrace

log = logging.getLogger(__name__)


def fisher_trace_of(update: Update) -> Optional[float]:
    """The update's Fisher trace (AdaCLP eq. 1), None if it carries none."""
    trace = update.extras.get(FisherTrace.KIND)
    return trace.value if isinstance(trace, FisherTrace) else None


class ClpProbePlugin(CoordinatorPlugin):
    """Feeds ``ClpProbe`` and broadcasts its state; ``in_clp`` is what other plug-ins follow."""

    name = "clp"
    Config = ClpProbeConfig

    def __init__(self, config: ClpProbeConfig, fleet: FleetView, peers: Mapping[str, CoordinatorPlugin]):
        super().__init__(config, fleet, peers)
        self.probe = ClpProbe(config)
        #: Each device's latest trace as it counted (clipped against its peers).
        self._latest: Dict[str, float] = {}
        self.clipped_traces = 0
        self.flag_log = FlagChangeLog(log, config.flag_log_interval_s)

    def on_model_made(self, aggregation: Aggregation) -> Effects:
        traced = [(u, self._bounded(u)) for u in aggregation.merged]
        traced = [(u, f) for u, f in traced if f is not None]
        trace = None
        if traced:
            weights = [max(1, u.num_samples) for u, _ in traced]
            trace = sum(w * float(f) for w, (_, f) in zip(weights, traced)) / sum(weights)
        changes = self.probe.flag_changes
        self.probe.on_aggregation(aggregation.version, aggregation.base_version, trace,
                                  aggregation.time_s)
        state = self.clp_state()
        if self.probe.flag_changes != changes:
            self.flag_log.changed(state.in_clp, state.version, aggregation.time_s, "v%d: %s the CLP "
                                  "(F_G %.4g -> %.4g)" % (state.version, "entered" if state.in_clp
                                                          else "left", state.fisher_global_prev or 0.0,
                                                          state.fisher_global or 0.0))
        return Effects(events=({"event": "clp", "version": aggregation.version,
                                "fisher_global": state.fisher_global, "in_clp": state.in_clp,
                                "segment": state.segment},))

    def _bounded(self, update: Update) -> Optional[float]:
        """The update's trace capped at ``m * median`` of the other devices' latest (capped)
        traces, m = ``max_peer_multiple``: one device can raise F_G, and so flip the CLP flag, by
        a bounded factor only, however it forges its traces. (No floor: honest traces of one
        fleet run 5x below their peers' median, and a low trace can only pull F_G down by the
        device's share of the window.)"""
        trace = fisher_trace_of(update)
        if trace is None:
            return None
        others = [f for d, f in self._latest.items() if d != update.device_id]
        if others:
            m = self.config.max_peer_multiple
            ref = float(np.median(others))
            clipped = min(trace, m * ref)
            if clipped != trace:
                self.clipped_traces += 1
                log.log(logging.WARNING if self.clipped_traces == 1 or self.clipped_traces % 100 == 0
                        else logging.DEBUG, "clp: %s's Fisher trace %.4g clipped to %.4g (%g x the "
                        "other devices' median; %d clipped so far)", update.device_id, trace,
                        clipped, m, self.clipped_traces)
                trace = clipped
        self._latest[update.device_id] = trace
        return trace

    @property
    def in_clp(self) -> bool:
        """The CLP flag after the newest aggregation."""
        return bool(self.probe.current().in_clp)

    def clp_state(self) -> ClpState:
        """What every global model carries; ``regulating`` off when devices keep the hparams."""
        state = self.probe.current()
        if not self.config.refine_hparams:
            state = dataclasses.replace(state, regulating=False)
        return state

    def on_update_admitted(self, update: Update, now: float) -> Verdict:
        """Describes the update for its metrics record: its trace and the CLP state it met."""
        return Verdict(fields={"fisher_trace": fisher_trace_of(update), "clp": self.clp_state().as_dict()})

    def on_tick(self, now: float) -> Effects:
        """Sums up the flag changes the log held back, once ``flag_log_interval_s`` has passed."""
        self.flag_log.flush(now)
        return NOTHING

    def before_publish(self) -> List[Extra]:
        return [self.clp_state()]

    def describe(self, now: float) -> MethodState:
        """The CLP flag (``ended`` after R_end), the version it changed at and its age in seconds
        (None where unknown: no change since the coordinator started), the changes counted, F_G,
        eq. 3's relative growth, the segment, whether devices refine their hparams by eq. 4-6; per
        device its latest Fisher trace as it counted (capped against its peers)."""
        state = self.clp_state()
        probe = self.probe
        since_s = probe.flag_since_s
        growth = probe.growth
        return MethodState(
            fleet={"flag": FLAG_NAMES[state.in_clp] if probe.current().regulating else "ended",
                   "flag_since_version": probe.flag_since_version,
                   "flag_age_s": None if since_s is None else round(max(0.0, now - since_s), 1),
                   "flag_changes": probe.flag_changes,
                   "fisher_global": state.fisher_global,
                   "growth": None if growth is None else round(growth, 6),
                   "segment": state.segment,
                   "refining_hparams": state.regulating},
            devices={d: {"fisher_trace": f} for d, f in self._latest.items()})

    def state(self) -> Dict[str, Any]:
        return dict(self.probe.state(), latest_traces=dict(self._latest))

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.probe.load_state(state)
        latest = state.get("latest_traces") or {}
        self._latest = {str(d): float(f) for d, f in dict(latest).items()
                        if isinstance(f, (int, float)) and not isinstance(f, bool) and math.isfinite(f) and f >= 0}
