"""``streamfl sim``: every method of a scenario on every seed, with a progress bar, into one folder.

The folder gets ``metrics.jsonl`` (every event of every run, tagged with method and seed),
``summary.json`` (per method: mean and spread over seeds, and each seed's figures) and
``scenario.yaml`` (the scenario as run, with the flags applied). Runs go one after another here,
or ``jobs`` at a time in worker processes or on Ray (``streamfl.sim.executors``); the files are
the same either way (but for each run's ``wall_s``).
"""
import io
import json
import logging
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import IO, Any, Dict, List, Optional, Sequence

import torch
import yaml

from streamfl.config import to_dict
from streamfl.errors import StorageError, StreamflError
from streamfl.sim.executors import make_executor, run_failed, run_one, scenario_dataset
from streamfl.sim.rounds import check_workers, make_rounds
from streamfl.sim.methods import Method, resolve
from streamfl.sim.scenario import Scenario
from streamfl.sim.scenario_data import SimData
from streamfl.sim.summary import method_summary

log = logging.getLogger(__name__)

#: Torch threads per process while ``--workers`` round workers run here: the workers already take
#: the cores, so a second thread each only oversubscribes them, and a parent at one thread forks
#: its workers (``start_method``) instead of spawning them (2.5 to 3.5 s of CPU each). The figures
#: are unchanged: the smoke grid gave the same metrics line for line at one and two threads, and
#: ``tests/test_parallel_rounds.py`` compares ``--workers 2`` with the serial run at its default.
ROUND_WORKER_TORCH_THREADS = 1


class Progress:
    """A one-line bar on a terminal (plain lines elsewhere) with the estimated time left."""

    def __init__(self, total_runs: int, stream: Optional[IO[str]] = None, width: int = 30):
        self.total_runs = max(1, total_runs)
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.t0 = time.monotonic()
        self.done_runs = 0
        self.label = ""
        self._last_print = 0.0
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def start_run(self, label: str) -> None:
        self.label = label

    def update(self, fraction_of_run: float) -> None:
        now = time.monotonic()
        if not self._tty and now - self._last_print < 10.0 and fraction_of_run < 1.0:
            return
        self._last_print = now
        done = (self.done_runs + max(0.0, min(1.0, fraction_of_run))) / self.total_runs
        elapsed = now - self.t0
        left = elapsed * (1.0 - done) / done if done > 0 else float("nan")
        bar = "#" * int(done * self.width)
        line = "[%-*s] %5.1f%% %s, %s left" % (self.width, bar, 100 * done, self.label,
                                                "?" if left != left else "%.0f s" % left)
        self.stream.write(("\r" + line) if self._tty else line + "\n")
        self.stream.flush()

    def end_run(self) -> None:
        self.done_runs += 1
        self.update(0.0)

    def close(self) -> None:
        if self._tty:
            self.stream.write("\n")
            self.stream.flush()


