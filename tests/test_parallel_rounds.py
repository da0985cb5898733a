"""``streamfl sim --workers N``: one run's device rounds in worker processes, the serial files.

The runtime hands each round's SGD to a round runner and goes on with the events the round cannot
change (``SimRun._loop``). These tests run the smoke grid (``tests/sim_grid.py``) both ways,
run every round runner through one contract, and kill workers and parents to see a run end with a
clear error and no process left behind. The golden guard (``tests/test_golden_sim.py``) runs every
method both ways.
"""
import contextlib
import io
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from sim_grid import GRID, SMOKE, alive, child_pids, quiet, run_files, serial_files, smoke
from streamfl.agent.quadratic import QuadraticPull
from streamfl.agent.trainer import LocalTrainer, TrainingJob, run_job
from streamfl.cli import main
from streamfl.errors import ConfigError, StreamflError
from streamfl.models import ModelSpec, build_model, model_to_arrays
from streamfl.sim.driver import Progress, run_sim
from streamfl.sim.rounds import make_rounds
from streamfl.sim.rounds.processes import ProcessRounds

SPEC = ModelSpec(name="cnn1d", in_channels=6, window_len=50, num_classes=6, hidden=16)


@contextlib.contextmanager
def torch_threads(n):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    return serial_files(tmp_path_factory)


def test_workers_2_on_the_command_writes_the_serial_files(serial, tmp_path):
    out = tmp_path / "run"
    with torch_threads(2):  # the serial run's count on two cores; the round workers run at one
        assert main(["sim", str(SMOKE), *GRID, "--workers", "2", "--out", str(out)]) == 0
        assert torch.get_num_threads() == 2  # given back
    assert run_files(out) == serial
    assert multiprocessing.active_children() == []


def test_jobs_and_workers_together_write_the_serial_files(serial, tmp_path):
    # Two runs at a time, each with a round worker of its own.
    run_sim(smoke(), tmp_path, seeds=2, jobs=2, workers=1, progress=quiet())
    assert run_files(tmp_path) == serial
    assert multiprocessing.active_children() == []


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_progress_bar_moves_through_a_parallel_run(tmp_path):
    stream = _Terminal()
    run_sim(smoke(), tmp_path, methods=["fedasync"], seeds=1, workers=2,
            progress=Progress(1, stream=stream))
    shown = [float(part.split("%")[0].split()[-1]) for part in stream.getvalue().split("\r") if "%" in part]
    assert shown[-1] == 100.0 and len(set(shown)) >= 3 and shown == sorted(shown)


@pytest.mark.parametrize("workers", ["0", "-1"])
def test_workers_below_one_is_a_configuration_error(tmp_path, capsys, workers):
    rc = main(["sim", str(SMOKE), "--workers", workers, "--out", str(tmp_path / "never")])
    assert rc == ConfigError.exit_code and "--workers must be" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()
    with pytest.raises(ConfigError, match="--workers"):
        run_sim(smoke(), tmp_path / "never", workers=int(workers))
    with pytest.raises(SystemExit):  # argparse refuses a word
        main(["sim", str(SMOKE), "--workers", "two"])


def test_ray_workers_without_ray_say_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # ``import ray`` then raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'streamfl\[ray\]'"):
        run_sim(smoke(), tmp_path / "never", workers=2, executor="ray")
    assert not (tmp_path / "never").exists()


def test_ray_actors_write_the_serial_files(serial, tmp_path):
    ray = pytest.importorskip("ray")
    run_sim(smoke(), tmp_path, seeds=2, workers=2, executor="ray", progress=quiet())
    assert run_files(tmp_path) == serial
    assert not ray.is_initialized()  # the local instance it started is shut down again


# ---- the contract every round runner keeps ---------------------------------------------------------

def _trainer(seed):
    return LocalTrainer(build_model(SPEC, dropout=0.2, seed=seed), SPEC.num_classes, momentum=0.5)


def _job(seed, steps=3, pull=False):
    rng = np.random.default_rng(seed)
    batches = [(rng.standard_normal((8, 50, 6)).astype(np.float32), rng.integers(0, 6, 8))
               for _ in range(steps)]
    penalties = []
    if pull:  # a quadratic pull travels with the job (FedCurv's and ST-EWC's penalties)
        model = build_model(SPEC, seed=99)
        penalties = [QuadraticPull({n: (torch.full_like(p, 0.5), p.detach() * 0.5)
                                    for n, p in model.named_parameters()})]
    return TrainingJob(batches=batches, lr=0.1, dropout=0.2, torch_seed=seed, penalties=penalties,
                       momentum=0.5)


RUNNERS = ["inline", "processes-fork", "processes-spawn", "ray"]


@pytest.fixture(params=RUNNERS)
def runner(request):
    with torch_threads(1):  # as --workers runs: a forked worker refuses more
        if request.param == "ray":
            pytest.importorskip("ray")
            made = make_rounds(2, "ray")
        elif request.param.startswith("processes-"):
            made = ProcessRounds(2, request.param.split("-")[1])
        else:
            made = make_rounds(None)
        yield made
    made.close()
    made.close()  # idempotent
    assert multiprocessing.active_children() == []


