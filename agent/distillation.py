"""A loss term that keeps a round's predictions near a fixed teacher model's on the same windows.

Knowledge distillation (Hinton et al.): ``weight * T^2 * KL(softmax(teacher(x) / T) ||
softmax(model(x) / T))`` on each minibatch, the teacher in eval mode and without gradients. It is
what the session paper's Continuous baseline uses to carry a session's knowledge into the next
(its class-semantic relation distillation anchors the current model to the previous session's):
the class relations the teacher's soft predictions hold are kept while the labels of the new data
are learned. Unlike the quadratic pulls (``agent/quadratic.py``) it needs the batch, so
``LocalTrainer`` hands it the windows and the logits it already computed (``on_batch``).

It travels with a round to the simulator's round workers: only the teacher's arrays are pickled;
the teacher's module is rebuilt, once per process, from the model it is first called with.
"""
import copy
import logging
from typing import Any, Dict, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)


class Distillation:
    """``weight * T^2 * KL(teacher || model)`` at temperature ``T`` on the round's batches."""

    def __init__(self, teacher: Dict[str, np.ndarray], weight: float, temperature: float):
        if not weight >= 0.0 or not temperature > 0.0:
            raise ValueError("distillation needs weight >= 0 and temperature > 0, got %r and %r"
                             % (weight, temperature))
        self.teacher = teacher
        self.weight = float(weight)
        self.temperature = float(temperature)
        self._module: Optional[nn.Module] = None

    def on_batch(self, model: nn.Module, xb: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The term for one minibatch ``xb`` whose logits under ``model`` are ``logits``."""
        with torch.no_grad():
            target = F.softmax(self._teacher_like(model)(xb) / self.temperature, dim=1)
        log_p = F.log_softmax(logits / self.temperature, dim=1)
        kl = F.kl_div(log_p, target, reduction="batchmean")
        return (self.weight * self.temperature ** 2) * kl

    def _teacher_like(self, model: nn.Module) -> nn.Module:
        """The teacher as a module of ``model``'s architecture (built on the first call)."""
        if self._module is None:
            from streamfl.models import arrays_to_model
            module = copy.deepcopy(model)
            arrays_to_model(module, self.teacher)
            module.eval()
            for p in module.parameters():
                p.requires_grad_(False)
            self._module = module
        return self._module

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_module"] = None  # rebuilt where it is used
        return state


__all__ = ["Distillation"]
