"""The wheel, installed into a fresh virtual environment, holds every package and runs a fleet.

The editable install every other test uses resolves each name from the checkout, so it cannot see a
package the wheel leaves out. Here the wheel is built from a copy of the checkout's files, installed
into a new ``python -m venv`` without the checkout on its path, every module of the installed
``streamfl`` is imported there, and its ``streamfl-coordinator`` and ``streamfl-agent`` run one
federated round against a real broker (mosquitto) with every coordinator plug-in enabled (every agent
plug-in always runs).

The fresh environment borrows the third-party dependencies (torch, paho, ...) of the interpreter
running the tests rather than downloading them again: a ``.pth`` file in its site-packages names the
running interpreter's site-packages folders. A path line of a ``.pth`` file only appends that folder
to ``sys.path``; the ``.pth`` files inside it (the editable install's ``__editable__*`` finder, an
``easy-install.pth`` or ``*.egg-link`` of ``setup.py develop``) are not run, and the fresh
site-packages comes first, so ``streamfl`` can only come from the wheel, which the tests assert.
"""
import json
import os
import shutil
import site
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml

from source_tree import ROOT, ROOTS, packages, source_files
from streamfl.coordinator.metrics import read_metrics
from streamfl.coordinator.plugins import plugin_configs
from streamfl.methods import coordinator_plugins
PLUGINS = coordinator_plugins()
from streamfl.plugins import build_settings

pytestmark = pytest.mark.slow

#: The subpackages a hand-kept package list once left out of the wheel.
ONCE_MISSING = ("streamfl.methods.sessions.initializers", "streamfl.methods.stewc.periods", "streamfl.methods.sfedpo.latent")

#: Walks and imports every module of the installed ``streamfl``; prints what it found as JSON.
IMPORT_EVERYTHING = r"""
import importlib, importlib.util, json, pkgutil, sys, sysconfig, traceback
import streamfl
errors = []
modules = {"streamfl": streamfl.__file__}
def failed(name):
    errors.append([name, traceback.format_exc()])
for info in pkgutil.walk_packages(streamfl.__path__, "streamfl.", onerror=failed):
    try:
        if info.name.endswith(".__main__"):  # importing it runs the program: the test runs it
            modules[info.name] = importlib.util.find_spec(info.name).origin
        else:
            modules[info.name] = importlib.import_module(info.name).__file__
    except Exception:
        failed(info.name)
print(json.dumps({
    "purelib": sysconfig.get_paths()["purelib"], "path": sys.path, "modules": modules,
    "errors": errors, "editable": sorted(name for name in sys.modules if "editable" in name.lower())
        + [repr(f) for f in sys.meta_path if "editable" in repr(f).lower()]}))
"""

#: Plug-in settings that keep a round short on a tiny model (the rest run with their defaults).
FAST_PLUGINS = {
    "fedcurv": {"fisher_samples": 4},
    "criticalfl": {"clients_min": 1},
    "sampling": {"clients_per_round": 1},
    "stewc": {"fisher_samples": 4},
}
MODEL = {"name": "mlp", "in_channels": 3, "window_len": 8, "num_classes": 4, "hidden": 16}
FAST_MQTT = {"reconnect_min_s": 0.2, "reconnect_max_s": 1.0}
STRATEGIES = ("fedavg", "fedasync")


