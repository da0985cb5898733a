"""A quadratic pull given by its gradient: the form every EWC-like penalty here takes.

FedCurv's spatial term and ST-EWC's temporal term are both ``(1/2) sum_n a_n (theta_n - t_n)^2``
per parameter element, whose gradient is ``A theta - B`` with ``A = weight * a`` and
``B = weight * a * t``. Added to the loss, each costs an autograd graph of a few ops per tensor at
every step, which on small rounds of a recurrent model is a tenth or more of the round
(bench/bench_stewc.py). ``LocalTrainer`` instead sums every pull of a round into one ``(A, B)`` per
parameter and, after each backward, adds ``A * theta - B`` to the gradients in place: two fused
ops per tensor, the same gradient. The pull's value is not in the logged loss (it would be the
cross-entropy plus a constant-shifted penalty; the round's loss stays the data's).
"""
from typing import Dict, Iterable, Mapping, Tuple

import torch
from torch import nn

#: Curvature below this counts as none: a pull's target ``B / A`` there would be noise.
MIN_CURVATURE = 1e-12

#: ``{parameter name: (A, B)}``: the gradient ``A * theta - B`` of a pull.
Coefficients = Dict[str, Tuple[torch.Tensor, torch.Tensor]]


class QuadraticPull:
    """``(1/2) sum A (theta - B/A)^2`` over named parameters, kept as its gradient's ``(A, B)``."""

    def __init__(self, coefficients: Mapping[str, Tuple[torch.Tensor, torch.Tensor]]):
        self.coefficients: Coefficients = dict(coefficients)

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
    def merge(pulls: Iterable["QuadraticPull"], model: nn.Module) -> Dict[torch.nn.Parameter, Tuple[torch.Tensor, torch.Tensor]]:
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
