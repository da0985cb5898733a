"""Rounds that diverge: reported once with their cause, counted, and not retried on the same model.

A round whose loss or weights stop being finite sends nothing (``AgentCore.finish_round``). Left
alone, the runtime would start the next round from the same global model with the same pulls and
hyper-parameters and diverge again, one ERROR a round (a forged FedCurv diagonal once gave every
honest agent 39 errors in 20 s). ``DivergenceWatch`` instead:

- logs one WARNING when rounds start to diverge, naming the cause: the methods' quadratic pulls
  and their largest ``lr * curvature`` as the plug-ins built them and as the trainer applied them
  (``agent/quadratic.py``), penalties added to the loss, the lr, the loss, the base version and the
  global model held; then at most one WARNING every ``log_every_s`` with the count while it goes on
  (DEBUG in between), and one INFO line when a round succeeds again;
- keeps the count and the cause in progress for the agent's telemetry and status
  (``diverged_rounds``, ``divergence``), so the coordinator's side sees it too;
- holds the next round back (``allows``) until a global model other than the one held when the
  round diverged arrives: the same model, pulls and lr would diverge again. A fleet whose models
  stop coming (a lone device, a coordinator that aggregates nothing) would then wait for ever, so
  after ``retry_after_s`` without a new model one round is tried again, and again each
  ``retry_after_s`` while it still diverges. The agent sets ``retry_after_s`` to
  ``diverged_retry_rounds`` (10) round intervals: a failed round costs a round's energy, and one in
  ten is a tenth of the waste of retrying every round, while a coordinator that moves on is
  followed at its next model (FedAsync makes one per update, FedAvg one per round).

The wait is timed on the runtime's scheduling clock (the ``now`` of ``AgentCore.ready``), from the
first readiness check after the diverged round; log pacing uses the same clock.
"""
import logging
import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

from streamfl.agent.quadratic import QuadraticPull

log = logging.getLogger(__name__)

#: Seconds between repeated WARNINGs while rounds keep diverging (10 minutes: a line an operator
#: reads, not a flood; every round is still counted and logged at DEBUG).
LOG_EVERY_S = 600.0


@dataclass(frozen=True)
class DivergenceCause:
    """What a diverged round trained with.

    pulls: ``(plug-in name, lr * largest curvature)`` of each quadratic pull as its plug-in built it.
    applied: ``lr * largest curvature`` of the merged pull the trainer applied (after its cap), and
      ``capped`` how many elements that cap lowered.
    terms: names of plug-ins whose penalty went into the loss.
    """

    round_index: int
    loss: float
    lr: float
    base_version: int
    model_version: Optional[int]
    run_id: str = ""
    pulls: Tuple[Tuple[str, float], ...] = ()
    applied: float = 0.0
    capped: int = 0
    terms: Tuple[str, ...] = ()

    def describe(self) -> str:
        """One line: the round, loss, lr and what pulled on the weights."""
        if self.pulls:
            pulls = ", ".join("%s %.3g" % (name, c) for name, c in self.pulls)
            pulls = "quadratic pulls (lr * largest curvature): %s; applied %.3g%s" % (
                pulls, self.applied, " (%d elements capped)" % self.capped if self.capped else "")
        else:
            pulls = "no quadratic pull"
        terms = "; loss terms: %s" % ", ".join(self.terms) if self.terms else ""
        model = "" if self.model_version is None else ", global model v%d%s" % (
            self.model_version, " of run %s" % self.run_id if self.run_id else "")
        return "round %d from v%d%s: loss %s at lr %g; %s%s" % (
            self.round_index, self.base_version, model, _number(self.loss), self.lr, pulls, terms)


def _number(x: float) -> str:
    return "%.4g" % x if math.isfinite(x) else str(x)


def describe_pulls(named: Sequence[Tuple[str, Any]], lr: float) -> Tuple[Tuple[Tuple[str, float], ...], Tuple[str, ...]]:
    """``(pulls, terms)`` for ``DivergenceCause`` from ``(plug-in name, penalty)`` pairs."""
    pulls = tuple((name, lr * p.largest_curvature()) for name, p in named if isinstance(p, QuadraticPull))
    terms = tuple(name for name, p in named if p is not None and not isinstance(p, QuadraticPull))
    return pulls, terms


