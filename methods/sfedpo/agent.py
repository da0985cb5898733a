"""SFedPO on the device (the SFedPO paper, sec. 5 and Algorithm 1): which windows the buffer keeps, and s_n.

Dormant until a global model carries ``SfedpoTerms``. Then every window's latent state (from
``states``: the window's own, else inferred; ``streamfl.methods.sfedpo.latent``) is counted by the Dirichlet
oracle, and the buffer is lent a ``DdsPolicy`` whose per-state admission shares alpha_n,m
(``streamfl.methods.sfedpo.dds``: eq. 10, ReLU, eq. 11, Algorithm 2) are recomputed every
``refresh_windows`` windows and whenever a new state appears. With ``dds`` off in the terms (the
``saw-only`` ablation) every state is admitted at the budget: the paper's uniform sampling. After
each round the update carries ``SfedpoReport``: s_n (eq. 12, at the round's local steps), q_n and
the windows seen per state. s_n takes eq. 1's per-step replaced shares, converted from the
admission chances with the windows offered to the full buffer since the previous report
(``streamfl.methods.sfedpo.dds.replaced_per_step``).

Availability q_n is measured, not configured: rounds trained over round opportunities, an
opportunity being one ``round_interval_s`` of the time since the plug-in first saw the agent ask
whether to train (offline time counts: q_n is the chance of taking part in a round at all), with
Laplace's rule, (rounds + 1) / (opportunities + 2), so that a device two rounds old does not claim
q = 1 or 0.05 on no evidence (1/q_n moves eq. 14 most). It is floored at ``min_availability``
(0.01, the paper's clip) so that 1/q_n stays finite.
"""
import logging
import math
import dataclasses
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np

from streamfl.methods.sfedpo.buffer_policy import VICTIMS, DdsPolicy
from streamfl.methods.sfedpo.dds import (DirichletOracle, dds_rates, dds_scores, heterogeneity_score,
                                        population_weights, replaced_per_step)
from streamfl.methods.sfedpo.latent import SOURCES, StateSource, make_state_source
from streamfl.agent.plugins.base import AgentPlugin, ModelDecision, RoundContext, Statistic
from streamfl.config import bounded
from streamfl.protocol.messages import GlobalModel
from streamfl.methods.sfedpo.payloads import MAX_STATES, SfedpoReport, SfedpoTerms
from streamfl.sensors.window import Window

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SfedpoAgentConfig:
    """The device's SFedPO settings (module docstring; the inference keys are ``InferredStates``')."""

    #: Where states come from: "given" (the window's, else inferred), "inferred", "single".
    states: str = "given"
    #: Dirichlet prior alpha0 per state (App. D; 1 = uniform, forgotten after a few windows).
    prior: float = bounded(1.0, 0.0, 1e6, lo_open=True)
    #: Pseudo-windows per class when estimating a state's class mix for d_m.
    class_prior: float = bounded(1.0, 0.0, 1e6)
    #: Windows between recomputations of the admission shares (O(M K) each, about 50 us; a new
    #: state recomputes at once). pi_hat moves by at most refresh_windows / windows seen.
    refresh_windows: int = bounded(64, 1, 10 ** 6)
    #: The slot an admitted window replaces: "random" (eq. 1's convex mix), "oldest" (FIFO) or
    #: "balanced" (the most-held class among a few random slots; streamfl's).
    victim: str = "random"
    #: Floor on the availability q_n this board reports (0.01, the paper's clip), so 1/q_n stays
    #: finite.
    min_availability: float = bounded(0.01, 0.0, 1.0, lo_open=True)
    #: Inferred states: windows in the sliding label histogram that is matched to a state.
    history: int = bounded(32, 1, 10 ** 6)
    #: Inferred states: match the histogram to the nearest state every this many windows.
    every: int = bounded(8, 1, 10 ** 6)
    #: Inferred states: a histogram within this total-variation distance of a state's centroid joins
    #: it; beyond it for a whole history starts a new one.
    threshold: float = bounded(0.35, 0.0, 1.0, lo_open=True)
    #: States this board tracks; past it the nearest is taken.
    max_states: int = bounded(32, 1, MAX_STATES)

    def __post_init__(self) -> None:
        if self.states not in SOURCES:
            raise ValueError("states must be one of %s, got %r" % (", ".join(SOURCES), self.states))
        if self.victim not in VICTIMS:
            raise ValueError("victim must be one of %s, got %r" % (", ".join(VICTIMS), self.victim))
        if not self.prior > 0 or not self.class_prior >= 0:
            raise ValueError("prior must be > 0 and class_prior >= 0")
        if not 0 < self.min_availability <= 1:
            raise ValueError("min_availability must be in (0, 1], got %r" % (self.min_availability,))
        if self.refresh_windows < 1 or not 1 <= self.max_states <= MAX_STATES:
            raise ValueError("refresh_windows must be >= 1 and max_states in [1, %d]" % MAX_STATES)
        if self.history < 1 or self.every < 1 or not 0.0 < self.threshold <= 1.0:
            raise ValueError("history and every must be >= 1 and threshold in (0, 1]")


