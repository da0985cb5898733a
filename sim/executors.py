"""Where the runs of a ``streamfl sim`` grid execute: one after another, worker processes or Ray.

``run_one`` is one (seed, method) run, the same in the serial loop and in a worker. Runs are
independent: a worker makes the scenario's data itself (or gets the dataset the caller passed),
writes the run's events into a string of JSON lines and returns it with the run's figures.
``Executor.run`` hands the results back in the grid's order (seed-major, then method), whatever
order the runs finish in, so the driver writes ``metrics.jsonl`` and ``summary.json`` exactly as
the serial loop does. Ray is an optional extra (``pip install 'streamfl[ray]'``).
"""
import io
import json
import logging
import multiprocessing
import os
import time
import uuid
from abc import ABC, abstractmethod
from contextlib import closing
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from streamfl.errors import ConfigError, StreamflError
from streamfl.sim.methods import Method
from streamfl.sim.parent_watch import exit_with_parent
from streamfl.sim.rounds import RoundRunner, make_rounds
from streamfl.sim.rounds.ray_actors import RAY_HINT
from streamfl.sim.runtime import SimRun
from streamfl.sim.scenario import Scenario
from streamfl.sim.scenario_data import SimData
from streamfl.sim.summary import run_figures

log = logging.getLogger(__name__)

Pair = Tuple[int, Method]
#: A finished run: its metrics lines, then its figures.
Result = Tuple[str, Dict[str, Any]]
#: What a run hands back: its result, or the error that ended it (naming the method and seed).
Outcome = Union[Result, StreamflError]
EXECUTORS = ("local", "ray")

#: A worker process's data, made once per grid and kept for its next runs.
_WORKER: Dict[str, Any] = {}


def run_one(scenario: Scenario, method: Method, seed: int, data: SimData, write: Callable[[str], Any],
            progress: Optional[Callable[[float], None]] = None,
            rounds: Optional[RoundRunner] = None) -> Dict[str, Any]:
    """One (seed, method) run, serial or in a worker: every event to ``write`` as a JSON line;
    returns the run's figures. ``rounds``: where its devices' SGD runs (None: in this process)."""
    kept: Dict[str, List[Dict[str, Any]]] = {"eval": [], "update": [], "aggregate": []}

    def emit(event: Dict[str, Any]) -> None:
        """Keep what the figures need; every event becomes one line."""
        if event["event"] in kept:
            kept[event["event"]].append(event)
        write(json.dumps(event, separators=(",", ":")) + "\n")

    started = time.monotonic()
    run = SimRun(scenario, method, seed, data, emit, progress, rounds)
    totals = run.run()
    figures = run_figures(kept["eval"], kept["update"], totals, scenario.thresholds,
                          scenario.eval_every_s, kept["aggregate"])
    figures.update(seed=seed, wall_s=round(time.monotonic() - started, 2), devices=totals)
    if run.pretrain_accuracy is not None:
        figures["pretrain_accuracy"] = round(run.pretrain_accuracy, 4)
    return figures


def scenario_dataset(scenario: Scenario) -> Any:
    """The scenario's own dataset, as every run of it (here or in a worker) loads it."""
    from streamfl.sim.datasets import load_dataset
    dc = scenario.data
    return load_dataset(dc.dataset, seed=0, path=dc.path, n_windows=dc.n_windows)


def make_executor(name: str, jobs: Optional[int], ray_address: Optional[str] = None,
                  workers: Optional[int] = None) -> Optional["Executor"]:
    """The executor ``--executor``/``--jobs``/``--ray-address`` name (None: serial, in this process),
    its runs each with ``workers`` round workers of their own (``--workers``); ConfigError for a
    wrong choice, before any run starts."""
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ConfigError("--jobs must be a whole number of at least 1, got %r" % (jobs,))
    if name == "local":
        if ray_address is not None:
            raise ConfigError("--ray-address needs --executor ray")
        return LocalExecutor(jobs, workers) if jobs is not None and jobs > 1 else None
    if name == "ray":
        return RayExecutor(jobs, ray_address, workers)
    raise ConfigError("unknown executor %r (choose one of %s)" % (name, ", ".join(EXECUTORS)))