def test_every_runner_gives_the_inline_bits(runner):
    trainers = [_trainer(k) for k in range(3)]
    jobs = [_job(k, pull=k == 1) for k in range(3)]
    expected = []
    for k, job in enumerate(jobs):  # the serial run: each device's own model, in place
        reference = _trainer(k)
        result = run_job(reference.model, reference, _job(k, pull=k == 1))
        expected.append((result, model_to_arrays(reference.model), reference.capped))
    tickets = [runner.submit(t, SPEC, j) for t, j in zip(trainers, jobs)]  # all in flight at once
    for k in (2, 0, 1):  # collected in any order
        result = runner.result(tickets[k])
        want, weights, capped = expected[k]
        assert result == want
        got = model_to_arrays(trainers[k].model)
        assert all(np.array_equal(got[n], weights[n]) for n in weights)
        assert trainers[k].model.training and trainers[k].capped == capped
    assert runner.jobs == 3 and runner.overlapped == 2  # two were submitted before any result


FORK_CHOICE = """
import threading, torch
from streamfl.sim.parent_watch import WATCH_THREAD_NAME
from streamfl.sim.rounds.processes import start_method
torch.set_num_threads(1)
seen = [start_method()]  # torch and streamfl come with the fork: no import
for name in ("someone-elses", WATCH_THREAD_NAME):  # one may hold a lock; exit_with_parent's holds none
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, name=name)
    other.start()
    seen.append(start_method())
    stop.set()
    other.join()
torch.set_num_threads(2)  # GNU OpenMP's pool, once used by two threads, hangs a forked child
seen.append(start_method())
print(" ".join(seen))
"""


def test_workers_fork_only_where_it_cannot_hang():
    # A fresh process: this one's threads (Ray's, other tests') are not the ones under test.
    out = subprocess.run([sys.executable, "-c", FORK_CHOICE], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.split() == ["fork", "spawn", "fork", "spawn"], out.stderr


def test_forked_workers_refuse_a_second_torch_thread_instead_of_hanging():
    with torch_threads(1):
        rounds = ProcessRounds(1, "fork")
    with rounds, torch_threads(2):
        with pytest.raises(StreamflError, match="forked at one torch thread and cannot train on 2"):
            rounds.submit(_trainer(0), SPEC, _job(0))
    assert multiprocessing.active_children() == []


def test_a_failing_job_is_an_error_that_says_so():
    with ProcessRounds(1) as rounds:
        wrong = ModelSpec(name="cnn1d", in_channels=6, window_len=50, num_classes=6, hidden=24)
        ticket = rounds.submit(_trainer(0), wrong, _job(0))  # weights of another shape
        with pytest.raises(StreamflError, match="round worker failed on its job: ModelError: tensor conv2.weight"):
            rounds.result(ticket)
    assert multiprocessing.active_children() == []


def test_a_killed_worker_ends_the_wait_with_an_error_and_no_process_is_left():
    rounds = ProcessRounds(2)
    try:
        ticket = rounds.submit(_trainer(0), SPEC, _job(0, steps=400))
        busy = next(w for w in rounds._workers if w.sent and w.sent[0][0] == ticket)
        os.kill(busy.process.pid, signal.SIGKILL)
        with pytest.raises(StreamflError, match=r"round worker %d \(pid %d\) died with exit code -9"
                           % (busy.index, busy.process.pid)):
            rounds.result(ticket)
        assert all(not w.process.is_alive() for w in rounds._workers)
        with pytest.raises(StreamflError, match="stopped"):
            rounds.submit(_trainer(1), SPEC, _job(1))
    finally:
        rounds.close()
    assert multiprocessing.active_children() == []


# ---- a real command, killed from outside --------------------------------------------------------------

def _sim_with_workers(tmp_path):
    """``streamfl sim --workers 2`` on a long run, and its two worker pids once they train."""
    proc = subprocess.Popen([sys.executable, "-m", "streamfl", "sim", str(SMOKE), "--duration",
                             "100000", "--methods", "fedasync", "--seeds", "1", "--workers", "2",
                             "--out", str(tmp_path / "run")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60.0
    workers = []
    while len(workers) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
        # The spawn start method's resource tracker is a child too: the workers are the others.
        workers = [p for p in child_pids(proc.pid) if b"resource_tracker" not in
                   Path("/proc/%d/cmdline" % p).read_bytes()]
    assert len(workers) == 2, proc.communicate(timeout=10)
    time.sleep(2.0)  # into the run
    return proc, workers


def _gone(pids, within_s=15.0):
    deadline = time.monotonic() + within_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_a_worker_killed_under_a_running_command_ends_it_with_a_clear_error(tmp_path):
    proc, workers = _sim_with_workers(tmp_path)
    try:
        os.kill(workers[0], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode != 0
        assert "round worker" in err and "died with exit code -9" in err, err[-2000:]
        assert _gone(workers)
    finally:
        proc.kill()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_the_workers_end_when_the_command_is_killed(tmp_path):
    proc, workers = _sim_with_workers(tmp_path)
    try:
        proc.kill()  # SIGKILL: no clean-up runs in the parent
        proc.wait()
        assert _gone(workers)
    finally:
        proc.kill()
