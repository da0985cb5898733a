#!/usr/bin/env python3
"""The field lab: a fleet of boards in their own network namespaces against the shipped broker.

``make field`` (``python field/lab.py``) plays every scenario of ``SCENARIOS``; ``--short`` the
three of ``SHORT`` (what ``make test`` and ``.ci/run`` run, tests/test_field_lab.py). Each
scenario stands up a fresh fleet:

- mosquitto from the SHIPPED ``configs/mosquitto/streamfl.conf`` and ``acl`` (``field/broker.py``:
  TLS, a password per account, one ACL block per board, ``use_username_as_clientid``), plus the
  lab's read-only witness account (``witness.py``);
- one coordinator (``--method fedasync+balance-rest``, TLS, its account and password file, an
  evaluation set), in the hub namespace beside the broker;
- ``--boards`` boards (6), each an agent installed from the built wheel into its own venv
  (``install.py``) and run in its own network namespace with its own hostname and address
  (``net.py``), over a Wi-Fi-like or a cellular-like link (every other board), with the fake
  sysfs tree of a Jetson Orin Nano (``streamfl.dvfs.fake``) and the ``powersave`` clock policy,
  so that "clocks restored" is checked on a tree that behaves like the kernel.

The run: warm up (every board has updates through), note accuracy and version, play the fault,
let the fleet recover (every board has updates through again), stop the boards (SIGTERM: clocks
must be back), wait for the coordinator to account for every update, stop it, and print one JSON
record. "acknowledged" is what the witness saw the broker take (a superset of the PUBACKed
updates, see ``witness.py``); "lost" is an acknowledged update no coordinator process of the run
recorded in any ``metrics.jsonl`` line (aggregated or under a named outcome). A "reset" is a global
model on the retained topic with a lower version than one published before it, or of another run.
A scenario fails on any lost update, any reset, any clock not restored, a board that sent nothing
after the fault, or a process that did not start; the lab's exit code is 1 then.

Outer and inner process: the outer one (root namespace) checks the prerequisites, removes what a
crashed run left, builds the wheels and venvs, creates the hub namespace and runs itself again
inside it (``--inner``); it removes every namespace when the inner one ends, however it ends.
"""
import argparse
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import install  # noqa: E402
import net  # noqa: E402

log = logging.getLogger("field")

METHOD = "fedasync+balance-rest"
FLEET = "field"
BROKER_PORT = 8883
RELAY_BASE_PORT = 18800
#: Exit code of a lab that could not run here (a prerequisite missing), told apart from a failure.
EXIT_PREREQUISITE = 3


# ---- processes ----------------------------------------------------------------------------------