class SfedpoAgentPlugin(AgentPlugin):
    """DDS admission on the buffer, and s_n, q_n and state counts with each update."""

    name = "sfedpo"
    Config = SfedpoAgentConfig
    activated_by = (SfedpoTerms.KIND,)

    def __init__(self, config: SfedpoAgentConfig):
        super().__init__(config)
        self.terms: Optional[SfedpoTerms] = None
        self._seed, self._classes = 0, 0
        self.source: Optional[StateSource] = None
        self.oracle: Optional[DirichletOracle] = None
        self.policy: Optional[DdsPolicy] = None
        self._since_refresh = 0
        self._local_steps = 1
        #: ``policy.offered_full`` at the previous report: the windows offered since give s_n's units.
        self._offered_at_report = 0
        self._first_s: Optional[float] = None
        self._last_s: Optional[float] = None
        self.rounds = 0

    def bind(self, seed: int, num_classes: int) -> None:
        self._seed, self._classes = int(seed), int(num_classes)

    def _build(self) -> None:
        """The source, oracle and policy, made when the method first runs (then kept)."""
        c = self.config
        k = max(1, self._classes)
        self.source = make_state_source(c.states, k, history=c.history, every=c.every,
                                        threshold=c.threshold, max_states=c.max_states)
        self.oracle = DirichletOracle(k, prior=c.prior, class_prior=c.class_prior, max_states=c.max_states)
        self.policy = DdsPolicy(self._seed, default_rate=self.terms.budget, victim=c.victim)

    def on_model_received(self, gm: GlobalModel, hparams: Dict[str, float]) -> ModelDecision:
        """Lends the buffer the DDS policy (built at the first terms), its shares recomputed when
        the terms change; keeps the round's local steps for s_n (eq. 12)."""
        terms = gm.extras[SfedpoTerms.KIND]
        changed = terms != self.terms
        self.terms = terms
        if self.policy is None:
            self._build()
            log.info("SFedPO: admitting windows by latent state (%s states, budget %.2f, DDS %s)",
                     self.config.states, terms.budget, "on" if terms.dds else "off")
        if changed:
            self.refresh()
        steps = hparams.get("local_steps")
        if steps is not None and steps >= 1:
            self._local_steps = int(steps)
        return ModelDecision(hparams, buffer_policy=self.policy)

    def on_window_arrived(self, window: Window) -> Optional[Window]:
        """Resolves the window's latent state (given or inferred, ``states``), which the buffer's
        DDS admission then reads: the window as it should be stored."""
        state = self.source.state_of(window)
        new = state not in self.oracle.counts
        self.oracle.observe(state, window.label)
        self._since_refresh += 1
        if new or self._since_refresh >= self.config.refresh_windows:
            self.refresh()
        return window if state == window.state else dataclasses.replace(window, state=state)

    def _inputs(self):
        """(states, pi_hat, w, d) over the states known to this device and, if shared, the fleet."""
        t = self.terms
        shared = self.source.shared_ids
        fleet = t.state_weights if shared else None
        states = self.oracle.states(also=t.states if shared else ())[:MAX_STATES]
        return (states, self.oracle.pi_hat(states), population_weights(states, fleet),
                self.oracle.divergence(states))

    def refresh(self) -> Dict[int, float]:
        """Recompute the admission shares alpha_n,m (uniform at the budget with DDS off)."""
        self._since_refresh = 0
        t = self.terms
        self.policy.default_rate = t.budget
        if not t.dds or not self.oracle.counts:
            self.policy.rates = {}
            return {}
        states, pi, w, d = self._inputs()
        rates = dds_rates(pi, dds_scores(pi, w, d, t.budget, t.a1, t.b1), t.budget)
        self.policy.rates = {s: float(r) for s, r in zip(states, rates)}
        return self.policy.rates

    def on_round_opportunity(self, now: float) -> bool:
        if self._first_s is None:
            self._first_s = float(now)
        self._last_s = float(now)
        return True

    def availability(self, round_interval_s: float) -> float:
        """q_n: rounds trained over round opportunities so far, in [min_availability, 1]."""
        if not round_interval_s > 0 or self._first_s is None:
            return 1.0
        chances = (self._last_s - self._first_s) / round_interval_s + 1.0
        return float(min(1.0, max(self.config.min_availability, (self.rounds + 1.0) / (chances + 2.0))))

    def after_round(self, ctx: RoundContext) -> List[Statistic]:
        self.rounds += 1
        t = self.terms
        states, pi, w, d = self._inputs()
        offered = self.policy.offered_full - self._offered_at_report
        self._offered_at_report = self.policy.offered_full
        steps = ctx.local_steps or self._local_steps  # the round's own T, where the runtime says
        if len(states) and self.policy.capacity:
            admission = np.asarray([self.policy.rates.get(s, t.budget) for s in states])
            alpha = replaced_per_step(admission, offered, self.policy.capacity, steps)
            score = heterogeneity_score(pi, alpha, d, w, steps, t.g, t.l_eta_sigma2)
        else:
            score = 0.0
        rate = self.policy.admission_rate
        report = SfedpoReport(
            score=float(min(max(score, 0.0), 1e6)), availability=self.availability(ctx.round_interval_s),
            shared_ids=self.source.shared_ids, states=tuple(self.oracle.counts),
            counts=tuple(self.oracle.counts.values()),
            admission_rate=float(rate) if math.isfinite(rate) else None)
        return [Statistic(report)]