def run_failed(seed: int, method: Method, exc: BaseException) -> StreamflError:
    """The parent's error for a run that failed in a worker, naming the method and the seed."""
    message = "run of method %s, seed %d failed: %s: %s" % (method.name, seed, type(exc).__name__, exc)
    if isinstance(exc, BrokenProcessPool):
        message += (" (its worker process died: out of memory, or a script that calls run_sim "
                    "without an if __name__ == '__main__' guard)")
    error = ConfigError(message) if isinstance(exc, ConfigError) else StreamflError(message)
    error.__cause__ = exc
    return error


def _worker_data(grid_id: str, scenario: Scenario, dataset: Any) -> SimData:
    """This process's ``SimData`` for the grid ``grid_id``, built on its first run."""
    if _WORKER.get("grid_id") != grid_id:
        _WORKER.pop("data", None)
        _WORKER.update(grid_id=grid_id, data=SimData(scenario, dataset if dataset is not None
                                                     else scenario_dataset(scenario)))
    return _WORKER["data"]


def _one_thread() -> None:
    """Torch on one thread per worker: N workers share the machine's cores."""
    import torch
    torch.set_num_threads(1)


def _run_pair(grid_id: str, scenario: Scenario, dataset: Any, seed: int, method: Method,
              workers: Optional[int] = None, executor: str = "local") -> Result:
    """One run in a worker: its metrics lines as text, and its figures. ``workers``: round
    workers of its own (made on the process's first run and kept for its next)."""
    _one_thread()
    lines = io.StringIO()
    rounds = None
    if workers is not None:
        if _WORKER.get("rounds_of") != (workers, executor):
            if _WORKER.get("rounds") is not None:
                _WORKER["rounds"].close()
            _WORKER.update(rounds=make_rounds(workers, executor), rounds_of=(workers, executor))
        rounds = _WORKER["rounds"]
    figures = run_one(scenario, method, seed, _worker_data(grid_id, scenario, dataset), lines.write,
                      rounds=rounds)
    return lines.getvalue(), figures


class Executor(ABC):
    """Runs a grid's (seed, method) pairs elsewhere and returns their results in the grid's order."""

    def run(self, scenario: Scenario, dataset: Any, grid: Sequence[Pair],
            finished: Callable[[int, Method], None], keep_going: bool = False) -> Iterator[Outcome]:
        """Every pair's outcome in ``grid`` order; ``finished(seed, method)`` as each run ends.

        A failed run raises its error at once (the generator's caller closes it, which stops the
        other runs), or with ``keep_going`` takes its place in the order and the grid goes on."""
        waiting: Dict[int, Outcome] = {}
        next_index = 0
        with closing(self.unordered(scenario, dataset, grid)) as outcomes:
            for index, result in outcomes:
                if isinstance(result, StreamflError) and not keep_going:
                    raise result
                finished(*grid[index])
                waiting[index] = result
                while next_index in waiting:
                    yield waiting.pop(next_index)
                    next_index += 1

    @abstractmethod
    def unordered(self, scenario: Scenario, dataset: Any,
                  grid: Sequence[Pair]) -> Iterator[Tuple[int, Outcome]]:
        """(index in ``grid``, outcome) of each run as it ends, a failure as its ``run_failed``
        error; stops every run still going when the caller leaves."""


def _init_local_worker(log_level: int, parent_pid: int) -> None:
    """A fresh spawned worker: one torch thread, the parent's streamfl log level, and an exit when
    the parent dies."""
    from streamfl.logs import LEVELS, setup_logging
    exit_with_parent(parent_pid)
    name = logging.getLevelName(log_level)
    setup_logging(name if name in LEVELS else "WARNING")
    _one_thread()


