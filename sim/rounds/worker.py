"""The worker's side of a round runner: the SGD of one job on a model kept per architecture.

Worker processes and Ray actors alike keep one model per architecture, load each job's start
weights into it, train it as the device's own core would (``run_job``: the job's dropout, torch
seed and penalties) and hand back the trained weights. The device's state lives in the main
process; ``load_trained`` puts the result there.
"""
from typing import Dict, Mapping, Tuple

import numpy as np

from streamfl.agent.trainer import LocalTrainer, TrainingJob, TrainResult, run_job
from streamfl.models import ModelSpec, arrays_to_model, build_model
from streamfl.models.base import HarModel


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
        arrays_to_model(model, weights)
        trainer = LocalTrainer(model, spec.num_classes, momentum=job.momentum,
                               weight_decay=job.weight_decay)
        return run_job(model, trainer, job), model


def load_trained(trainer: LocalTrainer, job: TrainingJob, weights: Mapping[str, np.ndarray]) -> None:
    """Make the device's trainer as a round of ``job`` trained here would have left it: the trained
    weights in its model (in training mode) and the pull it applied (what a divergence report
    quotes)."""
    arrays_to_model(trainer.model, weights)
    trainer.model.train()
    trainer.bounded_pulls(float(job.lr))
