"""Per-class gradient norms, gradient variance and norm of a classifier on a few labelled windows:
the statistics FedTeddi's scheduler weighs classes and devices with (eq. 18, Alg. 1 lines 5-11).

Each window goes through one backward pass (two per class present, over its halves), at the given
model in eval mode (dropout off), through ``torch.autograd.grad``, so ``.grad`` and optimizer state are
untouched and every module's mode is restored.
"""
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as nnf

from streamfl.models.grads import (
    ArrayLike, as_input, eval_modes, restore_modes, rnn_backward_ok, trainable_parameters,
)


@dataclass(frozen=True)
class GradientStats:
    """``class_norms`` [K]: ||grad of the mean loss over the class's windows|| (0: class absent);
    ``variance``: per-sample gradient variance sigma^2 (None with fewer than 2 windows);
    ``norm``: ||grad of the mean loss over all the windows||."""

    class_norms: Tuple[float, ...]
    variance: Optional[float]
    norm: float


def _flat_grad(model: nn.Module, params: List[nn.Parameter], xb: torch.Tensor,
               yb: torch.Tensor) -> torch.Tensor:
    loss = nnf.cross_entropy(model(xb), yb)
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).detach().reshape(-1).double()
                      for g, p in zip(grads, params)])


def gradient_stats(model: nn.Module, X: ArrayLike, y: np.ndarray, num_classes: int) -> GradientStats:
    """The statistics on windows ``X`` [N, T, C] with labels ``y`` [N], each window in one backward
    pass: two per class, over the two halves of its windows.

    A class's gradient is its halves' sample-weighted mean, the overall gradient the classes'
    (the mean loss is the same sum of class means). The variance is the split-half estimate over
    the class-stratified halves A and B: E||g_A - g_B||^2 = sigma^2 (1/n_A + 1/n_B), so
    sigma^2 = ||g_A - g_B||^2 / (1/n_A + 1/n_B); stratified, it is the within-class gradient noise
    (the spread a minibatch of the same class mix has), not the spread between classes, which the
    class norms already carry.
    """
    params = trainable_parameters(model)
    xb = as_input(model, X)
    yb = torch.as_tensor(np.asarray(y, dtype=np.int64), device=xb.device)
    n = int(yb.shape[0])
    if n == 0:
        raise ValueError("gradient_stats needs at least one window")
    if int(yb.min()) < 0 or int(yb.max()) >= num_classes:
        raise ValueError("labels outside 0..%d" % (num_classes - 1))
    modes = eval_modes(model)
    try:
        with torch.enable_grad(), rnn_backward_ok(xb):
            norms = np.zeros(num_classes)
            halves: List[Optional[torch.Tensor]] = [None, None]
            sizes = [0, 0]
            total = None
            for c in torch.unique(yb).tolist():
                idx = torch.nonzero(yb == c).reshape(-1)
                parts = (idx[:(len(idx) + 1) // 2], idx[(len(idx) + 1) // 2:])
                g_c = None
                for h, part in enumerate(parts):
                    if len(part) == 0:
                        continue
                    g = _flat_grad(model, params, xb[part], yb[part]) * len(part)
                    g_c = g if g_c is None else g_c + g
                    halves[h] = g if halves[h] is None else halves[h] + g
                    sizes[h] += len(part)
                norms[c] = float(g_c.norm()) / len(idx)
                total = g_c if total is None else total + g_c
            variance = None
            if sizes[1] > 0:
                diff = halves[0] / sizes[0] - halves[1] / sizes[1]
                variance = float(diff.pow(2).sum() / (1.0 / sizes[0] + 1.0 / sizes[1]))
        return GradientStats(tuple(float(v) for v in norms), variance, float(total.norm()) / n)
    finally:
        restore_modes(model, modes)
