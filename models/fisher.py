"""Trace of the Fisher information of a classifier: AdaCLP's plasticity signal (AdaCLP paper, eq. 1).

``F = E_x E_{yhat ~ p_w(.|x)} ||grad_w log p_w(yhat|x)||^2``, labels sampled from the model, not the
true ones (AdaCLP paper, eq. 1). ``fisher_trace`` estimates it with one forward and one backward
pass; ``fisher_trace_exact`` enumerates every sample and class (slow; for tests and small models).
``fisher_diagonal`` is the per-parameter diagonal FedCurv and ST-EWC weigh their penalties with.
"""
from typing import Dict, Optional

import numpy as np
import torch
from torch import nn

from streamfl.models.grads import (
    ArrayLike, as_input, eval_modes, restore_modes, rnn_backward_ok, trainable_parameters,
)


def fisher_trace(model: nn.Module, X: ArrayLike, num_samples: Optional[int] = None,
                 generator: Optional[torch.Generator] = None) -> float:
    """Unbiased one-backward estimate of the Fisher trace (AdaCLP eq. 1) on windows ``X`` [N, T, C].

    Why: the per-sample form needs B backward passes (the paper reports 32-40% training overhead,
    sec. 5.4.5); the squared norm of the SUMMED score of B samples needs one.
    Unbiased: with s_i = grad log p(yhat_i|x_i), yhat_i ~ p_w(.|x_i) drawn independently,
    E||sum_i s_i||^2 = sum_i E||s_i||^2 + sum_{i!=j} E[s_i].E[s_j] and E_yhat[s_i] = 0: / B gives F.
    The price is variance: higher than the per-sample average mean_i ||s_i||^2 (for the default LSTM
    about 50% vs 1.4% relative std at B = 50, bench/bench_fisher.py), and it barely shrinks with B,
    so smooth it over rounds (eq. 2 does) rather than trusting one value.

    ``num_samples`` draws that many windows without replacement (None: all of them; still unbiased
    for the trace over all of ``X``). The model runs in eval mode (dropout off) and every module's
    mode is restored afterwards; gradients come from ``torch.autograd.grad``, so parameters'
    ``.grad`` and any optimizer state are left exactly as they were. The same ``generator`` state
    gives the same value.
    """
    params = trainable_parameters(model)
    xb = as_input(model, X)
    n = xb.shape[0]
    if num_samples is not None:
        if int(num_samples) < 1:
            raise ValueError("num_samples must be at least 1, got %r" % (num_samples,))
        if int(num_samples) < n:
            idx = torch.randperm(n, generator=generator)[:int(num_samples)]
            xb = xb[idx.to(xb.device)]
    batch = xb.shape[0]
    modes = eval_modes(model)
    try:
        with torch.enable_grad(), rnn_backward_ok(xb):
            log_p = torch.log_softmax(model(xb), dim=1)
            probs = log_p.detach().exp().to("cpu", torch.float64)
            yhat = torch.multinomial(probs, 1, generator=generator).to(xb.device)
            total = log_p.gather(1, yhat).sum()
            grads = torch.autograd.grad(total, params, allow_unused=True)
        return float(_sq_norm(grads)) / batch
    finally:
        restore_modes(model, modes)


def fisher_trace_exact(model: nn.Module, X: ArrayLike) -> float:
    """Exact ``mean_x sum_y p(y|x) ||grad log p(y|x)||^2`` (eq. 1) by N x K backward passes.

    The reference ``fisher_trace`` is tested against; far too slow for a device's round.
    """
    params = trainable_parameters(model)
    xb = as_input(model, X)
    modes = eval_modes(model)
    total = 0.0
    try:
        with torch.enable_grad(), rnn_backward_ok(xb):
            for i in range(xb.shape[0]):
                log_p = torch.log_softmax(model(xb[i:i + 1]), dim=1)[0]
                probs = log_p.detach().exp()
                for c in range(log_p.shape[0]):
                    grads = torch.autograd.grad(log_p[c], params, retain_graph=True,
                                                allow_unused=True)
                    total += float(probs[c]) * float(_sq_norm(grads))
    finally:
        restore_modes(model, modes)
    return total / xb.shape[0]


def fisher_diagonal(model: nn.Module, X: ArrayLike, y: ArrayLike, num_samples: Optional[int] = None,
                    generator: Optional[torch.Generator] = None) -> Dict[str, np.ndarray]:
    """Diagonal Fisher ``mean_i (grad_w log p_w(y_i|x_i))^2`` per state-dict tensor (float32 arrays).

    Why this form: FedCurv (Shoham et al. 2019) and ST-EWC (ST-EWC paper, eq. 8 and 12) weigh each
    parameter's pull towards a peer's value by its Fisher diagonal; the empirical Fisher at the
    device's true labels is what both use, since the penalty should protect what the device's own
    data taught. Per-sample squares need one backward per window (the square of a summed gradient
    would mix samples), so ``num_samples`` windows are drawn without replacement (None: all); the
    model runs in eval mode, modes and ``.grad`` are left as they were.
    """
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    params = trainable_parameters(model)
    xb = as_input(model, X)
    yb = torch.as_tensor(np.asarray(y), dtype=torch.int64).to(xb.device)
    if yb.shape[0] != xb.shape[0]:
        raise ValueError("X has %d windows but y %d labels" % (xb.shape[0], yb.shape[0]))
    if num_samples is not None and int(num_samples) < xb.shape[0]:
        if int(num_samples) < 1:
            raise ValueError("num_samples must be at least 1, got %r" % (num_samples,))
        idx = torch.randperm(xb.shape[0], generator=generator)[:int(num_samples)].to(xb.device)
        xb, yb = xb[idx], yb[idx]
    sums = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    modes = eval_modes(model)
    try:
        with torch.enable_grad(), rnn_backward_ok(xb):
            for i in range(xb.shape[0]):
                log_p = torch.log_softmax(model(xb[i:i + 1]), dim=1)[0, yb[i]]
                for acc, g in zip(sums, torch.autograd.grad(log_p, params, allow_unused=True)):
                    if g is not None:
                        acc += g.detach().double().pow(2)
    finally:
        restore_modes(model, modes)
    n = float(xb.shape[0])
    out = {name: (acc / n).to("cpu", torch.float32).numpy() for name, acc in zip(names, sums)}
    # Frozen tensors get a zero diagonal, so the result always covers the whole state dict.
    for name, t in model.state_dict().items():
        out.setdefault(name, np.zeros(tuple(t.shape), dtype=np.float32))
    return out


def _sq_norm(grads) -> torch.Tensor:
    return sum(g.detach().double().pow(2).sum() for g in grads if g is not None)
