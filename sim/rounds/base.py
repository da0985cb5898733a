"""Where a simulated device's SGD runs: the one abstraction of the round runners.

The runtime (``SimRun``) plans a device's round on the device's own ``AgentCore`` in the main
process (minibatches drawn, penalties built: ``AgentCore.plan_training``), hands its SGD to a
``RoundRunner`` and finishes the round with what comes back (``AgentCore.finish_training``).
``InlineRounds`` trains at once, in this process: the serial run. The others train elsewhere
(worker processes over shared memory, Ray actors) while the runtime goes on with the events that
cannot depend on the round (``overlaps``); ``result`` then loads the trained weights back into
the device's model, so the device's state is the serial run's, bit for bit.
"""
from abc import ABC, abstractmethod
from typing import Any

from streamfl.agent.trainer import LocalTrainer, TrainingJob, TrainResult
from streamfl.models import ModelSpec


class RoundRunner(ABC):
    """Runs ``TrainingJob``s of simulated devices; ``submit`` then ``result`` once per job.

    It counts the jobs it ran and those submitted while another one's result was still to be
    collected (``overlapped``): in a run, the rounds that went side by side (the runtime collects
    an ``InlineRounds`` result at once, so none there)."""

    #: True when ``submit`` returns before the SGD is done (the runtime may go on meanwhile).
    overlaps = False

    def __init__(self) -> None:
        self.jobs = 0
        self.overlapped = 0
        self._unfinished = 0

    def submit(self, trainer: LocalTrainer, spec: ModelSpec, job: TrainingJob) -> Any:
        """Start ``job`` on the model ``trainer`` steps (of architecture ``spec``, at the round's
        start weights); a ticket for ``result``. The model is left alone until ``result``."""
        self.jobs += 1
        self.overlapped += self._unfinished > 0
        self._unfinished += 1
        return self._submit(trainer, spec, job)

    def result(self, ticket: Any) -> TrainResult:
        """The ``TrainResult`` of the job behind ``ticket``, its trained weights loaded into the
        model it was submitted with; waits for it. Raises ``StreamflError`` if the job failed
        or its worker died."""
        self._unfinished -= 1
        return self._result(ticket)

    @abstractmethod
    def _submit(self, trainer: LocalTrainer, spec: ModelSpec, job: TrainingJob) -> Any:
        """``submit`` without the counting."""

    @abstractmethod
    def _result(self, ticket: Any) -> TrainResult:
        """``result`` without the counting."""

    def poll(self) -> None:
        """Collect finished jobs and start queued ones, without waiting (the runtime calls it
        between events, so that workers do not idle while it works)."""

    def close(self) -> None:
        """Stop the workers (if any) and free what they hold; idempotent."""

    def __enter__(self) -> "RoundRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