class FreshVenv:
    """A ``python -m venv`` with the built wheel installed and the running interpreter's
    dependencies (not its ``streamfl``) reachable."""

    def __init__(self, root: Path, wheel: Path):
        self.root = root
        self.wheel = wheel
        self.python = root / "bin" / "python"

    def bin(self, name: str) -> Path:
        return self.root / "bin" / name

    def env(self) -> Dict[str, str]:
        """The test's environment without anything that would put other code on the path."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")}
        env.update(PYTHONNOUSERSITE="1", PYTHONUNBUFFERED="1")
        return env


def _dependency_dirs(venv_root: Path) -> List[str]:
    """Where the running interpreter finds its third-party packages."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        dirs.append(site.getusersitepackages())
    return [d for d in dirs if os.path.isdir(d) and venv_root not in Path(d).parents]


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory) -> Path:
    # Built from a copy of the checkout's files, as a clean clone would be: setuptools' build/
    # folder in a working tree can hold stale modules that would hide a packaging mistake.
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    for name in source_files():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(str(ROOT / name), str(src / name))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp / "dist"), str(src)], check=True, cwd=str(tmp))
    wheels = list((tmp / "dist").glob("streamfl-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory, built_wheel) -> FreshVenv:
    root = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    venv = FreshVenv(root, built_wheel)
    # pip --python: this pip installs into the fresh interpreter (its console scripts start it).
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv.python), "install", "--no-deps",
                    "--no-index", "-q", str(built_wheel)], check=True, env=venv.env(), cwd=str(root))
    purelib = subprocess.run([str(venv.python), "-I", "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True, env=venv.env(),
                             cwd=str(root)).stdout.strip()
    (Path(purelib) / "_test_dependencies.pth").write_text("\n".join(_dependency_dirs(root)) + "\n")
    return venv


def test_the_wheel_holds_every_package_and_module_of_the_tree(built_wheel):
    names = set(zipfile.ZipFile(str(built_wheel)).namelist())
    shipped = {}  # {file of the checkout: where the wheel should have it}
    files = [Path(f) for f in source_files()]
    for package, folder in ROOTS.items():
        for path in files:
            if Path(folder) in path.parents:
                parts = package.split(".") + list(path.relative_to(folder).parts)
                shipped[path.as_posix()] = "/".join(parts)
    modules = {name: where for name, where in shipped.items() if name.endswith(".py")}
    assert {name for name, where in modules.items() if where not in names} == set()
    # Every folder of the tree with an __init__.py is a package of the wheel, the once-missing too.
    package_dirs = {str(Path(where).parent) for name, where in modules.items()
                    if Path(name).name == "__init__.py"}
    assert package_dirs == {name.replace(".", "/") for name in packages()}
    for package in ONCE_MISSING:
        assert package.replace(".", "/") + "/__init__.py" in names
    # The boards' profiles and the typing marker come as data.
    assert {where for name, where in shipped.items() if name.endswith(".yaml")} <= names
    assert any(n.startswith("streamfl/boards/") and n.endswith(".yaml") for n in names)
    assert "streamfl/py.typed" in names
    # The shipped broker files come as data: streamfl provision rewrites them from the wheel alone.
    for name in ("streamfl.conf", "acl"):
        assert "streamfl/mosquitto/" + name in names
    # The fleet view's page comes as data too (the coordinator serves it; nothing from a CDN).
    for name in ("index.html", "dashboard.js", "dashboard.css"):
        assert "streamfl/coordinator/monitor/static/" + name in names
    # Generic top-level names (agent, models, ...) never land in site-packages beside streamfl.
    assert {n.split("/")[0] for n in names} == {"streamfl", built_wheel.name.split("-py")[0] + ".dist-info"}


def test_every_module_imports_from_the_fresh_venv(fresh_venv, tmp_path):
    # Started in an empty folder, isolated (-I): neither the checkout nor PYTHONPATH is on the path.
    proc = subprocess.run([str(fresh_venv.python), "-I", "-c", IMPORT_EVERYTHING], cwd=str(tmp_path),
                          capture_output=True, text=True, env=fresh_venv.env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = json.loads(proc.stdout.splitlines()[-1])
    assert found["errors"] == [], "\n".join("%s:\n%s" % (name, tb) for name, tb in found["errors"])
    assert found["editable"] == []
    purelib = Path(found["purelib"])
    assert fresh_venv.root in purelib.parents
    outside = {name: path for name, path in found["modules"].items() if purelib not in Path(path).parents}
    assert outside == {}
    assert str(ROOT) not in found["path"] and "" not in found["path"]
    expected = set()
    for package, folder in packages().items():
        expected.add(package)
        expected.update("%s.%s" % (package, p.stem) for p in folder.glob("*.py") if p.stem != "__init__")
    assert set(found["modules"]) == expected
    for package in ONCE_MISSING:
        assert found["modules"][package] == str(purelib / package.replace(".", "/") / "__init__.py")
    # ``python -m streamfl.agent`` and the like (their __main__ runs the program, so not imported above).
    mains = sorted(name[:-len(".__main__")] for name in found["modules"] if name.endswith(".__main__"))
    assert {"streamfl.agent", "streamfl.coordinator"} <= set(mains)
    for package in mains:
        proc = subprocess.run([str(fresh_venv.python), "-I", "-m", package, "--help"], cwd=str(tmp_path),
                              capture_output=True, text=True, env=fresh_venv.env(), timeout=120)
        assert proc.returncode == 0 and "usage:" in proc.stdout, (package, proc.stdout, proc.stderr[-3000:])
    # The console scripts start the fresh interpreter.
    for script in ("streamfl-coordinator", "streamfl-agent", "streamfl"):
        assert fresh_venv.bin(script).read_text().splitlines()[0] == "#!" + str(fresh_venv.python)


def test_provision_runs_from_the_installed_wheel_alone(fresh_venv, tmp_path):
    """``streamfl provision`` finds the shipped broker config and ACL in the installed package
    (no checkout) and writes a fleet's broker files and kits from them."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("fleet: farm\nbroker: {hosts: [broker.local], port: 8883}\n"
                     "boards: [{count: 2, prefix: pi-, kind: raspberry-pi-5}]\n")
    out = tmp_path / "out"
    proc = subprocess.run([str(fresh_venv.bin("streamfl")), "provision", str(fleet), "--out", str(out)],
                          cwd=str(tmp_path), capture_output=True, text=True, env=fresh_venv.env(),
                          timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    acl = (out / "broker" / "acl").read_text()
    assert "user pi-01" in acl and "user pi-02" in acl and "pattern write streamfl/v1/+/device/%u/update" in acl
    assert "use_username_as_clientid true" in (out / "broker" / "mosquitto.conf").read_text()
    assert (out / "kits" / "pi-02" / "install_board.sh").is_file()


def _plugins_for(strategy: str) -> List[str]:
    """Every registered coordinator plug-in that runs under ``strategy``, with what it requires."""
    names: List[str] = []
    for name, cls in PLUGINS.items():
        try:
            cls.check(build_settings(cls, name, FAST_PLUGINS.get(name)), strategy)
        except ValueError:
            continue
        if all(r in names for r in cls.requires):
            names.append(name)
    plugin_configs({n: FAST_PLUGINS.get(n, {}) for n in names}, strategy)  # they run together
    return names


def test_every_coordinator_plugin_runs_under_one_of_the_strategies():
    assert set().union(*(_plugins_for(s) for s in STRATEGIES)) == set(PLUGINS)


def _spawn(argv: List[str], log_path: Path, venv: FreshVenv, cwd: Path) -> subprocess.Popen:
    with open(log_path, "wb") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=venv.env(), cwd=str(cwd))


def _stop(procs: List[subprocess.Popen]) -> None:
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.terminate()
    for proc in reversed(procs):
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.mark.integration
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_installed_programs_aggregate_an_update_with_every_plugin(fresh_venv, mqtt_broker,
                                                                      tmp_path, strategy):
    fleet = "wheel-" + strategy
    plugins = _plugins_for(strategy)
    coordinator: Dict[str, Any] = {
        "fleet": fleet, "model": MODEL, "strategy": strategy,
        "fedavg": {"deadline_s": 2.0, "min_updates": 1},
        "hparams": {"lr": 0.05, "batch_size": 8, "local_steps": 2, "dropout": 0.0},
        "persist_interval_s": 0.2, "mqtt": FAST_MQTT,
        "plugins": {name: FAST_PLUGINS.get(name, {}) for name in plugins},
    }
    agent: Dict[str, Any] = {
        "fleet": fleet, "device_id": "wheel-01", "model": MODEL,
        "sensor": {"kind": "synthetic", "windows_per_s": 100.0, "window_len": 8, "stride": 4,
                   "channels": 3, "num_classes": 4, "schedule": "all"},
        "dvfs": {"backend": "none"}, "buffer_capacity": 64, "min_buffer": 16,
        "round_interval_s": 0.5, "telemetry_interval_s": 1.0, "mqtt": FAST_MQTT,
        # Every agent plug-in runs; these keep their per-round statistics small.
        "plugins": {"clp": {"fisher_samples": 4}, "schedule": {"stat_windows": 4},
                    "importance": {"sample_windows": 16}},
    }
    (tmp_path / "coordinator.yaml").write_text(yaml.safe_dump(coordinator))
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(agent))
    common = ["--broker", mqtt_broker.host, "--port", str(mqtt_broker.port), "--fleet", fleet,
              "--log-level", "INFO"]
    run_dir = tmp_path / "run"
    programs = {
        "coordinator": [str(fresh_venv.bin("streamfl-coordinator")),
                        "--config", str(tmp_path / "coordinator.yaml"),
                        "--state-dir", str(tmp_path / "coordinator-state"), "--run-dir", str(run_dir)] + common,
        "agent": [str(fresh_venv.bin("streamfl-agent")), "--config", str(tmp_path / "agent.yaml"),
                  "--state-dir", str(tmp_path / "agent-state")] + common,
    }
    procs: List[subprocess.Popen] = []

    def logs() -> str:
        return "\n".join("---- %s (%s) ----\n%s" % (
            name, "running" if proc.poll() is None else "exit %s" % proc.returncode,
            (tmp_path / (name + ".log")).read_text(errors="replace")[-3000:])
            for name, proc in zip(programs, procs))

    try:
        for name, argv in programs.items():
            procs.append(_spawn(argv, tmp_path / (name + ".log"), fresh_venv, tmp_path))
        aggregated: List[Dict[str, Any]] = []
        deadline = time.monotonic() + 45.0
        while not aggregated:
            dead = [proc for proc in procs if proc.poll() is not None]
            assert not dead and time.monotonic() < deadline, (
                "no update of the agent was aggregated (%s, plug-ins %s)\n%s" % (strategy, plugins, logs()))
            time.sleep(0.2)
            aggregated = [m for m in read_metrics(run_dir / "metrics.jsonl", events=("update",))
                          if m.get("outcome") == "aggregated" and m.get("device") == "wheel-01"]
    finally:
        _stop(procs)
    assert [proc.returncode for proc in procs] == [0, 0], logs()
    record = aggregated[0]
    # The sessions and ST-EWC plug-ins (methods/sessions/initializers, methods/stewc/periods) stamped the
    # update; the agent's SFedPO plug-in (methods/sfedpo/latent) reported its score.
    assert {"session", "period", "sfedpo_score", "balance_factor", "scheduled", "fisher_trace"} <= set(record)
    assert "SFedPO: admitting windows by latent state" in (tmp_path / "agent.log").read_text()
