"""One target's agent run: the installed agent, under emulation in its root, against a native
coordinator and a mosquitto on this machine's loopback, on a fake sysfs tree of the target's board.

The broker (``streamfl.sim.brokers.BrokerProcess``: mosquitto on 127.0.0.1, a config it writes),
the coordinator (the repository's .venv, the demo's configuration with a small mlp) and the
synthetic sensor are the demo's; the fake tree (``streamfl.dvfs.fake.tree``) and the clock check
(the field lab's ``tree_files``: every file of the tree the same after the agent stopped as before
it started) are the field lab's. The agent runs in the host's network namespace (its broker is
127.0.0.1) with the ``powersave`` policy, so it lowers the clocks while it trains and must put
them back on SIGTERM; the lab also checks the tree did change while it ran.
"""
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from emulation import Emulation
from targets import Target
from unit import Unit, ids

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
FLEET = "boardlab"
#: The fake sysfs tree's place inside the root (the agent's ``dvfs.sysfs_root``).
TREE_IN_ROOT = "/var/lib/streamfl-boardlab/sys"
#: The clock policy: one that lowers clocks, so "restored" means something.
POLICY = "powersave"
#: Seconds between the agent's rounds: short, since each round is slow under emulation anyway.
ROUND_INTERVAL_S = 2.0


