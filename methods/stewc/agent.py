"""The device side of ST-EWC's temporal term (the ST-EWC paper, eq. 8 and 12).

The global model's ``PeriodTerms`` carry ``lambda1`` and the coordinator's sums ``P = sum_t F^t``
and ``Q = sum_t F^t * theta*_t``. The device trains with ``lambda1 (P theta - Q)`` added to the
gradient: the gradient of ``(lambda1/2) sum P (theta - Q/P)^2`` (the paper's penalty less a
constant), handed to the trainer as a ``QuadraticPull`` (``agent/quadratic.py``). FedCurv's plug-in
adds the spatial term beside it; the trainer fuses the two into one gradient per parameter.

Guard (the paper's lr and lambda1 are tuned together; ours come from different places): with SGD
a quadratic pull whose curvature c has ``lr * c > 2`` overshoots and diverges, so each element of
``lambda1 * P`` is capped at ``stability / lr`` (``stability`` 1.0: at most a full step back to
the target, never past it; the trainer caps the sum of this pull and FedCurv's again at the
round's own lr, ``agent/quadratic.py``). When the coordinator announces a new period
(``consolidating``), the model carrying the announcement is theta*_t: the device keeps its tensors and, after its next
round, sends its local T-FDM at them (eq. 8) with its buffer's size as ``n_k,t``, once per period.
It also counts its input drifts (``methods/stewc/drift.py``) and reports the count with every update and
in its telemetry while it skips, the signal a ``drift`` boundary cuts periods on.
"""
import copy
import logging
from dataclasses import dataclass
from typing import Dict, List, Optional, Set, Tuple

import numpy as np
import torch
from torch import nn

from streamfl.methods.stewc.drift import InputDrift
from streamfl.agent.plugins.base import (AgentPlugin, ModelDecision, Penalty, ReportContext, RoundContext,
                                         Statistic, Tensors)
from streamfl.agent.quadratic import MIN_CURVATURE, QuadraticPull
from streamfl.config import bounded
from streamfl.sensors.window import Window
from streamfl.models.fisher import fisher_diagonal
from streamfl.models.serialize import arrays_to_model
from streamfl.protocol.extras import Extra
from streamfl.protocol.messages import GlobalModel
from streamfl.methods.stewc.payloads import DriftSignal, PeriodFisher, PeriodTerms

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StEwcAgentConfig:
    """The board's side of ST-EWC: its drift detector and the penalty's stability cap.

    drift_windows, drift_threshold: ``InputDrift``'s reference and comparison size, and the shift
      that counts as a drift (2.4x its noise level at 32 windows; see ``methods/stewc/drift.py``).
    stability: cap on ``lr * lambda1 * P`` per element (see the module docstring).
    """

    drift_windows: int = bounded(32, 2, 65536)
    drift_threshold: float = bounded(0.6, 0.0, 1000.0, lo_open=True)
    stability: float = bounded(1.0, 0.0, 100.0, lo_open=True)

    def __post_init__(self) -> None:
        if self.drift_windows < 2 or not self.drift_threshold > 0 or not self.stability > 0:
            raise ValueError("stewc: drift_windows >= 2, drift_threshold > 0 and stability > 0")


