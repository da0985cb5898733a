"""``streamfl sim --jobs N`` and ``--executor ray`` write the very files the serial loop writes
(the grid and its comparison: ``tests/sim_grid.py``)."""
import logging
import multiprocessing
import sys
from pathlib import Path

import pytest

from sim_grid import GRID, SMOKE, alive, quiet as _quiet, run_files as _files, serial_files, smoke as _smoke
from streamfl.cli import main
from streamfl.errors import ConfigError
from streamfl.sim.driver import run_sim
from streamfl.sim.executors import scenario_dataset
from streamfl.sim.scenario import load_scenario


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    return serial_files(tmp_path_factory)


def test_jobs_2_on_the_command_writes_the_serial_files(serial, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["sim", str(SMOKE), *GRID, "--jobs", "2", "--out", str(out)]) == 0
    assert "run folder: %s" % out in capsys.readouterr().out
    assert _files(out) == serial
    assert multiprocessing.active_children() == []


def test_jobs_2_passes_a_given_dataset_to_the_workers(serial, tmp_path):
    scenario = _smoke()
    summary = run_sim(scenario, tmp_path, seeds=2, dataset=scenario_dataset(scenario), jobs=2,
                      progress=_quiet())
    assert set(summary["methods"]) == {"fedasync", "fedavg"}
    assert _files(tmp_path) == serial


def test_a_failing_run_names_its_method_and_seed_and_stops_the_others(tmp_path, caplog):
    # clp's settings are checked when a run builds its coordinator: adaclp fails in its worker at
    # once, while fedasync (seed 0) is still running in the other worker and is stopped.
    scenario = load_scenario(SMOKE, {"duration_s": 300.0}, [("plugins.clp.nonsense", 1)])
    with pytest.raises(ConfigError, match=r"run of method adaclp, seed 0 failed: .*nonsense"):
        run_sim(scenario, tmp_path, methods=["fedasync", "adaclp"], seeds=2, jobs=2,
                progress=_quiet())
    assert multiprocessing.active_children() == []
    assert any("stopping" in r.getMessage() for r in caplog.records
               if r.name == "streamfl.sim.executors" and r.levelno == logging.INFO)


@pytest.mark.parametrize("jobs", ["0", "-2"])
def test_jobs_below_one_is_a_configuration_error(tmp_path, capsys, jobs):
    rc = main(["sim", str(SMOKE), "--jobs", jobs, "--out", str(tmp_path / "never")])
    assert rc == ConfigError.exit_code and "--jobs must be" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()
    with pytest.raises(ConfigError, match="--jobs"):
        run_sim(_smoke(), tmp_path / "never", jobs=0)


def test_ray_address_without_ray_is_a_configuration_error(tmp_path, capsys):
    rc = main(["sim", str(SMOKE), "--ray-address", "10.0.0.1:6379", "--out", str(tmp_path / "never")])
    assert rc == ConfigError.exit_code and "--executor ray" in capsys.readouterr().err


def test_the_ray_executor_without_ray_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # ``import ray`` then raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'streamfl\[ray\]'"):
        run_sim(_smoke(), tmp_path / "never", executor="ray")
    assert not (tmp_path / "never").exists()


def test_the_ray_executor_writes_the_serial_files(serial, tmp_path):
    ray = pytest.importorskip("ray")
    scenario = _smoke()
    run_sim(scenario, tmp_path, seeds=2, dataset=scenario_dataset(scenario), jobs=2,
            executor="ray", progress=_quiet())
    assert _files(tmp_path) == serial
    assert not ray.is_initialized()  # the local instance it started is shut down again


GRANDCHILD = """
import os, time
from streamfl.sim.parent_watch import exit_with_parent
exit_with_parent(os.getppid(), poll_s=0.05)
print("ready", flush=True)
time.sleep(60)
"""
MIDDLE = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", %r])
print("pid", child.pid, flush=True)
time.sleep(60)
""" % GRANDCHILD


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_a_worker_ends_when_the_sim_that_started_it_is_killed():
    import subprocess
    import time
    middle = subprocess.Popen([sys.executable, "-c", MIDDLE], stdout=subprocess.PIPE, text=True)
    try:
        lines = [middle.stdout.readline().split() for _ in range(2)]
        pid = int(next(line[1] for line in lines if line and line[0] == "pid"))
        assert ["ready"] in lines and alive(pid)
        middle.kill()  # SIGKILL: no clean-up runs in the parent
        middle.wait()
        deadline = time.monotonic() + 10.0
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(pid)
    finally:
        middle.kill()
