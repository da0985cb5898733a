"""The device side of FedCurv (Shoham et al. 2019, "Overcoming forgetting in federated learning on
non-IID data"): the peers' penalty and the own Fisher.

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

Guard (as ST-EWC's, ``methods/stewc/agent.py``): ``U`` comes from the fleet, so one device's
forged diagonal (1e30 once made every honest agent's rounds NaN) or a plain sum over many devices
sets the pull's curvature ``c = lambda2 * A``, and SGD diverges where ``lr * c > 2``. Each element
of ``lambda2 * A`` is capped at ``stability / lr`` (the lr the global model's hyper-parameters
give, as this plug-in sees them in ``on_model_received``), and ``B`` is scaled by the same factor
there, so the pull still points at the peers' target ``B / A``, only no faster than a full step.
The trainer caps the merged pull of every method again at the round's own lr
(``agent/quadratic.py``): this cap keeps FedCurv's own target where it binds, that one holds
whatever the round's lr and the other pulls are. A pull that is not finite anywhere (``V`` or
``B`` out of float32's range) is dropped for the round, with one WARNING per global model.
"""
import logging
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from streamfl.agent.plugins.base import AgentPlugin, ModelDecision, Penalty, RoundContext, Statistic, Tensors
from streamfl.agent.quadratic import MIN_CURVATURE, QuadraticPull
from streamfl.config import bounded
from streamfl.models.fisher import fisher_diagonal
from streamfl.protocol.messages import GlobalModel
from streamfl.methods.fedcurv.payloads import CurvatureDiagonal, CurvatureTerms

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FedCurvAgentConfig:
    """The board's side of FedCurv: lambda2 and the sample size come with the global model.

    stability: cap on ``lr * lambda2 * (U - F_k)`` per element (see the module docstring). 1.0, as
      ST-EWC's: SGD then moves at most a full step back to the peers' target, never past it.
      Above 1 it overshoots, above 2 (plain SGD; 2 (1 + momentum) with momentum) the pull alone
      diverges: the range goes to 100, as ST-EWC's, only for runs that study divergence.
    """

    stability: float = bounded(1.0, 0.0, 100.0, lo_open=True)

    def __post_init__(self) -> None:
        if not 0 < self.stability <= 100:
            raise ValueError("fedcurv: stability must be in (0, 100], got %r" % (self.stability,))


class FedCurvAgentPlugin(AgentPlugin):
    """Builds the round's penalty from the global model's terms and measures the device's Fisher."""

    name = "fedcurv"
    Config = FedCurvAgentConfig
    activated_by = (CurvatureTerms.KIND,)

    def __init__(self, config: FedCurvAgentConfig = FedCurvAgentConfig()):
        super().__init__(config)
        #: The newest global model's terms while FedCurv runs (lambda2 > 0), else None.
        self.terms: Optional[CurvatureTerms] = None
        #: This device's last sent ``(F_k, theta_k)``.
        self._own: Optional[Tuple[Tensors, Tensors]] = None
        #: Rounds since the last diagonal was estimated.
        self._skipped = 0
        #: The round's lr from the global model's hyper-parameters (None: none given, no cap here).
        self._lr: Optional[float] = None
        #: Version of the global model the terms came from (for the log).
        self._version = -1
        #: ``(terms, lr, own, pull)`` of the last pull built: the same inputs give the same pull.
        self._cached: Optional[Tuple[CurvatureTerms, Optional[float], Optional[Tuple[Tensors, Tensors]],
                                     Optional[QuadraticPull]]] = None
        #: The terms whose pull was last reported not finite (one WARNING per global model).
        self._warned: Optional[CurvatureTerms] = None
        #: Whether the last pull built was capped (a WARNING when capping starts, INFO when it ends).
        self._capping = False

    def on_model_received(self, gm: GlobalModel, hparams: Dict[str, float]) -> ModelDecision:
        """The model's terms (kept only while lambda2 > 0) and the round's lr, for the cap."""
        terms = gm.extras[CurvatureTerms.KIND]
        self.terms = terms if terms.active else None
        self._version = gm.version
        lr = hparams.get("lr")
        self._lr = float(lr) if isinstance(lr, (int, float)) and 0 < lr < float("inf") else None
        return ModelDecision(hparams)

    def before_round(self, model: nn.Module) -> Optional[Penalty]:
        """The round's ``QuadraticPull``, or None (FedCurv off, no peer statistics yet, or a pull
        that is not finite); built once per global model's terms, lr and own contribution."""
        if self.terms is None or self.terms.U is None or self.terms.V is None:
            return None
        cached = self._cached
        if cached is not None and cached[0] is self.terms and cached[1] == self._lr and cached[2] is self._own:
            return cached[3]
        pull = self._pull(model)
        self._cached = (self.terms, self._lr, self._own, pull)  # the objects: an id() can be reused
        return pull

    def _pull(self, model: nn.Module) -> Optional[QuadraticPull]:
        lam = float(self.terms.lambda2)
        U, V = self.terms.U, self.terms.V
        # lambda2 * a <= stability / lr, i.e. a <= stability / (lr * lambda2).
        cap = self.config.stability / (self._lr * lam) if self._lr else np.inf
        coefficients = {}
        capped = total = 0
        largest = 0.0
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
                over = mask & (a > cap)
                if over.any():
                    # Capped where lr lambda2 a > stability, b with it: the target b / a stays.
                    capped += int(over.sum())
                    largest = max(largest, float(a[over].max()))
                    b = np.where(over, b * (cap / np.where(over, a, 1.0)), b)
                    a = np.where(over, cap, a)
                total += int(mask.sum())
                # Gradient lambda2 (a theta - b) where the peers' curvature is positive.
                coefficients[name] = (torch.as_tensor(lam * np.where(mask, a, 0.0), dtype=p.dtype),
                                      torch.as_tensor(lam * np.where(mask, b, 0.0), dtype=p.dtype))
        if not coefficients:
            return None
        if not all(bool(torch.isfinite(A).all()) and bool(torch.isfinite(B).all())
                   for A, B in coefficients.values()):
            if self._warned is not self.terms:
                self._warned = self.terms
                log.warning("FedCurv's pull from global model v%d is not finite (U or V beyond "
                            "float32): this model's rounds train without it", self._version)
            return None
        if capped and not self._capping:
            log.warning("FedCurv's pull from global model v%d capped on %d of %d elements: "
                        "lr * lambda2 * (U - F_k) up to %.3g, above stability %g (the peers' "
                        "curvature is extreme, or forged)", self._version, capped, total,
                        self._lr * lam * largest, self.config.stability)
        elif self._capping and not capped:
            log.info("FedCurv's pull from global model v%d is under its stability cap again",
                     self._version)
        self._capping = bool(capped)
        return QuadraticPull(coefficients, stability=self.config.stability)

    def after_round(self, ctx: RoundContext) -> List[Statistic]:
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
