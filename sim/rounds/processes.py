"""Round workers as processes on this machine, fed through shared memory.

Each worker is a process with a pipe and blocks of shared memory (forked where that is safe, see
``start_method``). A job's start weights
and minibatches are written into a block of the worker's (one copy, 64-byte aligned), the small
rest (lr, dropout, seed, penalties, where each array lies) goes down the pipe; the worker trains on
views of the block and writes the trained weights back into it, and the main process loads them
straight into the device's model. No model is pickled per round. Jobs wait in a queue; a worker
holds up to ``DEPTH`` of them (a block each) and runs them in order, so that its next job is
already there when it finishes one, whatever the main process is doing.

A worker that dies (killed, out of memory) ends the run with an error naming it, whatever the
main process was waiting for; the workers end with the main process (``exit_with_parent``) and
are stopped and reaped by ``close``.
"""
import itertools
import logging
import os
import sys
import threading
import traceback
from collections import deque
from dataclasses import dataclass, field, replace
from multiprocessing import connection, get_all_start_methods, get_context, resource_tracker
from multiprocessing.shared_memory import SharedMemory
from typing import Any, Deque, Dict, List, Optional, Tuple

import numpy as np
import torch

from streamfl.agent.trainer import LocalTrainer, TrainingJob, TrainResult
from streamfl.errors import ConfigError, StreamflError
from streamfl.models import ModelSpec
from streamfl.sim.parent_watch import WATCH_THREAD_NAME, exit_with_parent
from streamfl.sim.rounds.base import RoundRunner
from streamfl.sim.rounds.worker import JobRunner, load_trained, state_tensors

log = logging.getLogger(__name__)

#: Arrays start at multiples of this many bytes in a worker's block.
ALIGN_BYTES = 64
#: A block that must grow grows to this many times what the job needs (fewer re-allocations).
GROWTH = 1.5
#: Jobs a worker holds at once (each in a block of its own): the next is waiting when one ends.
DEPTH = 2
#: Seconds a stopping worker gets to leave on its own before it is terminated.
STOP_TIMEOUT_S = 5.0

#: ``(name, byte offset, shape, dtype string)`` of one array in a block.
Slot = Tuple[str, int, Tuple[int, ...], str]