def run_sim(scenario: Scenario, out_dir: Path, methods: Optional[Sequence[str]] = None,
            seeds: Optional[int] = None, dataset: Any = None,
            progress: Optional[Progress] = None, jobs: Optional[int] = None,
            executor: str = "local", ray_address: Optional[str] = None,
            workers: Optional[int] = None, keep_going: bool = False) -> Dict[str, Any]:
    """Run ``methods`` (default the scenario's) on ``seeds`` seeds; returns the summary.

    A run that fails ends the grid with its error (naming the method and seed), or with
    ``keep_going`` is logged, left out of the figures and listed under its method's ``failed`` in
    the summary (and ``failed_runs`` counts them) while the other runs go on: one run that breaks
    hours into a sweep costs that run, not the sweep.

    ``jobs`` runs at a time (default 1, in this process; with ``executor="ray"``, as many as the
    cluster takes); ``workers`` trains each run's device rounds in that many worker processes
    (Ray actors with ``executor="ray"``; without ``jobs`` the runs then go one after another in
    this process). Every setting writes the same files, in the same order.
    """
    chosen: List[Method] = resolve(methods or scenario.methods)
    n_seeds = int(seeds or scenario.seeds)
    grid = [(seed, method) for seed in range(n_seeds) for method in chosen]
    check_workers(workers, executor)
    pool = make_executor(executor, jobs, ray_address, workers)  # checks every flag, before any run
    if workers is not None and jobs is None:
        pool = None  # the runs go one at a time here, their rounds spread over the workers
    rounds = None
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "scenario.yaml").write_text(yaml.safe_dump(to_dict(scenario), sort_keys=False))
        metrics = open(out_dir / "metrics.jsonl", "w", encoding="utf-8")
    except OSError as exc:
        raise StorageError("cannot write the run folder %s: %s" % (out_dir, exc.strerror or exc)) from exc
    progress = progress or Progress(len(grid))
    per_method: Dict[str, List[Dict[str, Any]]] = {m.name: [] for m in chosen}
    failed: Dict[str, List[Dict[str, Any]]] = {m.name: [] for m in chosen}
    threads = torch.get_num_threads()
    try:
        if pool is None:
            if workers is not None and executor == "local":
                torch.set_num_threads(ROUND_WORKER_TORCH_THREADS)
            rounds = make_rounds(workers, executor, ray_address)
            data = SimData(scenario, dataset if dataset is not None else scenario_dataset(scenario))
            for seed, method in grid:
                progress.start_run("%s seed %d" % (method.name, seed))
                if not keep_going:
                    _record(per_method, method, run_one(scenario, method, seed, data, metrics.write,
                                                        progress.update, rounds))
                else:
                    # The run's lines wait for its end, so a failed run leaves none behind.
                    lines = io.StringIO()
                    try:
                        figures = run_one(scenario, method, seed, data, lines.write,
                                          progress.update, rounds)
                    except Exception as exc:  # noqa: BLE001  (any run's failure, recorded)
                        _record_failure(failed, seed, method, run_failed(seed, method, exc))
                    else:
                        metrics.write(lines.getvalue())
                        _record(per_method, method, figures)
                progress.end_run()
        else:
            def finished(seed: int, method: Method) -> None:
                """Runs elsewhere report no fractions: the bar moves by whole runs."""
                progress.start_run("%s seed %d done" % (method.name, seed))
                progress.update(1.0)
                progress.end_run()

            with closing(pool.run(scenario, dataset, grid, finished, keep_going)) as results:
                for (seed, method), outcome in zip(grid, results):
                    if isinstance(outcome, StreamflError):
                        _record_failure(failed, seed, method, outcome)
                        continue
                    lines, figures = outcome
                    metrics.write(lines)
                    _record(per_method, method, figures)
    finally:
        metrics.close()
        progress.close()
        if rounds is not None:
            rounds.close()
        torch.set_num_threads(threads)
    summary = {"scenario": scenario.name, "duration_s": scenario.duration_s,
               "seeds": list(range(n_seeds)), "thresholds": list(scenario.thresholds),
               "devices": scenario.num_devices, "dataset": scenario.data.dataset,
               "stream": scenario.stream.kind,
               "methods": {name: method_summary(runs, scenario.thresholds)
                           for name, runs in per_method.items()}}
    if keep_going:
        for name, failures in failed.items():
            summary["methods"][name]["failed"] = failures
        summary["failed_runs"] = sum(len(f) for f in failed.values())
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _record_failure(failed: Dict[str, List[Dict[str, Any]]], seed: int, method: Method,
                    error: StreamflError) -> None:
    """Keep a failed run's seed and error under its method, and say so now, not hours later."""
    failed[method.name].append({"seed": seed, "error": str(error)})
    log.error("%s (left out of the figures; the grid goes on)", error)


def _record(per_method: Dict[str, List[Dict[str, Any]]], method: Method,
            figures: Dict[str, Any]) -> None:
    """Keep one finished run's figures under its method, in the grid's order, and log them."""
    per_method[method.name].append(figures)
    log.info("%s seed %d: accuracy %s, energy %s J, %s versions in %.1f s", method.name,
             figures["seed"], figures["final_accuracy"], figures["energy_j"], figures["versions"],
             figures["wall_s"])
