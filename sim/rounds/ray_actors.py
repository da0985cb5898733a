"""Round workers as Ray actors: one run's device rounds spread over a Ray cluster.

Each actor keeps one model per architecture (``JobRunner``), as a worker process does; a job's
start weights and minibatches go through Ray's object store (shared memory on a node), the
trained weights come back the same way and the main process loads them into the device's model.
The main process (the run's event loop, its coordinator and evaluation) stays where ``streamfl
sim`` runs; ``ray.init`` joins the cluster at ``address`` (None: ``RAY_ADDRESS``, else a local
instance), and every node needs the same streamfl installed. Actors that cannot be placed (a
cluster without ``workers`` free CPUs) end the run with an error after ``start_timeout_s``
rather than leave it waiting; an actor that dies ends it with an error too.
"""
import itertools
import logging
from dataclasses import replace
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from streamfl.agent.trainer import LocalTrainer, TrainingJob, TrainResult
from streamfl.errors import ConfigError, StreamflError
from streamfl.models import ModelSpec, model_to_arrays
from streamfl.sim.rounds.base import RoundRunner
from streamfl.sim.rounds.worker import JobRunner, load_trained

log = logging.getLogger(__name__)

#: What to install for ``--executor ray`` (the grid's Ray tasks say it too).
RAY_HINT = "--executor ray needs the package ray: pip install 'streamfl[ray]'"

#: Seconds the actors get to start before the run gives up on the cluster.
START_TIMEOUT_S = 120.0


class RoundActor:
    """A Ray actor that trains jobs (``ray.remote`` wraps it where it is used)."""

    def __init__(self) -> None:
        import torch
        torch.set_num_threads(1)
        self._runner = JobRunner()

    def ready(self) -> bool:
        return True

    def train(self, spec: ModelSpec, weights: Dict[str, np.ndarray], job: TrainingJob,
              torch_threads: int) -> Tuple[TrainResult, Dict[str, np.ndarray]]:
        """The job's result and trained weights (arrays from the object store are read-only:
        the minibatches are copied once, as torch wants writable arrays)."""
        import torch
        if torch.get_num_threads() != torch_threads:
            torch.set_num_threads(torch_threads)
        job = replace(job, batches=[(np.array(X), np.array(y)) for X, y in job.batches])
        result, model = self._runner.run(spec, weights, job)  # loading copies the weights
        return result, model_to_arrays(model)


class RayRounds(RoundRunner):
    """``workers`` Ray actors of one CPU each that train the jobs of one run (or of several)."""

    overlaps = True

    def __init__(self, workers: int, address: Optional[str] = None,
                 start_timeout_s: float = START_TIMEOUT_S):
        super().__init__()
        try:
            import ray
        except ImportError:
            raise ConfigError(RAY_HINT) from None
        self._ray = ray
        self._started_here = not ray.is_initialized()
        if self._started_here:
            ray.init(address=address, log_to_driver=False)
        actor = ray.remote(num_cpus=1)(RoundActor)
        self._actors = [actor.remote() for _ in range(workers)]
        self._load = [0] * workers
        self._jobs: Dict[int, Tuple[LocalTrainer, TrainingJob, Any, int]] = {}
        self._tickets = itertools.count()
        self._closed = False
        try:
            ray.get([a.ready.remote() for a in self._actors], timeout=start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.close()
            raise StreamflError("the Ray cluster placed none or only some of %d round actors of one "
                                "CPU each in %.0f s: give it more CPUs or ask for fewer --workers"
                                % (workers, start_timeout_s)) from None

    def _submit(self, trainer: LocalTrainer, spec: ModelSpec, job: TrainingJob) -> int:
        import torch
        k = min(range(len(self._actors)), key=self._load.__getitem__)
        sent = replace(job, batches=list(job.batches))
        ref = self._actors[k].train.remote(spec, model_to_arrays(trainer.model), sent,
                                           torch.get_num_threads())
        ticket = next(self._tickets)
        self._jobs[ticket] = (trainer, sent, ref, k)
        self._load[k] += 1
        return ticket

    def _result(self, ticket: int) -> TrainResult:
        trainer, job, ref, k = self._jobs.pop(ticket)
        self._load[k] -= 1
        try:
            result, weights = self._ray.get(ref)
        except self._ray.exceptions.RayError as exc:
            self.close()
            raise StreamflError("round actor %d failed: %s: %s" % (k, type(exc).__name__, exc)) from exc
        load_trained(trainer, job, weights)
        return result

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for actor in self._actors:
            self._ray.kill(actor)
        self._actors = []
        if self._started_here:
            self._ray.shutdown()


__all__: List[str] = ["RAY_HINT", "RayRounds", "RoundActor"]
