"""The serial round runner: every device's SGD in this process, at once (the null object)."""
from typing import Any

from streamfl.agent.trainer import LocalTrainer, TrainingJob, TrainResult, run_job
from streamfl.models import ModelSpec
from streamfl.sim.rounds.base import RoundRunner


class InlineRounds(RoundRunner):
    """Trains on submit, in the device's own model: a run with it is the serial run."""

    overlaps = False

    def _submit(self, trainer: LocalTrainer, spec: ModelSpec, job: TrainingJob) -> Any:
        return run_job(trainer.model, trainer, job)

    def _result(self, ticket: Any) -> TrainResult:
        return ticket