class DivergenceWatch:
    """The agent's diverged rounds: counts, the cause in progress, the wait for a new model."""

    def __init__(self, retry_after_s: float, log_every_s: float = LOG_EVERY_S):
        if not (retry_after_s >= 0 and log_every_s > 0):
            raise ValueError("divergence: retry_after_s must be >= 0 and log_every_s > 0")
        self.retry_after_s = float(retry_after_s)
        self.log_every_s = float(log_every_s)
        #: Rounds that diverged since the agent started.
        self.total = 0
        #: Rounds that diverged since the last one that did not (0: not diverging).
        self.streak = 0
        #: The last diverged round's cause while rounds diverge, else None.
        self.cause: Optional[DivergenceCause] = None
        #: ``(run id, version)`` of the global model held when the last round diverged.
        self._held: Optional[Tuple[str, int]] = None
        #: Scheduling time of the last divergence; None until ``allows`` first sees it.
        self._since_s: Optional[float] = None
        #: Scheduling time of the streak's first ``allows`` and of its last WARNING.
        self._started_s: Optional[float] = None
        self._logged_s: Optional[float] = None
        self._streak_logged = 0

    @property
    def diverging(self) -> bool:
        """True from a diverged round until a round succeeds."""
        return self.streak > 0

    def waits_for_other_than(self, model: Optional[Tuple[str, int]]) -> bool:
        """True while rounds diverge on ``model`` ``(run id, version)``: another model would let
        the next round start at once (``allows`` otherwise holds it ``retry_after_s``)."""
        return self.streak > 0 and self._held is not None and model == self._held

    def diverged(self, cause: DivergenceCause) -> None:
        """A round diverged: count it, log it (once at the start, then paced by ``allows``)."""
        self.total += 1
        self.streak += 1
        self.cause = cause
        self._held = None if cause.model_version is None else (cause.run_id, cause.model_version)
        self._since_s = None  # stamped by the next ``allows``
        if self.streak == 1:
            self._streak_logged = 1
            log.warning("training diverged: %s. No update is sent; the next round waits for a "
                        "global model other than v%s (or tries again after %.0f s without one)",
                        cause.describe(), "?" if cause.model_version is None else cause.model_version,
                        self.retry_after_s)
        else:
            log.debug("training diverged again (%d in a row): %s", self.streak, cause.describe())

    def succeeded(self, round_index: int, base_version: int) -> None:
        """A round ended with finite loss and weights: say so once if rounds had diverged."""
        if self.streak:
            log.info("training converges again: round %d from v%d finished after %d diverged "
                     "round(s) (%d since the agent started)", round_index, base_version,
                     self.streak, self.total)
        self.streak = 0
        self.cause = None
        self._held = None
        self._since_s = self._started_s = self._logged_s = None

    def allows(self, model: Optional[Tuple[str, int]], now: float) -> bool:
        """Whether a round may start at ``now`` holding global model ``(run id, version)``: always,
        unless the last round diverged on that same model less than ``retry_after_s`` ago."""
        if not self.streak:
            return True
        if self._since_s is None:
            self._since_s = now
            if self._started_s is None:
                self._started_s = self._logged_s = now
        if self.streak > self._streak_logged and now - self._logged_s >= self.log_every_s:
            log.warning("training still diverges: %d round(s) in a row over %.0f s, none "
                        "succeeded; the last: %s", self.streak, now - self._started_s,
                        self.cause.describe())
            self._logged_s = now
            self._streak_logged = self.streak
        if self._held is None or model != self._held:
            return True
        return now - self._since_s >= self.retry_after_s

    def status(self) -> Dict[str, Any]:
        """``diverged_rounds`` (since start) and ``divergence`` (the cause in progress, "" if none)."""
        return {"diverged_rounds": self.total,
                "divergence": "" if self.cause is None else self.cause.describe()}