class Proc:
    """One child process with its own log file."""

    def __init__(self, name: str, argv: List[str], log_path: Path, cwd: Path,
                 env: Optional[Dict[str, str]] = None):
        self.name = name
        self.log_path = log_path
        #: How far this process's clock is off (its log lines' times), in seconds.
        self.clock_offset_s = 0.0
        self._log = open(log_path, "ab")
        self.popen = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, cwd=str(cwd),
                                      env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 40.0) -> Optional[int]:
        """``sig`` and wait; SIGKILL past ``timeout_s``. The exit code (None: had to be killed)."""
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
                self._log.close()
                return None
        self._log.close()
        return self.popen.returncode

    def text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def tree_files(root: Path) -> Dict[str, str]:
    """Every regular file of a fake sysfs tree and its contents (what "clocks restored" compares)."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            try:
                out[str(path.relative_to(root))] = path.read_text(errors="replace")
            except OSError:
                pass
    return out


def read_lines(paths: List[Path]) -> List[Dict[str, Any]]:
    out = []
    for path in paths:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
    return out


# ---- one fleet ----------------------------------------------------------------------------------

class Fleet:
    """The broker, witness, coordinator(s) and boards of one scenario, in ``folder``."""

    def __init__(self, lab: "Lab", name: str):
        import broker as broker_mod
        import witness as witness_mod
        self.lab = lab
        self.name = name
        self.dir = lab.out / name
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.witness_mod = witness_mod
        self.devices = [b.device_id for b in lab.boards[:lab.n_boards]]
        self.broker = broker_mod.ShippedBroker(
            self.dir / "broker", devices=self.devices, port=BROKER_PORT, bind=net.HUB_ADDR,
            accounts=tuple(broker_mod.DEFAULT_ACCOUNTS) + (witness_mod.ACCOUNT,))
        self.witness = None
        self.coordinators: List[Proc] = []
        self.coordinator: Optional[Proc] = None
        self.agents: Dict[int, Proc] = {}
        #: Agent processes of a board started again (their logs still count).
        self.old_agents: List[Proc] = []
        self.trees: Dict[int, Dict[str, str]] = {}
        self.clocks: Dict[str, bool] = {}
        self.board_exits: Dict[str, Optional[int]] = {}
        self.coordinator_exits: List[Optional[int]] = []
        self.mounts: List[Path] = []
        self.notes: List[str] = []
        self.coordinator_python: Optional[Path] = None

    # -- broker, witness, coordinator --
    def start_broker(self) -> None:
        self.broker.prepare()
        with open(self.broker.acl_path, "a") as fh:
            fh.write(self.witness_mod.ACL_BLOCK)
        self.broker.start()
        self.witness = self.witness_mod.Witness(net.HUB_ADDR, BROKER_PORT, str(self.broker.ca_file),
                                                self.broker.password(self.witness_mod.ACCOUNT),
                                                FLEET, self.lab.model_spec())

    def coordinator_config(self, run_dir: Path) -> Path:
        from streamfl.sim.demo import DemoOptions, coordinator_config
        cfg = coordinator_config(DemoOptions(model="mlp", seed=0), run_dir)
        cfg["fleet"] = FLEET
        cfg["model"]["hidden"] = 32
        cfg["eval_path"] = str(self.lab.eval_path)
        cfg["mqtt"] = {"reconnect_min_s": 0.5, "reconnect_max_s": 5.0}
        cfg.update(self.lab.probe_config(self.broker))
        path = run_dir.parent / ("%s.yaml" % run_dir.name)
        import yaml
        path.write_text(yaml.safe_dump(cfg))
        return path

    def start_coordinator(self, python: Optional[Path] = None, tag: str = "coordinator",
                          state: str = "coordinator-state", run: str = "run") -> Proc:
        run_dir = self.dir / run
        run_dir.mkdir(exist_ok=True)
        python = python or self.coordinator_python or self.lab.pythons["coordinator"]
        argv = [str(python), "-m", "streamfl.coordinator",
                "--config", str(self.coordinator_config(run_dir)), "--broker", net.HUB_ADDR,
                "--port", str(BROKER_PORT), "--tls-ca", str(self.broker.ca_file),
                "--username", "coordinator", "--password-file",
                str(self.broker.password_file("coordinator")), "--method", METHOD,
                "--state-dir", str(self.dir / state), "--run-dir", str(run_dir), "--log-level", "INFO"]
        n = sum(1 for p in self.coordinators if p.name == tag)
        proc = Proc(tag, argv, self.dir / ("%s-%d.log" % (tag, n + 1)), self.dir)
        self.coordinators.append(proc)
        return proc

    def wait_model(self, timeout_s: float = 120.0) -> None:
        def ready():
            if not self.coordinator.alive:
                raise RuntimeError("the coordinator exited (%s) before its first model:\n%s" % (
                    self.coordinator.popen.returncode, self.coordinator.text()[-1500:]))
            return self.witness.latest_version() is not None
        if not self.wait(ready, timeout_s, "the coordinator's first global model"):
            raise RuntimeError("no global model within %.0f s" % timeout_s)

    # -- boards --
    def agent_config(self, board: net.Board, state: Path, tree: Path) -> Path:
        from streamfl.sim.demo import DemoOptions, agent_config
        cfg = agent_config(DemoOptions(model="mlp", seed=0, windows_per_s=10.0), board.index - 1)
        cfg["fleet"] = FLEET
        cfg["device_id"] = board.device_id
        cfg["board"] = "jetson-orin-nano"
        cfg["model"]["hidden"] = 32
        cfg["state_dir"] = str(state)
        cfg["round_interval_s"] = 2.0
        cfg["telemetry_interval_s"] = 5.0
        cfg["predict"] = {"enabled": False}
        port = BROKER_PORT if board.netem else RELAY_BASE_PORT + board.index
        cfg["mqtt"] = {"host": net.HUB_ADDR, "port": port, "tls_ca": str(self.broker.ca_file),
                       "username": board.device_id,
                       "password_file": str(self.broker.password_file(board.device_id)),
                       "keepalive_s": 15, "reconnect_min_s": 0.5, "reconnect_max_s": 5.0}
        cfg["dvfs"] = {"backend": "sysfs", "sysfs_root": str(tree), "policy": "powersave",
                       "emulate_speed": False}
        import yaml
        path = state.parent / "agent.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    def start_board(self, index: int, faketime: Optional[str] = None, state_size: Optional[str] = None) -> Proc:
        from streamfl.dvfs.fake.tree import build_tree
        board = self.lab.boards[index - 1]
        folder = self.dir / ("board-%02d" % index)
        folder.mkdir(exist_ok=True)
        state = folder / "state"
        state.mkdir(exist_ok=True)
        if state_size:
            net.sh("mount", "-t", "tmpfs", "-o", "size=%s" % state_size, "sfl-field-state", str(state))
            self.mounts.append(state)
        tree = folder / "sys"
        if not tree.exists():
            build_tree(tree, "jetson-orin-nano", "jp5")
            self.trees[index] = tree_files(tree)
        config = self.agent_config(board, state, tree)
        env_words = []
        if faketime:
            env_words = ["LD_PRELOAD=%s" % self.lab.faketime_lib, "FAKETIME=%s" % faketime,
                         "FAKETIME_DONT_FAKE_MONOTONIC=1", "FAKETIME_NO_CACHE=1"]
        argv = ["ip", "netns", "exec", board.ns, "unshare", "--uts", "--", "sh", "-c",
                'hostname "$0" && exec "$@"', board.hostname, "env"] + env_words + [
                str(self.lab.pythons["board-%02d" % index]), "-m", "streamfl.agent", "--config",
                str(config), "--log-level", "INFO"]
        if index in self.agents:
            self.old_agents.append(self.agents[index])
        n = sum(1 for p in list(self.agents.values()) + self.old_agents if p.name == board.name)
        proc = Proc(board.name, argv, folder / ("agent-%d.log" % (n + 1)), folder)
        if faketime:
            proc.clock_offset_s = FAKETIME_OFFSETS_S[faketime]
        self.agents[index] = proc
        return proc

    def stop_board(self, index: int) -> None:
        proc = self.agents.get(index)
        if proc is None:
            return
        code = proc.stop()
        name = self.lab.boards[index - 1].name
        self.board_exits[name] = code
        tree = self.dir / ("board-%02d" % index) / "sys"
        self.clocks[name] = tree_files(tree) == self.trees.get(index)

    # -- waiting --
    def wait(self, predicate: Callable[[], Any], timeout_s: float, what: str) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.5)
        self.notes.append("timed out (%.0f s) waiting for %s" % (timeout_s, what))
        log.warning("%s: timed out waiting for %s", self.name, what)
        return False

    def wait_updates(self, devices: List[str], each: int, since: float, timeout_s: float, what: str) -> bool:
        def done():
            seen = self.witness.per_device(since)
            return all(seen.get(d, 0) >= each for d in devices)
        return self.wait(done, timeout_s, what)

    def metrics_files(self) -> List[Path]:
        return sorted(self.dir.glob("run*/**/metrics*.jsonl")) + sorted(self.dir.glob("run*/metrics*.jsonl"))

    def accounted(self) -> Dict[str, List[Dict[str, Any]]]:
        lines = defaultdict(list)
        for rec in read_lines(sorted(set(self.metrics_files()))):
            if rec.get("event") == "update" and rec.get("update_id") is not None:
                lines[str(rec["update_id"])].append(rec)
        return lines

    def accuracy(self, before_wall: Optional[float] = None) -> Optional[float]:
        evals = [r for r in read_lines(sorted(set(self.metrics_files()))) if r.get("event") == "eval"
                 and isinstance(r.get("accuracy"), (int, float))]
        if before_wall is not None:
            evals = [r for r in evals if float(r.get("wall_s") or 0) <= before_wall]
        return round(float(evals[-1]["accuracy"]), 4) if evals else None

    def shutdown(self) -> None:
        for index in list(self.agents):
            if self.agents[index].alive:
                self.stop_board(index)
        for proc in self.coordinators:
            if proc.alive:
                self.coordinator_exits.append(proc.stop())
        if self.witness is not None:
            self.witness.close()
        self.broker.stop()
        for mount in self.mounts:
            net.sh("umount", "-l", str(mount), check=False)
        self.mounts = []


# ---- scenarios ----------------------------------------------------------------------------------

class Scenario:
    """A name, what it does to the fleet (``fault``), and board options at start."""

    def __init__(self, name: str, fault: Callable[["Fleet", "Lab"], None], what: str,
                 board_opts: Optional[Dict[int, Dict[str, Any]]] = None,
                 needs: Callable[["Lab"], Optional[str]] = lambda lab: None,
                 expect: Callable[[Dict[str, Any]], List[str]] = lambda rec: []):
        self.name, self.fault, self.what = name, fault, what
        self.board_opts = board_opts or {}
        self.needs = needs
        #: What this scenario demands beyond the common bounds: failures, from its record.
        self.expect = expect


def _restart_coordinator(sig: int) -> Callable[[Fleet, "Lab"], None]:
    def fault(fleet: Fleet, lab: "Lab") -> None:
        fleet.coordinator_exits.append(fleet.coordinator.stop(sig))
        time.sleep(lab.args.down_s)  # the boards keep training and sending meanwhile
        fleet.coordinator = fleet.start_coordinator()
    return fault


def _upgrade(fleet: Fleet, lab: "Lab") -> None:
    python = lab.pythons["coordinator-upgrade"]
    fleet.coordinator_exits.append(fleet.coordinator.stop(signal.SIGTERM))
    started = time.monotonic()
    version = install.install_wheel(python, lab.wheels["next"], lab.house)
    fleet.notes.append("upgraded the coordinator's venv to %s in %.1f s" % (version, time.monotonic() - started))
    lab.software.setdefault(fleet.name, []).append(version)
    time.sleep(max(0.0, lab.args.down_s - (time.monotonic() - started)))
    fleet.coordinator = fleet.start_coordinator()


def _broker_restart(fleet: Fleet, lab: "Lab") -> None:
    fleet.broker.restart(down_s=lab.args.down_s)


def _cut(fleet: Fleet, lab: "Lab") -> None:
    board = lab.boards[1]
    board.cut()
    try:
        time.sleep(lab.args.cut_s)
    finally:
        board.restore()


def _loss(fleet: Fleet, lab: "Lab") -> None:
    board = lab.boards[2]
    board.set_loss(20)
    fleet.notes.append("%s at 20%% loss each way from the fault to the end" % board.name)
    time.sleep(lab.args.hold_s)


def _clone(fleet: Fleet, lab: "Lab") -> None:
    index = lab.n_boards + 1  # a board in its own namespace with board 1's device id
    fleet.start_board(index)
    time.sleep(lab.args.hold_s)
    fleet.stop_board(index)


def _second_coordinator(fleet: Fleet, lab: "Lab") -> None:
    second = fleet.start_coordinator(tag="coordinator-second", state="coordinator-second-state",
                                     run="run-second")
    deadline = time.monotonic() + lab.args.hold_s
    while time.monotonic() < deadline and second.alive:
        time.sleep(0.5)
    code = second.stop()
    fleet.notes.append("the second coordinator %s" % (
        "exited by itself with code %s" % code if code is not None and time.monotonic() < deadline
        else "ran for %.0f s and was stopped (exit %s)" % (lab.args.hold_s, code)))
    fleet.coordinator_exits.append(code)


def _disk_full(fleet: Fleet, lab: "Lab") -> None:
    state = fleet.dir / "board-04" / "state"
    filler = state / "filler"
    with open(filler, "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError:
            pass
    fleet.notes.append("board-04's state folder (tmpfs) filled to %d free bytes" % shutil.disk_usage(state).free)
    time.sleep(lab.args.hold_s)
    filler.unlink()


def _clock(fleet: Fleet, lab: "Lab") -> None:
    time.sleep(lab.args.hold_s)


def _clone_reported(rec: Dict[str, Any]) -> List[str]:
    """Both sides must say in words that one device id runs twice: a warning naming
    ``device id field-01`` from the boards and one from a coordinator."""
    words = "device id field-01"
    out = []
    for side, said in (("boards", rec.get("warnings_of_boards")), ("coordinator", rec.get("warnings_of_coordinators"))):
        if not any(words in (entry.get("said") or []) or words in entry.get("first", "")
                   for entry in (said or {}).values()):
            out.append("the %s said nothing naming %r" % (side, words))
    return out


def _needs_faketime(lab: "Lab") -> Optional[str]:
    return None if lab.faketime_lib else "no libfaketime (apt-get install faketime)"


#: The libfaketime offsets the lab uses, in seconds (to read those boards' log times).
FAKETIME_OFFSETS_S = {"+1h": 3600.0}

SCENARIOS = [
    Scenario("coordinator-sigterm", _restart_coordinator(signal.SIGTERM),
             "coordinator stopped (SIGTERM), down for --down-s, started again on the same state"),
    Scenario("coordinator-sigkill", _restart_coordinator(signal.SIGKILL),
             "coordinator killed (SIGKILL), down for --down-s, started again on the same state"),
    Scenario("coordinator-upgrade", _upgrade,
             "coordinator stopped, a wheel of the next version installed into its venv, started "
             "again on the same state"),
    Scenario("broker-restart", _broker_restart, "mosquitto stopped (SIGTERM), down for --down-s, started"),
    Scenario("board-cut", _cut, "board-02's veth taken down for --cut-s (300 s in the full lab)"),
    Scenario("link-loss-20", _loss, "board-03's link at 20% packet loss each way (nftables)"),
    Scenario("duplicate-id", _clone, "a 7th board in its own namespace with board-01's device id "
             "and credentials, for --hold-s", expect=_clone_reported),
    Scenario("second-coordinator", _second_coordinator,
             "a second coordinator on the same account (own state and run folders) for --hold-s"),
    Scenario("disk-full", _disk_full, "board-04's state folder is a 4 MiB tmpfs; it is filled "
             "for --hold-s, then freed", board_opts={4: {"state_size": "4m"}}),
    Scenario("clock-offset", _clock, "board-05 runs with its clock an hour ahead (libfaketime "
             "FAKETIME=+1h, monotonic time left true) from its start", board_opts={5: {"faketime": "+1h"}},
             needs=_needs_faketime),
]
BY_NAME = {s.name: s for s in SCENARIOS}
#: What the short lab plays: the issue's three worst findings (a clean restart losing updates,
#: a second coordinator resetting the fleet, two boards with one id fighting forever).
SHORT = ("coordinator-sigterm", "second-coordinator", "duplicate-id")


# ---- the lab ------------------------------------------------------------------------------------

class Lab:
    def __init__(self, args, manifest: Dict[str, Any]):
        self.args = args
        self.out = Path(manifest["out"])
        self.pythons = {k: Path(v) for k, v in manifest["pythons"].items()}
        self.wheels = {k: Path(v) for k, v in manifest["wheels"].items()}
        self.house = Path(manifest["house"])
        self.faketime_lib = manifest.get("faketime_lib")
        self.n_boards = int(manifest["boards"])
        self.netem = bool(manifest["netem"])
        self.software: Dict[str, List[str]] = {}
        self.eval_path = self.out / "eval.npz"
        self.boards: List[net.Board] = []
        for i in range(1, self.n_boards + 2):  # the last one: the clone of board 1
            profile = net.WIFI if i % 2 else net.CELLULAR
            board = net.Board(i, "board-%02d" % i, profile, self.netem)
            board.device_id = "field-%02d" % (1 if i == self.n_boards + 1 else i)
            board.hostname = "board-%02d" % i
            self.boards.append(board)
        self.relay = None
        self._probe_keys = manifest.get("probe_keys", [])

    def model_spec(self):
        from streamfl.models import ModelSpec
        return ModelSpec(name="mlp", in_channels=6, window_len=50, num_classes=6, hidden=32)

    def probe_config(self, broker) -> Dict[str, Any]:
        """The coordinator probe's own account, where the installed coordinator has the keys."""
        keys = set(self._probe_keys)
        section = {}
        if "probe_username" in keys:
            section["probe_username"] = "coordinator-probe"
        if "probe_password_file" in keys:
            section["probe_password_file"] = str(broker.password_file("coordinator-probe"))
        return {"exclusive": section} if section else {}

    def setup(self) -> None:
        from streamfl.sim.demo import write_eval_set
        self.out.mkdir(parents=True, exist_ok=True)
        write_eval_set(self.eval_path, 0)
        for board in self.boards:
            board.create()
        if not self.netem:
            from relay import DelayRelay
            self.relay = DelayRelay((net.HUB_ADDR, BROKER_PORT))
            for board in self.boards:
                self.relay.listen(board.name, net.HUB_ADDR, RELAY_BASE_PORT + board.index,
                                  board.profile.delay_ms)

    def teardown(self) -> None:
        if self.relay is not None:
            self.relay.stop()
        for board in self.boards:
            board.delete()

    def shaping(self) -> Dict[str, Any]:
        return {"delay": "netem" if self.netem else "TCP relay in the hub (no netem in this kernel)",
                "rate": "tc tbf on both ends of each veth", "loss": "nftables numgen random in "
                "each board's namespace", "cut": "the veth's hub end down",
                "profiles": {p.name: {"rate_kbit": p.rate_kbit, "loss_pct": p.loss_pct,
                                      "delay_ms_each_way": p.delay_ms} for p in net.PROFILES.values()},
                "links": [b.applied() for b in self.boards[:self.n_boards]]}

    def play(self, scenarios: List[Scenario]) -> List[Dict[str, Any]]:
        """Play ``scenarios`` one after another on one fresh fleet; one record each.

        Alone (the full lab), a scenario has the fleet to itself. Chained (``--short``), each
        record covers its window: the updates the witness first saw and the models published from
        the end of the previous scenario's recovery to the end of its own; the boards stop, and
        their clocks are compared, once, after the last one (each record carries that result).
        """
        started = time.monotonic()
        name = scenarios[0].name if len(scenarios) == 1 else "chain-" + "+".join(s.name for s in scenarios)
        fleet = Fleet(self, name)
        windows: List[Dict[str, Any]] = []
        failures: List[str] = []
        opts: Dict[int, Dict[str, Any]] = {}
        for scenario in scenarios:
            for i, o in scenario.board_opts.items():
                opts.setdefault(i, {}).update(o)
        try:
            for board in self.boards[:self.n_boards]:
                board.set_loss(board.profile.loss_pct)
                if not board.up:
                    board.restore()
            fleet.start_broker()
            if any(s.name == "coordinator-upgrade" for s in scenarios):
                # its own venv: the upgrade replaces its wheel, the other scenarios keep theirs
                fleet.coordinator_python = self.pythons["coordinator-upgrade"]
                self.software[name] = [install.install_wheel(fleet.coordinator_python,
                                                             self.wheels["current"], self.house)]
            fleet.coordinator = fleet.start_coordinator()
            for i in range(1, self.n_boards + 1):  # the boards wait for the first model themselves
                fleet.start_board(i, **opts.get(i, {}))
            fleet.wait_model()
            if not fleet.wait_updates(fleet.devices, 2, float("-inf"), self.args.warm_timeout_s,
                                      "2 updates from every board (warm-up)"):
                failures.append("warm-up: not every board had 2 updates through")
            time.sleep(self.args.warm_s)
            begin = float("-inf")
            for scenario in scenarios:
                window = {"scenario": scenario, "begin": begin, "failures": list(failures),
                          "notes_from": len(fleet.notes)}
                windows.append(window)
                failures = []
                if not fleet.coordinator.alive:
                    window["failures"].append("the coordinator was not running at the fault (exit %s): "
                                              "started again" % fleet.coordinator.popen.returncode)
                    fleet.coordinator = fleet.start_coordinator()
                window["wall_fault"] = time.time()
                window["fault_at"] = time.monotonic()
                window["version_at_fault"] = fleet.witness.latest_version()
                log.info("%s: fault: %s", scenario.name, scenario.what)
                try:
                    scenario.fault(fleet, self)
                    before = window["version_at_fault"] or 0
                    if not fleet.wait(lambda: (fleet.witness.latest_version() or 0) > before,
                                      self.args.recover_timeout_s, "a global model newer than v%d" % before):
                        window["failures"].append("no recovery: no global model after v%d" % before)
                    recovered = time.monotonic()
                    if not fleet.wait_updates(fleet.devices, 2, recovered, self.args.recover_timeout_s,
                                              "2 updates from every board after the fault"):
                        seen = fleet.witness.per_device(recovered)
                        window["failures"].append("no recovery: updates after the fault per board %s"
                                                  % {d: seen.get(d, 0) for d in fleet.devices})
                except Exception as exc:  # noqa: BLE001 - the record says what broke
                    log.exception("%s broke", scenario.name)
                    window["failures"].append("the lab broke: %s" % exc)
                begin = time.monotonic()
                window["end"] = begin
                window["wall_end"] = time.time()
                window["notes_to"] = len(fleet.notes)
            windows[-1]["end"] = float("inf")
            for i in sorted(fleet.agents):
                fleet.stop_board(i)
            fleet.wait(lambda: not set(fleet.witness.snapshot()[0]) - set(fleet.accounted()),
                       self.args.drain_s, "the coordinator to account for every witnessed update")
        except Exception as exc:  # noqa: BLE001 - the record says what broke
            log.exception("%s broke", name)
            failures.append("the lab broke: %s" % exc)
        finally:
            fleet.shutdown()
        if not windows:  # broke before the first fault
            windows.append({"scenario": scenarios[0], "begin": float("-inf"), "end": float("inf"),
                            "failures": [], "notes_from": 0})
        windows[-1]["failures"].extend(failures)
        windows[-1]["end"] = float("inf")
        windows[-1]["notes_to"] = len(fleet.notes)
        played = {w["scenario"].name for w in windows}
        records = [self.record(w, fleet, time.monotonic() - started, len(windows) > 1) for w in windows]
        for scenario in scenarios:
            if scenario.name not in played:
                records.append({"scenario": scenario.name, "ok": False,
                                "failures": ["not played: the lab broke before it (%s)" % "; ".join(failures)]})
        for rec in records:
            (self.out / ("%s.json" % rec["scenario"])).write_text(json.dumps(rec, indent=1, sort_keys=True))
        return records

    def record(self, window: Dict[str, Any], fleet: Fleet, duration_s: float, chained: bool) -> Dict[str, Any]:
        scenario = window["scenario"]
        failures = list(window["failures"])
        begin, end = window["begin"], window["end"]
        fault_at = window.get("fault_at")
        everything, all_models = fleet.witness.snapshot() if fleet.witness else ({}, [])
        witnessed = {uid: v for uid, v in everything.items() if begin <= v[0] < end}
        lines = fleet.accounted()
        counted: Counter = Counter()
        aggregated = 0
        lost_ids = []
        for uid in witnessed:
            recs = lines.get(uid)
            if not recs:
                lost_ids.append(uid)
            elif any(r.get("aggregated") or r.get("outcome") == "aggregated" for r in recs):
                aggregated += 1
            else:
                first = next((r for r in recs if r.get("outcome") != "duplicate"), recs[0])
                reason = str(first.get("outcome"))
                if first.get("reason"):
                    reason += ":%s" % first["reason"]
                counted[reason] += 1
        resets, top, first_run = [], None, None
        for t, version, run_id in all_models:  # the whole run's models: a window starts mid-run
            if first_run is None and run_id:
                first_run = run_id
            if (top is not None and version < top) or (run_id and first_run and run_id != first_run):
                if begin <= t < end:
                    resets.append({"at_s": round(t - (fault_at or t), 1), "version": version,
                                   "after": top, "run_id": run_id, "run_of_the_fleet": first_run})
            top = version if top is None else max(top, version)
        models = [m for m in all_models if begin <= m[0] < end]
        clocks_ok = all(fleet.clocks.values()) and len(fleet.clocks) >= self.n_boards
        if lost_ids:
            failures.append("%d acknowledged update(s) lost" % len(lost_ids))
        if resets:
            failures.append("%d unrequested reset(s) of the fleet's model" % len(resets))
        if not clocks_ok:
            failures.append("clocks not restored on %s" % (
                sorted(b for b, ok in fleet.clocks.items() if not ok) or "any board (not stopped)"))
        logs = {name: sum(p.text().count("lost the broker connection") for p in fleet.agents.values()
                          if p.name == name) for name in sorted({p.name for p in fleet.agents.values()})}
        wall = (window.get("wall_fault") if begin != float("-inf") else None, window.get("wall_end"))
        agents_said = warnings(list(fleet.agents.values()) + fleet.old_agents, *wall)
        coordinators_said = warnings(fleet.coordinators, *wall)
        rec = {
            "scenario": scenario.name, "what": scenario.what, "ok": not failures, "failures": failures,
            "acknowledged": len(witnessed), "aggregated": aggregated, "counted": dict(counted),
            "lost": len(lost_ids), "lost_ids": lost_ids[:10],
            "recorded_not_witnessed": len(set(lines) - set(everything)),
            "versions": {"first": models[0][1] if models else None,
                         "at_fault": window.get("version_at_fault"),
                         "last": models[-1][1] if models else None, "published": len(models)},
            "resets": len(resets), "reset_events": resets[:5],
            "accuracy_before": fleet.accuracy(window.get("wall_fault")),
            "accuracy_after": fleet.accuracy(window.get("wall_end")),
            "clocks_restored": clocks_ok, "clocks": fleet.clocks, "board_exits": fleet.board_exits,
            "coordinator_processes": len(fleet.coordinators), "coordinator_exits": fleet.coordinator_exits,
            "software": self.software.get(fleet.name, [manifest_version(self.wheels["current"])]),
            "broker_disconnects_logged_by_boards": logs,
            "warnings_of_boards": agents_said, "warnings_of_coordinators": coordinators_said,
            "witness_connects": fleet.witness.connects if fleet.witness else 0,
            "undecodable_frames": fleet.witness.undecodable if fleet.witness else 0,
            "notes": fleet.notes[window.get("notes_from", 0):window.get("notes_to", len(fleet.notes))],
            "chained": chained, "duration_s": round(duration_s, 1), "folder": str(fleet.dir),
        }
        failures.extend(scenario.expect(rec))
        rec["ok"] = not failures
        return rec


