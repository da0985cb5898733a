"""Integration-test helpers: a coordinator and agents as separate OS processes, configured like the
demo's (``streamfl.sim.demo`` config builders), plus a plain paho client watching the model topic.

Every wait is a poll with a deadline; a timeout or an unexpected process exit raises AssertionError
carrying the tail of every process log and of metrics.jsonl, so a failure says what went wrong.
"""
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import paho.mqtt.client as mqtt
import yaml
from paho.mqtt.enums import CallbackAPIVersion

from streamfl.config import merge
from streamfl.models import ModelSpec, tensor_spec
from streamfl.protocol.codec import Decoder
from streamfl.protocol.messages import GlobalModel
from streamfl.protocol.topics import Topics
from streamfl.sim.demo import FLEET, DemoOptions, agent_config, coordinator_config, write_eval_set
from streamfl.coordinator.metrics import read_metrics

#: Reconnect quickly: the tests take brokers and links away for seconds, not minutes.
FAST_MQTT = {"reconnect_min_s": 0.2, "reconnect_max_s": 1.0}
#: The demo's agent config with a faster round pace (the demo's model, data, buffer and sensor).
#: Its simulated boards keep their top clocks: the demo's clp-aware policy starts at the lowest
#: level, where an emulated Jetson Nano takes half a minute per round, longer than these tests run.
FAST_AGENT = {"round_interval_s": 0.5, "min_buffer": 32, "telemetry_interval_s": 2.0, "mqtt": FAST_MQTT,
              "dvfs": {"policy": "none"}}
FAST_COORDINATOR = {"persist_interval_s": 0.5, "mqtt": FAST_MQTT}



class Proc:
    """One child process writing to its own log file; ``stop`` is SIGTERM, then SIGKILL."""

    def __init__(self, name: str, argv: List[str], log_path: Path, cwd: Path):
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "wb")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.popen = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                      cwd=str(cwd))
        self.expected_exit = False
        self._term_sent = False

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, chars: int = 2500) -> str:
        return self.log_text()[-chars:]

    def send_term(self, sig: int = signal.SIGTERM) -> None:
        """One SIGTERM, as systemd sends (a second one could land after Python restored SIG_DFL
        while exiting and turn a clean exit into -15); ``sig=SIGINT`` for a Ctrl-C."""
        self.expected_exit = True
        if not self._term_sent and self.popen.poll() is None:
            self._term_sent = True
            self.popen.send_signal(sig)

    def terminate(self, timeout_s: float = 30.0, sig: int = signal.SIGTERM) -> Optional[int]:
        """``sig`` and wait; SIGKILL if it does not exit in time. The exit code (None if killed)."""
        self.expected_exit = True
        if self.popen.poll() is None:
            self.send_term(sig)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
                self._close_log()
                return None
        self._close_log()
        return self.popen.returncode

    def kill(self) -> int:
        """SIGKILL, as the OOM killer or a watchdog timeout does: no handler, no cleanup."""
        self.expected_exit = True
        self.popen.kill()
        code = self.popen.wait(10)
        self._close_log()
        return code

    def _close_log(self) -> None:
        if not self._log.closed:
            self._log.close()


