"""A quadratic pull given by its gradient: the form every EWC-like penalty here takes.

FedCurv's spatial term and ST-EWC's temporal term are both ``(1/2) sum_n a_n (theta_n - t_n)^2``
per parameter element, whose gradient is ``A theta - B`` with ``A = weight * a`` and
``B = weight * a * t``. Added to the loss, each costs an autograd graph of a few ops per tensor at
every step, which on small rounds of a recurrent model is a tenth or more of the round
(bench/bench_stewc.py). ``LocalTrainer`` instead sums every pull of a round into one ``(A, B)`` per
parameter and, after each backward, adds ``A * theta - B`` to the gradients in place: two fused
ops per tensor, the same gradient. The pull's value is not in the logged loss (it would be the
cross-entropy plus a constant-shifted penalty; the round's loss stays the data's).

Stability (the agent bounds what it applies). SGD on a quadratic of curvature ``c`` multiplies the
distance to its target by ``1 - lr * c`` each step, so it overshoots for ``lr * c > 1`` and
diverges for ``lr * c > 2``; a global model whose sums are extreme (a forged Fisher diagonal of
1e30 made every honest agent's rounds NaN) would otherwise set ``c`` from outside the board. Two
layers bound it, each keeping the target ``B / A`` where it caps ``A`` (``B`` scaled by the same
factor): each method's plug-in caps its own pull at ``stability / lr`` (its ``stability``
setting, ST-EWC's and FedCurv's 1.0: at most a full step back to the target, never past it),
with the lr it was told by the global model; and ``LocalTrainer`` caps the merged pull at the
strictest of the active pulls' ``stability`` over the round's own lr (``bound``). The second layer
is the one that holds whatever arrives: two pulls each under their bound sum to twice it, and the
round's lr may differ from the model's (an ``override`` command, the board's ``hparam_limits``,
another plug-in's refinement). Where no cap binds, ``A`` and ``B`` are the plug-ins' exactly.
A pull that is not finite anywhere (a sum that overflowed float32) is dropped for the round.
"""
import logging
from typing import Dict, Iterable, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

log = logging.getLogger(__name__)

#: Curvature below this counts as none: a pull's target ``B / A`` there would be noise.
MIN_CURVATURE = 1e-12

#: ``{parameter name: (A, B)}``: the gradient ``A * theta - B`` of a pull.
Coefficients = Dict[str, Tuple[torch.Tensor, torch.Tensor]]

#: ``{parameter: (A, B)}``: pulls merged for a model (``QuadraticPull.merge``).
Merged = Dict[torch.nn.Parameter, Tuple[torch.Tensor, torch.Tensor]]

#: The bound on ``lr * A`` of a pull that declares none: at most a full step back to the target.
DEFAULT_STABILITY = 1.0


class QuadraticPull:
    """``(1/2) sum A (theta - B/A)^2`` over named parameters, kept as its gradient's ``(A, B)``."""

    def __init__(self, coefficients: Mapping[str, Tuple[torch.Tensor, torch.Tensor]],
                 stability: float = DEFAULT_STABILITY):
        self.coefficients: Coefficients = dict(coefficients)
        #: The most ``lr * A`` the trainer lets this pull (merged with others) apply.
        self.stability = float(stability)

    def __call__(self, model: nn.Module) -> torch.Tensor:
        """Its value ``(1/2) sum A (theta - B/A)^2`` at ``model`` (>= 0; zero where A is),
        differentiable: for tests and for callers that only know loss terms."""
        params = dict(model.named_parameters())
        total = torch.zeros(())
        for name, (A, B) in self.coefficients.items():
            target = torch.where(A > 0, B / torch.where(A > 0, A, torch.ones_like(A)), torch.zeros_like(B))
            total = total + 0.5 * (A * (params[name] - target).pow(2)).sum()
        return total

    @staticmethod
    def merge(pulls: Iterable["QuadraticPull"], model: nn.Module) -> Merged:
        """One ``(A, B)`` per parameter of ``model``, summed over ``pulls``."""
        params = dict(model.named_parameters())
        out: Dict[str, Tuple[torch.Tensor, torch.Tensor]] = {}
        for pull in pulls:
            for name, (A, B) in pull.coefficients.items():
                if name in out:
                    out[name] = (out[name][0] + A, out[name][1] + B)
                else:
                    out[name] = (A, B)
        return {params[name]: ab for name, ab in out.items() if name in params}

    @staticmethod
    @torch.no_grad()
    def add_gradients(merged: Mapping[torch.nn.Parameter, Tuple[torch.Tensor, torch.Tensor]]) -> None:
        """``p.grad += A * p - B`` for each merged parameter (after the loss's backward)."""
        for p, (A, B) in merged.items():
            if p.grad is None:
                p.grad = A * p - B
            else:
                p.grad.addcmul_(A, p).sub_(B)

    def largest_curvature(self) -> float:
        """The largest element of ``A`` over the pull (0 when empty; NaN or inf if not finite)."""
        return largest_curvature(self.coefficients.values())


def largest_curvature(pairs: Iterable[Tuple[torch.Tensor, torch.Tensor]]) -> float:
    """The largest ``A`` element over ``(A, B)`` pairs: NaN if any is NaN, 0.0 for none."""
    out = 0.0
    for A, _ in pairs:
        if A.numel():
            m = float(A.max())  # NaN if any element is
            if m != m:
                return m
            out = max(out, m)
    return out


def stability_of(pulls: Sequence[QuadraticPull]) -> float:
    """The strictest ``stability`` the pulls declare (``DEFAULT_STABILITY`` for none)."""
    return min((p.stability for p in pulls), default=DEFAULT_STABILITY)


@torch.no_grad()
def bound(merged: Merged, lr: float, stability: float) -> Tuple[Optional[Merged], int]:
    """``merged`` with each ``A`` element capped at ``stability / lr`` and ``B`` scaled by the same
    factor there (the target ``B / A`` kept), and how many elements were capped; ``(None, 0)`` if
    any ``A`` or ``B`` is not finite (the pull is dropped). Untouched tensors are returned as given."""
    cap = stability / lr if lr > 0 else float("inf")
    out: Merged = {}
    capped = 0
    for p, (A, B) in merged.items():
        if not (bool(torch.isfinite(A).all()) and bool(torch.isfinite(B).all())):
            return None, 0
        over = A > cap
        n = int(over.sum())
        if n:
            capped += n
            B = torch.where(over, B * (cap / A), B)
            A = A.clamp(max=cap)
        out[p] = (A, B)
    return out, capped
