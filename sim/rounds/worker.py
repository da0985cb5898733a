"""The worker's side of a round runner: the SGD of one job on a model kept per architecture.

Worker processes and Ray actors alike keep one model per architecture, load each job's start
weights into it, train it as the device's own core would (``run_job``: the job's dropout, torch
seed and penalties) and hand back the trained weights. The device's state lives in the main
process; ``load_trained`` puts the result there.
"""
from typing import Dict, Mapping, Tuple
from weakref import WeakKeyDictionary

import numpy as np
import torch

from streamfl.agent.trainer import LocalTrainer, TrainingJob, TrainResult, run_job
from streamfl.models import ModelSpec, build_model
from streamfl.models.serialize import copy_into_state
from streamfl.models.base import HarModel

#: Each model's state dict tensors (sharing the parameters' storage), made once per model.
_STATES: "WeakKeyDictionary[torch.nn.Module, Dict[str, torch.Tensor]]" = WeakKeyDictionary()


def state_tensors(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """``model.state_dict()``, kept from one round to the next: walking the modules each time
    cost a round worker's main process more than copying the weights."""
    state = _STATES.get(model)
    if state is None:
        state = _STATES[model] = model.state_dict()
    return state


def load_arrays(model: torch.nn.Module, arrays: Mapping[str, np.ndarray]) -> None:
    """``arrays_to_model`` through the model's kept state dict (``state_tensors``)."""
    copy_into_state(state_tensors(model), arrays)


class JobRunner:
    """Trains jobs on one model per architecture (a worker holds no device's state)."""

    def __init__(self) -> None:
        self._models: Dict[str, HarModel] = {}

    def run(self, spec: ModelSpec, weights: Mapping[str, np.ndarray],
            job: TrainingJob) -> Tuple[TrainResult, HarModel]:
        """Train ``job`` from ``weights``; the result and the trained model (valid until the next job)."""
        model = self._models.get(spec.arch_id)
        if model is None:
            model = self._models[spec.arch_id] = build_model(spec)
        load_arrays(model, weights)
        trainer = LocalTrainer(model, spec.num_classes, momentum=job.momentum,
                               weight_decay=job.weight_decay)
        return run_job(model, trainer, job), model


def load_trained(trainer: LocalTrainer, job: TrainingJob, weights: Mapping[str, np.ndarray]) -> None:
    """Make the device's trainer as a round of ``job`` trained here would have left it: the trained
    weights in its model (in training mode) and the pull it applied (what a divergence report
    quotes)."""
    load_arrays(trainer.model, weights)
    trainer.model.train()
    trainer.bounded_pulls(float(job.lr))