def _layout(arrays: List[Tuple[str, np.ndarray]], start: int = 0) -> Tuple[List[Slot], int]:
    """Where each array goes in a block from ``start`` on, aligned; and the end offset."""
    slots, offset = [], start
    for name, arr in arrays:
        offset = -(-offset // ALIGN_BYTES) * ALIGN_BYTES
        slots.append((name, offset, tuple(arr.shape), arr.dtype.str))
        offset += arr.nbytes
    return slots, offset


def _view(buf: Any, slot: Slot) -> np.ndarray:
    """The array ``slot`` describes, as a view of ``buf``."""
    _, offset, shape, dtype = slot
    return np.ndarray(shape, dtype=np.dtype(dtype), buffer=buf, offset=offset)


@dataclass
class _Job:
    """One submitted job and what became of it."""

    trainer: LocalTrainer
    spec: ModelSpec
    job: TrainingJob
    result: Optional[TrainResult] = None


@dataclass
class _Worker:
    """The main process's handle on one worker process: its blocks and the jobs it was sent."""

    index: int
    process: Any
    conn: Any
    #: One block of shared memory per job the worker may hold at once (``DEPTH``).
    blocks: List[Optional[SharedMemory]] = field(default_factory=lambda: [None] * DEPTH)
    #: ``(ticket, block index, output slots)`` of the jobs sent, oldest first (it runs them in order).
    sent: Deque[Tuple[int, int, List[Slot]]] = field(default_factory=deque)


def start_method() -> str:
    """How workers start: ``fork`` where it is safe, else ``spawn``.

    A forked worker has torch and streamfl already imported, sharing the parent's pages: a spawned
    one spends 2.5 to 3.5 s of CPU importing them, which on 2 cores competes with the run it is
    meant to speed up. Fork is safe only if (1) no other thread of this process can hold a lock at
    the fork (the parent-watch thread holds none) and (2) torch's OpenMP pool is not in use:
    torch's CPU build uses GNU OpenMP, and a child forked after the parent ran a parallel region
    with two threads hangs in its first one (tried: it does), while after one-thread regions it
    does not. Workers train with the parent's thread count, so a parent at one thread (what
    ``--jobs`` workers and the benchmarks set) forks; any other parent spawns.
    """
    others = [t for t in threading.enumerate()
              if t is not threading.main_thread() and t.name != WATCH_THREAD_NAME]
    if "fork" in get_all_start_methods() and torch.get_num_threads() == 1 and not others:
        return "fork"
    return "spawn"


class ProcessRounds(RoundRunner):
    """``workers`` processes that train the jobs of one run (or of several, in turn)."""

    overlaps = True

    def __init__(self, workers: int, method: Optional[str] = None):
        """``method``: ``fork`` or ``spawn``; None chooses (``start_method``)."""
        super().__init__()
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ConfigError("--workers must be a whole number of at least 1, got %r" % (workers,))
        self.method = method or start_method()
        ctx = get_context(self.method)
        if self.method == "fork":
            resource_tracker.ensure_running()  # shared by the children: it unlinks the blocks if we die
            for stream in (sys.stdout, sys.stderr):  # else each child writes the unflushed rest again
                if stream is not None:
                    stream.flush()
        level = logging.getLogger("streamfl").getEffectiveLevel()
        self._workers: List[_Worker] = []
        self._jobs: Dict[int, _Job] = {}
        self._queue: Deque[int] = deque()
        self._tickets = itertools.count()
        self._closed = False
        try:
            for k in range(workers):
                parent, child = ctx.Pipe()
                process = ctx.Process(target=_serve, args=(child, os.getpid(), level),
                                      name="streamfl-rounds-%d" % k, daemon=True)
                process.start()
                child.close()
                self._workers.append(_Worker(k, process, parent))
        except BaseException:
            self.close()
            raise

    # ---- RoundRunner ---------------------------------------------------------------------------

    def _submit(self, trainer: LocalTrainer, spec: ModelSpec, job: TrainingJob) -> int:
        if self._closed:
            raise StreamflError("the round workers are stopped")
        ticket = next(self._tickets)
        self._jobs[ticket] = _Job(trainer, spec, replace(job, batches=list(job.batches)))
        self._queue.append(ticket)
        self._start_queued()
        return ticket

    def _result(self, ticket: int) -> TrainResult:
        job = self._jobs[ticket]
        while job.result is None:
            busy = [w for w in self._workers if w.sent]
            if not busy:  # cannot happen while the ticket is queued: a worker would have taken it
                raise StreamflError("round job %d was never started" % ticket)
            for conn in connection.wait([w.conn for w in busy]):
                self._receive(next(w for w in busy if w.conn is conn))
            self._start_queued()
        del self._jobs[ticket]
        return job.result

    def poll(self) -> None:
        busy = [w for w in self._workers if w.sent]
        if busy:
            for conn in connection.wait([w.conn for w in busy], timeout=0):
                self._receive(next(w for w in busy if w.conn is conn))
        self._start_queued()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for w in self._workers:
            try:
                w.conn.send(("stop",))
            except (OSError, ValueError):
                pass
        for w in self._workers:
            w.process.join(0.0 if w.sent else STOP_TIMEOUT_S)
            if w.process.is_alive():
                w.process.terminate()
                w.process.join()
            w.conn.close()
            for k in range(DEPTH):
                self._free(w, k)
        self._queue.clear()
        self._jobs.clear()

    # ---- the main process's side ----------------------------------------------------------------

    def _start_queued(self) -> None:
        """Hand queued jobs to the workers holding the fewest, up to ``DEPTH`` each: a worker's
        next job is already in its pipe when it finishes one."""
        while self._queue:
            w = min(self._workers, key=lambda w: len(w.sent))
            if len(w.sent) >= DEPTH:
                return
            self._start(w, self._queue.popleft())

    def _start(self, w: _Worker, ticket: int) -> None:
        """Write the job's start weights and minibatches into a free block of ``w`` and send it the rest."""
        job = self._jobs[ticket]
        weights = [("w/" + name, t.numpy()) for name, t in state_tensors(job.trainer.model).items()]
        arrays = list(weights)
        for k, (X, y) in enumerate(job.job.batches):
            arrays += [("x/%d" % k, np.asarray(X)), ("y/%d" % k, np.asarray(y))]
        slots, end = _layout(arrays)
        out, end = _layout([(name, np.empty(a.shape, np.float32)) for name, a in weights], end)
        used = {block for _, block, _ in w.sent}
        block = next(k for k in range(DEPTH) if k not in used)
        shm = w.blocks[block]
        if shm is None or shm.size < end:
            self._free(w, block)
            shm = w.blocks[block] = SharedMemory(create=True, size=int(end * GROWTH) + ALIGN_BYTES)
        for slot, (_, arr) in zip(slots, arrays):
            _view(shm.buf, slot)[...] = arr
        threads = torch.get_num_threads()
        if self.method == "fork" and threads != 1:
            raise StreamflError(
                "the round workers were forked at one torch thread and cannot train on %d (GNU "
                "OpenMP hangs); keep torch at one thread, or start them with method='spawn'" % threads)
        header = {"ticket": ticket, "shm": shm.name, "slots": slots, "out": out,
                  "spec": job.spec, "torch_threads": threads,
                  "job": replace(job.job, batches=[])}
        try:
            w.conn.send(("job", header))
        except (OSError, ValueError) as exc:
            raise self._died(w, ticket) from exc
        w.sent.append((ticket, block, out))

    def _receive(self, w: _Worker) -> None:
        """Take ``w``'s answer to its oldest job: the trained weights go into the device's model."""
        ticket, block, out = w.sent[0]
        try:
            message = w.conn.recv()
        except (EOFError, OSError) as exc:
            raise self._died(w, ticket) from exc
        kind, answered, payload = message
        if kind == "error":
            self.close()
            raise StreamflError("a round worker failed on its job: %s" % payload)
        if answered != ticket:
            self.close()
            raise StreamflError("round worker %d answered job %s, expected %d" % (w.index, answered, ticket))
        w.sent.popleft()
        job = self._jobs[ticket]
        weights = {slot[0][2:]: _view(w.blocks[block].buf, slot) for slot in out}
        load_trained(job.trainer, job.job, weights)
        del weights
        job.result = payload

    def _died(self, w: _Worker, ticket: Optional[int]) -> StreamflError:
        """The error for a worker that is gone; every worker is stopped."""
        w.process.join(1.0)
        code = w.process.exitcode
        self.close()
        return StreamflError("round worker %d (pid %s) died%s%s: the run cannot go on" % (
            w.index, w.process.pid, "" if code is None else " with exit code %s" % code,
            "" if ticket is None else " while training round job %d" % ticket))

    @staticmethod
    def _free(w: _Worker, block: int) -> None:
        shm = w.blocks[block]
        if shm is not None:
            shm.close()
            try:
                shm.unlink()
            except FileNotFoundError:
                pass
            w.blocks[block] = None


# ---- the worker process ---------------------------------------------------------------------------

def _serve(conn: Any, parent_pid: int, log_level: int) -> None:
    """A worker's loop: train each job from its block until told to stop (or the parent is gone)."""
    from streamfl.logs import LEVELS, setup_logging
    exit_with_parent(parent_pid)
    name = logging.getLevelName(log_level)
    setup_logging(name if name in LEVELS else "WARNING")
    runner = JobRunner()
    attached: Dict[str, SharedMemory] = {}  # by name, most recently used last
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return
            if message[0] == "stop":
                return
            header = message[1]
            try:
                shm = attached.pop(header["shm"], None) or SharedMemory(name=header["shm"])
                attached[header["shm"]] = shm
                while len(attached) > DEPTH:  # a block the main process replaced (grown) is done
                    attached.pop(next(iter(attached))).close()
                if torch.get_num_threads() != header["torch_threads"]:
                    torch.set_num_threads(header["torch_threads"])
                views = {slot[0]: _view(shm.buf, slot) for slot in header["slots"]}
                weights = {k[2:]: v for k, v in views.items() if k.startswith("w/")}
                steps = sum(1 for k in views if k.startswith("x/"))
                batches = [(views["x/%d" % k], views["y/%d" % k]) for k in range(steps)]
                job = replace(header["job"], batches=batches)
                result, model = runner.run(header["spec"], weights, job)
                state = state_tensors(model)
                for slot in header["out"]:
                    _view(shm.buf, slot)[...] = state[slot[0][2:]].detach().to(torch.float32).numpy()
                del views, weights, batches, job
                conn.send(("done", header["ticket"], result))
            except Exception as exc:
                conn.send(("error", header["ticket"], "%s: %s\nthe worker's traceback:\n%s" % (
                    type(exc).__name__, exc, traceback.format_exc())))
    finally:
        for shm in attached.values():
            shm.close()
