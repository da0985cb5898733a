"""The device side of FedCurv (Shoham et al. 2019; DESIGN.md s8): the peers' penalty and the own Fisher.

The global model's ``CurvatureTerms`` extra carries ``lambda2`` and the coordinator's sums
``U = sum_k F_k`` and ``V = sum_k F_k * theta_k`` (the coordinator's ``CurvatureSums``). Device k removes its own last
contribution and trains with the gradient ``lambda2 ((U - F_k) * theta - (V - F_k * theta_k))``.
With ``A = U - F_k`` and ``B = V - F_k * theta_k`` that is the gradient of
``(lambda2/2) sum A (theta - B/A)^2``, the paper's penalty less a constant, which this module
hands the trainer as a ``QuadraticPull`` (added to the gradients, not to the logged loss). After the round the device estimates its Fisher diagonal at the trained model and sends
it with the update (every ``fisher_every`` rounds; in between the coordinator pairs its last one
with the new model); it remembers ``(F_k, theta_k)`` to subtract next time.

Until the coordinator has folded this device's newest update in, ``U`` may still hold an older
``F_k``; subtracting the newest one instead leaves a small error of one device's share, which the
next global model corrects (clamped at zero, so the penalty never pushes away from peers).
"""
import logging
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from streamfl.agent.plugins.base import AgentPlugin, Penalty, RoundContext, Statistic, Tensors
from streamfl.agent.quadratic import MIN_CURVATURE, QuadraticPull
from streamfl.models.fisher import fisher_diagonal
from streamfl.protocol.messages import GlobalModel
from streamfl.protocol.payloads import CurvatureDiagonal, CurvatureTerms

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FedCurvAgentConfig:
    """Nothing to set on the device: lambda2 and the sample size come with the global model."""


class FedCurvAgentPlugin(AgentPlugin):
    """Builds the round's penalty from the global model's terms and measures the device's Fisher."""

    name = "fedcurv"
    Config = FedCurvAgentConfig

    def __init__(self, config: FedCurvAgentConfig = FedCurvAgentConfig()):
        super().__init__(config)
        #: The newest global model's terms while FedCurv runs (lambda2 > 0), else None.
        self.terms: Optional[CurvatureTerms] = None
        #: This device's last sent ``(F_k, theta_k)``.
        self._own: Optional[Tuple[Tensors, Tensors]] = None
        #: Rounds since the last diagonal was estimated.
        self._skipped = 0

    def on_global_model(self, gm: GlobalModel) -> None:
        terms = gm.extras.get(CurvatureTerms.KIND)
        self.terms = terms if isinstance(terms, CurvatureTerms) and terms.active else None

    def penalty(self, model: nn.Module) -> Optional[Penalty]:
        """The round's ``QuadraticPull``, or None (FedCurv off, or no peer statistics yet)."""
        if self.terms is None or self.terms.U is None or self.terms.V is None:
            return None
        lam = float(self.terms.lambda2)
        U, V = self.terms.U, self.terms.V
        coefficients = {}
        for name, p in model.named_parameters():
            if not p.requires_grad or name not in U or name not in V:
                continue
            a = np.asarray(U[name], dtype=np.float64)
            b = np.asarray(V[name], dtype=np.float64)
            if self._own is not None and name in self._own[0]:
                f, theta = self._own[0][name], self._own[1][name]
                a = a - f
                b = b - f * theta
            a = np.maximum(a, 0.0)
            mask = a > MIN_CURVATURE
            if mask.any():
                # Gradient lambda2 (a theta - b) where the peers' curvature is positive.
                coefficients[name] = (torch.as_tensor(lam * np.where(mask, a, 0.0), dtype=p.dtype),
                                      torch.as_tensor(lam * np.where(mask, b, 0.0), dtype=p.dtype))
        return QuadraticPull(coefficients) if coefficients else None

    def statistics(self, ctx: RoundContext) -> List[Statistic]:
        """The Fisher diagonal on as many labelled windows as the coordinator asks for; remembers
        ``(F_k, theta_k)`` to subtract from the next round's sums."""
        if self.terms is None:
            return []
        if self._own is not None and self._skipped + 1 < self.terms.fisher_every:
            # Not this round (``fisher_every``): the coordinator keeps our last F_k with this
            # round's model, and so do we.
            self._skipped += 1
            self._own = (self._own[0], {k: np.asarray(v, dtype=np.float32) for k, v in ctx.tensors.items()})
            return []
        self._skipped = 0
        n = max(1, min(self.terms.fisher_samples, ctx.buffer_len))
        X, y = ctx.sample(n)
        cost = Statistic(None, per_window_windows=n)
        if len(y) == 0:
            return [cost]
        gen = torch.Generator().manual_seed((ctx.seed * 104729 + ctx.round_index) & 0x7FFFFFFFFFFFFFFF)
        diag = fisher_diagonal(ctx.model, X, y, generator=gen)
        if not all(np.isfinite(a).all() for a in diag.values()):
            log.warning("Fisher diagonal not finite; the update goes without it")
            return [cost]
        self._own = (diag, {k: np.asarray(v, dtype=np.float32) for k, v in ctx.tensors.items()})
        return [Statistic(CurvatureDiagonal(diag), per_window_windows=n)]