class StEwcAgentPlugin(AgentPlugin):
    """Adds the temporal penalty, answers consolidations with the T-FDM, counts input drifts."""

    name = "stewc"
    Config = StEwcAgentConfig
    activated_by = (PeriodTerms.KIND,)

    def __init__(self, config: StEwcAgentConfig = StEwcAgentConfig()):
        super().__init__(config)
        self.terms: Optional[PeriodTerms] = None
        self.drift = InputDrift(config.drift_windows, config.drift_threshold)
        self._lr: Optional[float] = None
        #: ``(period, theta*_t)`` while this device owes that period's T-FDM.
        self._anchor: Optional[Tuple[int, Tensors]] = None
        self._answered: Set[int] = set()
        self._cached: Optional[Tuple[PeriodTerms, Optional[float], Optional[QuadraticPull]]] = None
        self._period: Optional[int] = None
        #: The period whose temporal term was last logged (once a period, with its pull).
        self._logged: Optional[int] = None

    def on_model_received(self, gm: GlobalModel, hparams: Dict[str, float]) -> ModelDecision:
        """The period's terms; the anchor theta*_t when a period is being consolidated; the
        round's lr, for the cap."""
        self.terms = gm.extras[PeriodTerms.KIND]
        if self.terms.period != self._period:
            if self._period is not None:
                log.info("period %d begins (global model v%d)", self.terms.period, gm.version)
            self._period = self.terms.period
        t = self.terms.consolidating
        if t is not None and t not in self._answered and (self._anchor is None or self._anchor[0] != t):
            self._anchor = (t, gm.tensors)
        lr = hparams.get("lr")
        self._lr = float(lr) if lr is not None and lr > 0 else None
        return ModelDecision(hparams)

    def on_window_arrived(self, window: Window) -> None:
        if self.drift.add(window.x):
            log.info("input drift %d (shift %.2f)", self.drift.drifts, self.drift.shift)

    def _pull(self, model: nn.Module) -> Optional[QuadraticPull]:
        """This global model's P and Q as a ``QuadraticPull`` (cached while they and lr hold)."""
        if self._cached is not None and self._cached[0] is self.terms and self._cached[1] == self._lr:
            return self._cached[2]
        lam = float(self.terms.lambda1)
        cap = self.config.stability / (self._lr * lam) if self._lr else np.inf
        coefficients = {}
        for name, p in model.named_parameters():
            if not p.requires_grad or name not in self.terms.P:
                continue
            P = np.asarray(self.terms.P[name], dtype=np.float64)
            mask = P > MIN_CURVATURE
            if not mask.any():
                continue
            a = np.where(mask, np.minimum(P, cap), 0.0)
            # Gradient lambda1 a (theta - Q/P): lambda1 (P theta - Q) wherever P is under the cap.
            target = np.where(mask, np.asarray(self.terms.Q[name], dtype=np.float64) / np.where(mask, P, 1.0), 0.0)
            coefficients[name] = (torch.as_tensor(lam * a, dtype=p.dtype),
                                  torch.as_tensor(lam * a * target, dtype=p.dtype))
        pull = QuadraticPull(coefficients, stability=self.config.stability) if coefficients else None
        self._cached = (self.terms, self._lr, pull)  # the terms themselves: an id() can be reused
        return pull

    def before_round(self, model: nn.Module) -> Optional[Penalty]:
        """The temporal ``QuadraticPull``, or None before any period was consolidated."""
        if self.terms.P is None or not self.terms.lambda1 > 0:
            return None
        pull = self._pull(model)
        if pull is not None and self._logged != self.terms.period:
            self._logged = self.terms.period
            with torch.no_grad():
                grads = [A * p - B for p, (A, B) in QuadraticPull.merge([pull], model).items()]
            log.info("temporal EWC term in period %d: lambda1 %.3g, |lambda1 (P theta - Q)| = %.4g "
                     "at the round's start", self.terms.period, float(self.terms.lambda1),
                     float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads))))
        return pull

    def after_round(self, ctx: RoundContext) -> List[Statistic]:
        """The drift count, and the T-FDM owed for a period being consolidated (once)."""
        out = [Statistic(DriftSignal(self.drift.drifts, self.drift.shift))]
        if self._anchor is None or ctx.buffer_len == 0:
            return out
        period, anchor = self._anchor
        n = max(1, min(self.terms.fisher_samples, ctx.buffer_len))
        X, y = ctx.sample(n)
        if len(y) == 0:
            return out
        at = copy.deepcopy(ctx.model)
        arrays_to_model(at, anchor)
        gen = torch.Generator().manual_seed((ctx.seed * 7919 + period) & 0x7FFFFFFFFFFFFFFF)
        diag = fisher_diagonal(at, X, y, generator=gen)
        self._anchor = None
        self._answered.add(period)
        if not all(np.isfinite(a).all() for a in diag.values()):
            log.warning("T-FDM of period %d not finite; not sent", period)
            return out + [Statistic(None, per_window_windows=n)]
        log.info("T-FDM of period %d from %d windows sent", period, n)
        return out + [Statistic(PeriodFisher(period, int(ctx.buffer_len), diag), per_window_windows=n)]

    def before_telemetry(self, ctx: ReportContext) -> List[Extra]:
        return [DriftSignal(self.drift.drifts, self.drift.shift)]