def _field_lab():
    """The field lab's module (field/ is a folder of scripts, not a package)."""
    name = "streamfl_field_lab"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, str(REPO / "field" / "lab.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def tree_files(root: Path) -> Dict[str, str]:
    return _field_lab().tree_files(root)


def clocks_restored(before: Dict[str, str], after: Dict[str, str]) -> Dict[str, Any]:
    """Whether every file of the tree is back as it was, and which are not (at most 10)."""
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    return {"clocks_restored": bool(before) and not changed, "clocks_not_restored": changed[:10]}


def agent_settings(target: Target, port: int, state_dir: str) -> Dict[str, Any]:
    """The agent's YAML: the demo's synthetic board, the lab's broker, the fake tree."""
    from streamfl.sim.demo import DemoOptions, agent_config
    cfg = agent_config(DemoOptions(model="mlp", seed=0, windows_per_s=10.0), 0)
    cfg.update({"fleet": FLEET, "device_id": "boardlab-%s" % target.suite, "board": target.board,
                "state_dir": state_dir, "round_interval_s": ROUND_INTERVAL_S,
                "telemetry_interval_s": 5.0, "predict": {"enabled": False},
                "mqtt": {"host": "127.0.0.1", "port": port, "keepalive_s": 30,
                         "reconnect_min_s": 0.5, "reconnect_max_s": 5.0},
                "dvfs": {"backend": "sysfs", "sysfs_root": TREE_IN_ROOT, "policy": POLICY,
                         "emulate_speed": False}})
    cfg["model"]["hidden"] = 32
    return cfg


def coordinator_settings(run_dir: Path, eval_path: Path) -> Dict[str, Any]:
    from streamfl.sim.demo import DemoOptions, coordinator_config
    cfg = coordinator_config(DemoOptions(model="mlp", seed=0), run_dir)
    cfg.update({"fleet": FLEET, "eval_path": str(eval_path),
                "mqtt": {"reconnect_min_s": 0.5, "reconnect_max_s": 5.0}})
    cfg["model"]["hidden"] = 32
    return cfg


def rounds_of(metrics: List[Dict[str, Any]], device: str) -> Dict[str, Any]:
    """The device's updates as the coordinator recorded them: how many, how many aggregated, the
    training seconds of each round (samples x seconds per sample) and the gaps between them."""
    ups = [m for m in metrics if m.get("event") == "update" and m.get("device") == device]
    train_s = sorted(float(m.get("num_samples") or 0) * float(m.get("seconds_per_sample") or 0) for m in ups)
    walls = sorted(float(m["wall_s"]) for m in ups if isinstance(m.get("wall_s"), (int, float)))
    gaps = sorted(b - a for a, b in zip(walls, walls[1:]))
    med = lambda xs: round(xs[len(xs) // 2], 2) if xs else None  # noqa: E731
    return {"rounds": len(ups), "aggregated": sum(1 for m in ups if m.get("aggregated")),
            "train_s_per_round": med(train_s), "s_between_rounds": med(gaps)}


def read_metrics(run_dir: Path) -> List[Dict[str, Any]]:
    return _field_lab().read_lines(sorted(run_dir.glob("metrics*.jsonl")))


def peak_rss_mib(pid: int) -> Optional[float]:
    """VmHWM of a running process: under binfmt the agent's own process, qemu's translation
    cache included (the emulated program's memory alone is not seen from outside)."""
    try:
        for line in Path("/proc/%d/status" % pid).read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024.0, 1)
    except (OSError, ValueError):
        pass
    return None


class AgentRun:
    """Broker, coordinator and the installed agent for one target, in ``out``."""

    def __init__(self, target: Target, root: Path, emulation: Emulation, unit: Unit, out: Path,
                 coordinator_python: Path, rounds: int, timeout_s: float, port: int):
        self.target, self.root, self.emulation, self.unit = target, Path(root), emulation, unit
        self.out = Path(out)
        #: The broker's port, chosen before the install: the kit's agent.yaml names it.
        self.port = port
        self.coordinator_python = coordinator_python
        self.rounds, self.timeout_s = rounds, timeout_s

    def _host(self, path_in_root: str) -> Path:
        return self.root / path_in_root.lstrip("/")

    def _prepare_unit_dirs(self, uid: int, gid: int) -> str:
        """What systemd does before ExecStart: StateDirectory= made and given to the user."""
        state = self.unit.option("--state-dir")
        if self.unit.state_directory:
            made = "/var/lib/%s" % self.unit.state_directory
            path = self._host(made)
            path.mkdir(parents=True, exist_ok=True)
            os.chown(str(path), uid, gid)
            os.chmod(str(path), int(self.unit.state_directory_mode, 8))
            state = state or made
        return state or "/var/lib/streamfl-agent"

    def _stop(self, agent, timeout_s: float = 60.0) -> Optional[int]:
        """SIGTERM to the agent's own process, as systemd sends it, and its exit code; SIGKILL
        after ``timeout_s`` (the unit's TimeoutStopSec), then None."""
        if agent.alive:
            try:
                os.kill(self.emulation.program_pid(agent.popen.pid), signal.SIGTERM)
            except OSError:
                pass
            try:
                agent.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                for pid in [self.emulation.program_pid(agent.popen.pid), agent.popen.pid]:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                agent.stop(signal.SIGKILL, timeout_s=10)
                return None
        agent.stop(signal.SIGTERM, timeout_s=1)  # closes its log
        return agent.popen.returncode

    def run(self) -> Dict[str, Any]:
        from streamfl.dvfs.fake.tree import build_tree
        from streamfl.sim.brokers import BrokerProcess
        from streamfl.sim.demo import write_eval_set
        import yaml
        fl = _field_lab()
        self.out.mkdir(parents=True, exist_ok=True)
        rec: Dict[str, Any] = {"board": self.target.board, "policy": POLICY}
        uid, gid = ids(self.root, self.unit.user, self.unit.group)
        rec["ran_as"] = "%s (uid %d)" % (self.unit.user, uid)
        tree = self._host(TREE_IN_ROOT)
        if tree.exists():
            subprocess.run(["rm", "-rf", str(tree)], check=True)
        build_tree(tree, self.target.board)
        for dirpath, dirnames, filenames in os.walk(str(tree)):
            for name in [dirpath] + [os.path.join(dirpath, n) for n in filenames]:
                if not os.path.islink(name):
                    os.chown(name, uid, gid)  # on a board the udev rule or tmpfiles grants these
        before = tree_files(tree)
        state = self._prepare_unit_dirs(uid, gid)
        broker = BrokerProcess(self.out / "broker", port=self.port, host="127.0.0.1", kind="mosquitto")
        coordinator = agent = None
        changed_while_running = False
        peak = None
        try:
            broker.start()
            eval_path = self.out / "eval.npz"
            write_eval_set(eval_path, 0)
            run_dir = self.out / "coordinator-run"
            run_dir.mkdir(exist_ok=True)
            cfg_path = self.out / "coordinator.yaml"
            cfg_path.write_text(yaml.safe_dump(coordinator_settings(run_dir, eval_path)))
            coordinator = fl.Proc("coordinator", [
                str(self.coordinator_python), "-m", "streamfl.coordinator", "--config", str(cfg_path),
                "--broker", "127.0.0.1", "--port", str(broker.port),
                "--state-dir", str(self.out / "coordinator-state"), "--run-dir", str(run_dir),
                "--log-level", "INFO"], self.out / "coordinator.log", self.out)
            config_in_root = self.unit.option("--config") or "/etc/streamfl/agent.yaml"
            config = self._host(config_in_root)
            if config.is_file():  # the kit's, as the install script put it
                rec["config_from"] = "the kit, installed by the install script"
            else:
                config.parent.mkdir(parents=True, exist_ok=True)
                config.write_text(yaml.safe_dump(agent_settings(self.target, broker.port, state)))
                os.chown(str(config), 0, gid)
                os.chmod(str(config), 0o640)
                rec["config_from"] = "written by the lab"
            device = "boardlab-%s" % self.target.suite
            argv = self.emulation.command(self.root, self.unit.exec_start, user=(uid, gid),
                                          env=self.unit.environment)
            started = time.monotonic()
            agent = fl.Proc("agent", argv, self.out / "agent.log", self.out)
            seen: Dict[str, Any] = {"rounds": 0, "aggregated": 0}
            while time.monotonic() - started < self.timeout_s:
                if not agent.alive:
                    rec.setdefault("failures", []).append("the agent exited by itself (%s)" % agent.popen.returncode)
                    break
                if not coordinator.alive:
                    rec.setdefault("failures", []).append("the coordinator exited (%s)" % coordinator.popen.returncode)
                    break
                seen = rounds_of(read_metrics(run_dir), device)
                if not changed_while_running and tree_files(tree) != before:
                    changed_while_running = True
                if seen["aggregated"] >= self.rounds:
                    break
                peak = peak_rss_mib(self.emulation.program_pid(agent.popen.pid)) or peak
                time.sleep(2.0)
            rec["agent_wall_s"] = round(time.monotonic() - started, 1)
            peak = peak_rss_mib(self.emulation.program_pid(agent.popen.pid)) or peak
            rec["agent_exit"] = self._stop(agent)
            rec.update(clocks_restored(before, tree_files(tree)))
            rec["clocks_changed_while_running"] = changed_while_running
            if self.unit.exec_stop_post:
                done = subprocess.run(self.emulation.command(self.root, self.unit.exec_stop_post,
                                                             user=(uid, gid), env=self.unit.environment),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
                rec["exec_stop_post_exit"] = done.returncode
                with open(self.out / "agent.log", "ab") as fh:
                    fh.write(b"\n--- ExecStopPost ---\n" + done.stdout)
            time.sleep(3.0)  # the coordinator records what came in last
            rec.update(rounds_of(read_metrics(run_dir), device))
        finally:
            if agent is not None and agent.alive:
                self._stop(agent, timeout_s=10)
            if coordinator is not None:
                rec["coordinator_exit"] = coordinator.stop(signal.SIGTERM, timeout_s=40)
            broker.stop()
        rec["agent_rss_mib"] = peak
        return rec