_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ (WARNING|ERROR|CRITICAL) (\S+): (.*)$")


def warnings(procs: List[Proc], wall_from: Optional[float], wall_to: Optional[float]) -> Dict[str, Any]:
    """What the processes warned about in the window: per logger, how many lines and the first
    one (cut at 240 characters): what an operator reading the logs would have been told. A
    process whose clock is off by ``Proc.clock_offset_s`` has its log times taken back by it."""
    out: Dict[str, Any] = {}
    for proc in procs:
        for line in proc.text().splitlines():
            match = _LOG_LINE.match(line)
            if not match:
                continue
            t = time.mktime(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")) - proc.clock_offset_s
            if (wall_from is not None and t < int(wall_from)) or (wall_to is not None and t > wall_to + 1):
                continue
            entry = out.setdefault(match.group(3), {"lines": 0, "first": "%s %s" % (
                proc.name, match.group(4)[:240])})
            entry["lines"] += 1
            said = entry.setdefault("said", [])
            if "device id" in match.group(4) and len(said) < 3:
                said.append(match.group(4)[:240])
    return out


def manifest_version(wheel: Path) -> str:
    match = re.match(r"streamfl-([^-]+)-", wheel.name)
    return match.group(1) if match else "?"


# ---- outer / inner ------------------------------------------------------------------------------

def faketime_library() -> Optional[str]:
    for pattern in ("/usr/lib/*/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1",
                    "/usr/local/lib/faketime/libfaketime.so.1"):
        import glob
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def prepare(args, scenarios: List[Scenario]) -> Dict[str, Any]:
    """Wheels, wheelhouse, torch layer and venvs; the manifest the inner process reads."""
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    tree = Path(args.tree).resolve() if args.tree else install.ROOT
    wheels = {"current": install.build_wheel(install.CACHE / "wheel", tree)}
    if any(s.name == "coordinator-upgrade" for s in scenarios):
        wheels["next"] = install.build_bumped_wheel(install.CACHE / "wheel-next", tree)
    house = install.wheelhouse()
    layer = install.torch_layer()
    names = ["coordinator"] + ["board-%02d" % i for i in range(1, args.boards + 2)]
    if "next" in wheels:
        names.append("coordinator-upgrade")

    def one(name: str) -> str:
        extras = install.SERVER if name.startswith("coordinator") else ()
        python = install.make_venv(install.CACHE / "venvs" / name, house, layer, extras)
        install.install_wheel(python, wheels["current"], house)
        return str(python)
    # pip is mostly start-up and file copying: three at a time keep two cores busy
    with ThreadPoolExecutor(3) as pool:
        pythons = dict(zip(names, pool.map(one, names)))
    installed = Path(pythons["coordinator"]).parent.parent
    config_src = next(installed.glob("lib/python*/site-packages/streamfl/coordinator/config.py"), None)
    text = config_src.read_text() if config_src else ""
    probe_keys = [k for k in ("probe_username", "probe_password_file") if re.search(r"\b%s\s*:" % k, text)]
    log.info("installs ready in %.0f s: %s", time.monotonic() - t0, ", ".join(w.name for w in wheels.values()))
    return {"out": str(out), "pythons": pythons, "wheels": {k: str(v) for k, v in wheels.items()},
            "house": str(house), "layer": str(layer), "boards": args.boards,
            "netem": net.netem_available(), "faketime_lib": faketime_library(), "probe_keys": probe_keys}


def outer(args, scenarios: List[Scenario]) -> int:
    missing = net.missing_prerequisites()
    if missing:
        print(json.dumps({"summary": "field lab cannot run here", "missing": missing}), flush=True)
        return EXIT_PREREQUISITE
    removed = net.cleanup_leftovers()
    if removed:
        log.warning("removed what an earlier run left: %s", ", ".join(removed))
    manifest = prepare(args, scenarios)
    path = Path(manifest["out"]) / "manifest.json"
    path.write_text(json.dumps(manifest, indent=1))
    inner_argv = [sys.executable, str(Path(__file__).resolve()), "--inner", str(path)] + args.passthrough
    child = None

    def forward(signum, frame):
        if child is not None and child.poll() is None:
            child.send_signal(signum)
    old = signal.signal(signal.SIGTERM, forward)
    old_int = signal.signal(signal.SIGINT, forward)  # Ctrl-C: the inner one cleans up, then we do
    try:
        net.create_hub()
        child = subprocess.Popen(["ip", "netns", "exec", net.HUB] + inner_argv,
                                 env=dict(os.environ, SFL_FIELD_INNER="1"))
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:  # wait for the inner one's cleanup
                continue
    finally:
        signal.signal(signal.SIGTERM, old)
        signal.signal(signal.SIGINT, old_int)
        if child is not None and child.poll() is None:
            child.kill()
            child.wait(10)
        os.environ.pop("SFL_FIELD_INNER", None)
        removed = net.cleanup_leftovers()
        log.info("removed the lab's namespaces: %s", ", ".join(removed) or "none left")


def inner(args, scenarios: List[Scenario], manifest_path: Path) -> int:
    def to_interrupt(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, to_interrupt)
    # explicit: a process started in the background by a shell inherits SIGINT ignored
    signal.signal(signal.SIGINT, to_interrupt)
    manifest = json.loads(manifest_path.read_text())
    lab = Lab(args, manifest)
    records = []
    try:
        lab.setup()
        shaping = lab.shaping()
        (lab.out / "shaping.json").write_text(json.dumps(shaping, indent=1))
        print(json.dumps({"shaping": {k: v for k, v in shaping.items() if k != "links"},
                          "links": [{k: l[k] for k in ("board", "addr", "profile", "delay_by", "loss_by")}
                                    for l in shaping["links"]]}), flush=True)
        groups = [scenarios] if args.one_fleet else [[s] for s in scenarios]
        for group in groups:
            playable = []
            for scenario in group:
                why = scenario.needs(lab)
                if why:
                    rec = {"scenario": scenario.name, "ok": False, "failures": ["cannot play: %s" % why]}
                    records.append(rec)
                    print(json.dumps(rec, sort_keys=True), flush=True)
                else:
                    playable.append(scenario)
            if not playable:
                continue
            log.info("playing %s", ", ".join(s.name for s in playable))
            for rec in lab.play(playable):
                records.append(rec)
                print(json.dumps(rec, sort_keys=True), flush=True)
    finally:
        lab.teardown()
    failed = [r["scenario"] for r in records if not r.get("ok")]
    summary = {"summary": "field lab", "scenarios": len(records), "passed": len(records) - len(failed),
               "failed": failed, "out": str(lab.out)}
    (lab.out / "summary.json").write_text(json.dumps({"summary": summary, "records": records}, indent=1))
    print(json.dumps(summary), flush=True)
    return 1 if failed or len(records) < len(scenarios) else 0


def parse(argv: List[str]):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--short", action="store_true", help="play only %s, with short holds" % ", ".join(SHORT))
    p.add_argument("--scenarios", help="comma-separated names (default: all): %s" % ", ".join(BY_NAME))
    p.add_argument("--boards", type=int, default=6, help="boards in the fleet (at least 6)")
    p.add_argument("--out", default=None, help="output folder (default runs/field/<time>)")
    p.add_argument("--down-s", type=float, default=None, help="how long a stopped coordinator or broker stays down")
    p.add_argument("--cut-s", type=float, default=None, help="how long the cut board stays off (full: 300)")
    p.add_argument("--hold-s", type=float, default=None, help="how long loss, a clone, a second coordinator, a full disk last")
    p.add_argument("--warm-s", type=float, default=5.0, help="seconds of normal running before the fault")
    p.add_argument("--warm-timeout-s", type=float, default=240.0)
    p.add_argument("--recover-timeout-s", type=float, default=180.0)
    p.add_argument("--drain-s", type=float, default=60.0, help="wait for the coordinator to record every update")
    p.add_argument("--one-fleet", action="store_true",
                   help="play the scenarios one after another on one fleet (the default with --short)")
    p.add_argument("--tree", help="build the boards' and coordinators' wheels from this source tree "
                   "instead of this checkout (e.g. an older commit's `git archive`, to see the lab fail "
                   "where that code did)")
    p.add_argument("--inner", help=argparse.SUPPRESS)
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    args.down_s = args.down_s if args.down_s is not None else (15.0 if args.short else 30.0)
    args.cut_s = args.cut_s if args.cut_s is not None else (30.0 if args.short else 300.0)
    args.hold_s = args.hold_s if args.hold_s is not None else (25.0 if args.short else 60.0)
    args.one_fleet = args.one_fleet or args.short
    if args.boards < 6:
        p.error("--boards must be at least 6")
    names = args.scenarios.split(",") if args.scenarios else (list(SHORT) if args.short else list(BY_NAME))
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        p.error("unknown scenario(s) %s; known: %s" % (", ".join(unknown), ", ".join(BY_NAME)))
    args.names = names
    args.out = args.out or str(ROOT / "runs" / "field" / time.strftime("%Y%m%d-%H%M%S"))
    args.passthrough = [a for a in argv if a != "--inner"]
    return args


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s field %(levelname)s %(message)s")
    scenarios = [BY_NAME[n] for n in args.names]
    if args.inner:
        try:
            return inner(args, scenarios, Path(args.inner))
        except KeyboardInterrupt:  # everything it started is stopped and removed by now
            print(json.dumps({"summary": "field lab interrupted"}), flush=True)
            return 130
    if "--out" not in argv:
        args.passthrough += ["--out", args.out]
    return outer(args, scenarios)


if __name__ == "__main__":
    sys.exit(main())
