"""The device side of FedCurv (Shoham et al. 2019; DESIGN.md s8): the peers' penalty and the own Fisher.

The global model's ``ewc`` carries ``lambda2`` and the coordinator's sums ``U = sum_k F_k`` and
``V = sum_k F_k * theta_k`` (the coordinator's ``CurvatureSums``). Device k removes its own last
contribution and trains with the gradient ``lambda2 ((U - F_k) * theta - (V - F_k * theta_k))``.
With ``A = U - F_k`` and ``B = V - F_k * theta_k`` that is the gradient of
``(lambda2/2) sum A (theta - B/A)^2``, which this module adds to the loss: the same gradient as the
paper's penalty, never negative (it is the paper's penalty less a constant), so logged losses stay
readable. After the round the device estimates its Fisher diagonal at the trained model and sends
it with the update; it remembers ``(F_k, theta_k)`` to subtract next time.

Until the coordinator has folded this device's newest update in, ``U`` may still hold an older
``F_k``; subtracting the newest one instead leaves a small error of one device's share, which the
next global model corrects (clamped at zero, so the penalty never pushes away from peers).
"""
import logging
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch
from torch import nn

from streamfl.models.fisher import fisher_diagonal

log = logging.getLogger(__name__)

Tensors = Dict[str, np.ndarray]
#: Curvature below this counts as none (its target ``B / A`` would be noise).
MIN_CURVATURE = 1e-12


class FedCurvClient:
    """Builds the round's penalty from a global model's ``ewc`` and measures the device's Fisher."""

    def __init__(self) -> None:
        #: This device's last sent ``(F_k, theta_k)``.
        self._own: Optional[Tuple[Tensors, Tensors]] = None

    @staticmethod
    def active(ewc: Mapping[str, Any]) -> bool:
        """True when the coordinator runs FedCurv (its global model names a ``lambda2``)."""
        lam = ewc.get("lambda2") if ewc else None
        return isinstance(lam, (int, float)) and not isinstance(lam, bool) and lam > 0

    def penalty(self, ewc: Mapping[str, Any], model: nn.Module) -> Optional[Callable[[nn.Module], torch.Tensor]]:
        """``penalty(model)`` for this round, or None (FedCurv off, or no peer statistics yet)."""
        if not self.active(ewc) or not isinstance(ewc.get("U"), Mapping) or not isinstance(ewc.get("V"), Mapping):
            return None
        lam = float(ewc["lambda2"])
        U, V = ewc["U"], ewc["V"]
        terms: List[Tuple[str, torch.Tensor, torch.Tensor]] = []
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
            target = np.where(mask, b / np.where(mask, a, 1.0), 0.0)
            a = np.where(mask, a, 0.0)
            if mask.any():
                terms.append((name, torch.as_tensor(a, dtype=p.dtype), torch.as_tensor(target, dtype=p.dtype)))
        if not terms:
            return None

        def fedcurv_penalty(m: nn.Module) -> torch.Tensor:
            params = dict(m.named_parameters())
            total = sum((a * (params[name] - target).pow(2)).sum() for name, a, target in terms)
            return 0.5 * lam * total

        return fedcurv_penalty

    def statistics(self, ewc: Mapping[str, Any], model: nn.Module, X: np.ndarray, y: np.ndarray,
                   tensors: Tensors, generator: Optional[torch.Generator] = None) -> Dict[str, Any]:
        """``{"F": diagonal}`` for the update when FedCurv is on (else ``{}``); remembers F and theta."""
        if not self.active(ewc) or len(y) == 0:
            return {}
        diag = fisher_diagonal(model, X, y, generator=generator)
        if not all(np.isfinite(a).all() for a in diag.values()):
            log.warning("Fisher diagonal not finite; the update goes without it")
            return {}
        self._own = (diag, {k: np.asarray(v, dtype=np.float32) for k, v in tensors.items()})
        return {"F": diag}