class LocalExecutor(Executor):
    """``jobs`` spawned worker processes on this machine, one run at a time each."""

    def __init__(self, jobs: int, workers: Optional[int] = None):
        """``jobs`` worker processes at most (fewer when the grid is smaller), each run with
        ``workers`` round worker processes of its own (None: none)."""
        self.jobs = jobs
        self.workers = workers

    def unordered(self, scenario: Scenario, dataset: Any,
                  grid: Sequence[Pair]) -> Iterator[Tuple[int, Outcome]]:
        """Submit the whole grid; on an early exit, end the workers at once."""
        grid_id = uuid.uuid4().hex
        level = logging.getLogger("streamfl").getEffectiveLevel()
        pool = ProcessPoolExecutor(max_workers=min(self.jobs, len(grid)),
                                   mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_init_local_worker, initargs=(level, os.getpid()))
        futures: Dict[Future, int] = {}
        try:
            for index, (seed, method) in enumerate(grid):
                futures[pool.submit(_run_pair, grid_id, scenario, dataset, seed, method,
                                     self.workers, "local")] = index
            pending = set(futures)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=futures.__getitem__):
                    index = futures[future]
                    exc = future.exception()
                    yield index, (run_failed(*grid[index], exc) if exc is not None
                                  else future.result())
        finally:
            _stop(pool, futures)


def _stop(pool: ProcessPoolExecutor, futures: Dict[Future, int]) -> None:
    """Cancel the queued runs, end the running ones now and reap every worker (no zombies)."""
    unfinished = [f for f in futures if not f.done()]
    for future in unfinished:
        future.cancel()
    if any(not f.done() for f in unfinished):
        # A failed or interrupted grid does not wait for the runs still going: end their workers.
        workers = list((getattr(pool, "_processes", None) or {}).values())
        log.info("stopping %d worker process(es) of the grid", len(workers))
        for process in workers:
            process.terminate()
        for process in workers:
            process.join()
    pool.shutdown(wait=True)


class RayExecutor(Executor):
    """The grid as Ray tasks, one CPU each, on a local Ray instance or the cluster at ``address``.

    At most ``jobs`` runs are in flight (None: as many as Ray schedules). The workers import
    streamfl, so a remote cluster needs the same streamfl installed on every node.
    """

    def __init__(self, jobs: Optional[int], address: Optional[str] = None,
                 workers: Optional[int] = None):
        """Fails here, before any run starts, when ray is not installed. ``workers``: Ray actors
        of each run's own that train its rounds (None: the task trains them itself)."""
        try:
            import ray  # noqa: F401  (an optional extra; checked before any run starts)
        except ImportError:
            raise ConfigError(RAY_HINT) from None
        self.jobs = jobs
        self.address = address
        self.workers = workers

    def unordered(self, scenario: Scenario, dataset: Any,
                  grid: Sequence[Pair]) -> Iterator[Tuple[int, Outcome]]:
        """Keep up to ``jobs`` tasks in flight; on an early exit, cancel the rest."""
        import ray
        started_here = not ray.is_initialized()
        if started_here:
            # address None starts a local instance (or joins the one RAY_ADDRESS names); a Ray
            # this process has already started is used as it is.
            ray.init(address=self.address)
        task = ray.remote(num_cpus=1)(_run_pair)
        grid_id = uuid.uuid4().hex
        data_ref = ray.put(dataset) if dataset is not None else None
        limit = self.jobs or len(grid)
        queued = list(enumerate(grid))
        in_flight: Dict[Any, int] = {}
        try:
            while queued or in_flight:
                while queued and len(in_flight) < limit:
                    index, (seed, method) = queued.pop(0)
                    in_flight[task.remote(grid_id, scenario, data_ref, seed, method,
                                                 self.workers, "ray")] = index
                done, _ = ray.wait(list(in_flight), num_returns=1)
                index = in_flight.pop(done[0])
                try:
                    result: Outcome = ray.get(done[0])
                except ray.exceptions.RayError as exc:
                    result = run_failed(*grid[index], getattr(exc, "cause", None) or exc)
                yield index, result
        finally:
            for ref in in_flight:
                ray.cancel(ref, force=True)
            if started_here:
                ray.shutdown()