class FleetRun:
    """A coordinator and agents started with ``python -m streamfl.coordinator`` / ``-m streamfl.agent``
    against ``host:port``, with the demo's YAML configs (overridable per process)."""

    def __init__(self, root: Path, host: str, port: int, opts: Optional[DemoOptions] = None,
                 agent_overrides: Optional[Dict[str, Any]] = None,
                 coordinator_overrides: Optional[Dict[str, Any]] = None):
        self.root = Path(root)
        self.run_dir = self.root / "run"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.host, self.port = host, port
        self.opts = opts or DemoOptions(seed=0)
        self.fleet = FLEET
        self.topics = Topics(FLEET)
        self.agent_overrides = merge(FAST_AGENT, agent_overrides or {})
        self.coordinator_overrides = merge(FAST_COORDINATOR, coordinator_overrides or {})
        self.spec = ModelSpec(**coordinator_config(self.opts, self.run_dir)["model"])
        self.procs: List[Proc] = []
        self.coordinator: Optional[Proc] = None
        self.agents: Dict[int, Proc] = {}
        write_eval_set(self.run_dir / "eval.npz", self.opts.seed)

    # ---- configs and processes ----------------------------------------------------------------

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.jsonl"

    @property
    def coordinator_state(self) -> Path:
        return self.root / "coordinator-state"

    def agent_state(self, index: int) -> Path:
        return self.root / ("agent-%02d-state" % (index + 1))

    def device_id(self, index: int) -> str:
        return agent_config(self.opts, index)["device_id"]

    def coordinator_config(self, **over: Any) -> Dict[str, Any]:
        return merge(merge(coordinator_config(self.opts, self.run_dir), self.coordinator_overrides),
                      over)

    def agent_config(self, index: int, **over: Any) -> Dict[str, Any]:
        return merge(merge(agent_config(self.opts, index), self.agent_overrides), over)

    def _spawn(self, name: str, argv: List[str]) -> Proc:
        n = sum(1 for p in self.procs if p.name == name)
        log_name = "%s.log" % name if n == 0 else "%s-%d.log" % (name, n + 1)
        proc = Proc(name, argv, self.root / log_name, self.root)
        self.procs.append(proc)
        return proc

    def start_coordinator(self, **over: Any) -> Proc:
        """(Re)start the coordinator; the state dir and run dir stay the same across restarts."""
        path = self.root / "coordinator.yaml"
        path.write_text(yaml.safe_dump(self.coordinator_config(**over)))
        self.coordinator = self._spawn("coordinator", [
            sys.executable, "-m", "streamfl.coordinator", "--config", str(path),
            "--broker", self.host, "--port", str(self.port), "--fleet", self.fleet,
            "--state-dir", str(self.coordinator_state), "--run-dir", str(self.run_dir),
            "--log-level", "INFO"])
        return self.coordinator

    def start_agent(self, index: int, port: Optional[int] = None, **over: Any) -> Proc:
        """Agent ``index`` (device demo-0<index+1>), optionally through another port (a proxy)."""
        name = "agent-%02d" % (index + 1)
        path = self.root / (name + ".yaml")
        path.write_text(yaml.safe_dump(self.agent_config(index, **over)))
        proc = self._spawn(name, [
            sys.executable, "-m", "streamfl.agent", "--config", str(path),
            "--broker", self.host, "--port", str(port or self.port), "--fleet", self.fleet,
            "--state-dir", str(self.agent_state(index)), "--log-level", "INFO"])
        self.agents[index] = proc
        return proc

    def start_fleet(self, agents: int) -> set:
        """The coordinator and agents 0..agents-1; returns their device ids."""
        self.start_coordinator()
        for i in range(agents):
            self.start_agent(i)
        return {self.device_id(i) for i in range(agents)}

    def stop_all(self) -> None:
        """Agents first, then the coordinator; always SIGTERM then SIGKILL, whatever happened."""
        for proc in reversed(self.procs):
            proc.send_term()
        for proc in reversed(self.procs):
            proc.terminate(timeout_s=20.0)

    # ---- observing ----------------------------------------------------------------------------

    def metrics(self) -> List[Dict[str, Any]]:
        return read_metrics(self.metrics_path)

    def updates(self, since: int = 0) -> List[Dict[str, Any]]:
        """``update`` events of metrics.jsonl from line index ``since`` on."""
        return [m for m in self.metrics()[since:] if m.get("event") == "update"]

    def evals(self, since: int = 0) -> List[Dict[str, Any]]:
        return [m for m in self.metrics()[since:] if m.get("event") == "eval"]

    def version(self) -> int:
        """The newest global version metrics.jsonl mentions (0 before any)."""
        return max([int(m.get("version", 0)) for m in self.metrics()] or [0])

    def diagnostics(self) -> str:
        parts = []
        for proc in self.procs:
            code = proc.popen.poll()
            parts.append("---- %s (pid %d, %s) log tail ----\n%s" % (
                proc.log_path.name, proc.pid, "running" if code is None else "exit %s" % code,
                proc.tail()))
        lines = self.metrics()
        parts.append("---- metrics.jsonl: %d lines, last 8 ----\n%s" % (
            len(lines), "\n".join(str(m) for m in lines[-8:])))
        return "\n".join(parts)

    def check_alive(self) -> None:
        """AssertionError (with logs) if a process died that the test did not stop."""
        dead = [p for p in self.procs if not p.expected_exit and not p.alive]
        if dead:
            raise AssertionError("%s exited unexpectedly with code %s\n%s" % (
                dead[0].name, dead[0].popen.returncode, self.diagnostics()))

    def wait_for(self, predicate: Callable[[], Any], timeout_s: float, what: str,
                 poll_s: float = 0.2) -> Any:
        """Poll ``predicate`` until truthy (returned); AssertionError with logs on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = predicate()
            if value:
                return value
            self.check_alive()
            if time.monotonic() >= deadline:
                raise AssertionError("timed out after %.0f s waiting for %s\n%s" % (
                    timeout_s, what, self.diagnostics()))
            time.sleep(poll_s)


class ModelWatcher:
    """A plain paho client on the fleet's retained model topic (and optionally others); decodes
    every model with the real ``Decoder`` and records ``(monotonic time, message)``."""

    def __init__(self, host: str, port: int, fleet: str, spec: ModelSpec,
                 client_id: str = "test-watcher", extra_topics: tuple = ()):
        self.topics = Topics(fleet)
        self.decoder = Decoder({spec.arch_id: tensor_spec(spec)})
        self.messages: List[tuple] = []  # (t, topic, message)
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self._client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                                   clean_session=True, protocol=mqtt.MQTTv311)
        self._filters = [self.topics.model] + list(extra_topics)
        self._client.on_connect = self._on_connect
        self._client.on_subscribe = lambda *a: self._subscribed.set()
        self._client.on_message = self._on_message
        self._client.connect(host, port, 30)
        self._client.loop_start()
        if not self._subscribed.wait(10):
            self.close()
            raise AssertionError("model watcher could not subscribe on %s:%d" % (host, port))

    def _on_connect(self, client, userdata, flags, reason_code, properties):
        client.subscribe([(f, 1) for f in self._filters])

    def _on_message(self, client, userdata, message):
        msg = self.decoder.try_decode(message.payload, source=message.topic)
        with self._lock:
            self.messages.append((time.monotonic(), message.topic, msg))

    def models(self, since_s: float = float("-inf")) -> List[GlobalModel]:
        """Global models received at or after monotonic time ``since_s``, in arrival order."""
        with self._lock:
            return [m for t, topic, m in self.messages
                    if t >= since_s and topic == self.topics.model and isinstance(m, GlobalModel)]

    def on_topic(self, topic: str) -> List[tuple]:
        with self._lock:
            return [(t, m) for t, tp, m in self.messages if tp == topic]

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()
