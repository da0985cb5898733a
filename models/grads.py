"""Helpers for gradient statistics at a model (the Fisher trace and diagonal, FedTeddi's class
gradients): which parameters, the input as a tensor, eval mode and back, RNN backward on GPU."""
import contextlib
from typing import Dict, List, Union

import numpy as np
import torch
from torch import nn

ArrayLike = Union[torch.Tensor, np.ndarray]


def trainable_parameters(model: nn.Module) -> List[nn.Parameter]:
    """The parameters a backward pass differentiates; ValueError if there are none."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("model has no trainable parameters")
    return params


def as_input(model: nn.Module, X: ArrayLike) -> torch.Tensor:
    """``X`` as a tensor on the model's device and in its floating dtype, at least one window."""
    ref = next(model.parameters())
    xb = torch.as_tensor(X).to(device=ref.device, dtype=ref.dtype)
    if xb.dim() < 2 or xb.shape[0] < 1:
        raise ValueError("X must hold at least one window, got shape %s" % (tuple(xb.shape),))
    return xb


def eval_modes(model: nn.Module) -> Dict[nn.Module, bool]:
    """Switch to eval mode, returning each module's mode (restoring ``model.training`` alone would
    flatten a deliberately mixed train/eval setup)."""
    modes = {m: m.training for m in model.modules()}
    model.eval()
    return modes


def restore_modes(model: nn.Module, modes: Dict[nn.Module, bool]) -> None:
    """Put back each module's train/eval mode as ``eval_modes`` found it."""
    for m, training in modes.items():
        m.training = training


def rnn_backward_ok(xb: torch.Tensor):
    """cuDNN refuses an RNN backward in eval mode; fall back to the native kernels on GPU only."""
    if xb.device.type != "cuda":
        return contextlib.nullcontext()
    cudnn = torch.backends.cudnn
    return cudnn.flags(enabled=False, benchmark=cudnn.benchmark, deterministic=cudnn.deterministic,
                       allow_tf32=cudnn.allow_tf32)
