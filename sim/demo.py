"""``streamfl demo``: a whole fleet on one machine, as separate OS processes over a real MQTT broker.

The demo starts a broker (mosquitto when on PATH, else embedded amqtt), one coordinator and N agents
with exactly the programs a real deployment runs (``streamfl-coordinator``, ``streamfl-agent``).
Each agent streams synthetic IMU windows whose classes arrive unevenly over time: a device sees two
activities at a time, and the devices start one phase apart in the rotation, so no device ever
sees every class but (with three or more agents) the federation as a whole always does.
"""
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import yaml

from streamfl.sim.brokers import BrokerProcess
from streamfl.coordinator.metrics import read_metrics
from streamfl.sim.plots import plot_accuracy, plot_clock_levels

log = logging.getLogger(__name__)

FLEET = "demo"
#: The boards the demo's agents simulate, in turn: a mix of Jetson and Raspberry Pi profiles.
DEMO_BOARDS = ("jetson-orin-nano", "raspberry-pi-4", "jetson-nano", "raspberry-pi-5",
               "jetson-xavier-nx", "jetson-agx-orin")


@dataclass
class DemoOptions:
    """What the ``streamfl demo`` flags choose; defaults finish in under 3 minutes on 2 cores."""

    agents: int = 3
    duration_s: float = 120.0
    run_dir: Optional[str] = None
    model: str = "lstm"
    strategy: str = "fedasync"
    broker: Optional[str] = None
    progress_every_s: float = 10.0
    #: Windows per second each synthetic sensor produces (a 50-sample window at 50 Hz is 1/s live;
    #: the demo streams faster so that a short run sees several class phases).
    windows_per_s: float = 20.0
    phase_s: float = 20.0
    seed: int = 0
    #: Clock policy of every agent; each agent simulates the next board of ``boards``.
    dvfs_policy: str = "clp-aware"
    boards: Tuple[str, ...] = DEMO_BOARDS
    #: The coordinator's dashboard port on localhost (0: any free one; the demo prints the URL).
    dashboard_port: int = 0


def _model_section(opts: DemoOptions) -> Dict:
    return {"name": opts.model, "in_channels": 6, "window_len": 50, "num_classes": 6, "hidden": 64}


def coordinator_config(opts: DemoOptions, run_dir: Path) -> Dict:
    """The coordinator's YAML for the demo (a normal config file, written into the run folder)."""
    return {
        "fleet": FLEET,
        "model": _model_section(opts),
        "strategy": opts.strategy,
        "alpha": 0.6,
        "staleness": "polynomial",
        "hparams": {"lr": 0.05, "batch_size": 32, "local_steps": 15, "dropout": 0.0},
        "eval_path": str(run_dir / "eval.npz"),
        "eval_every_versions": 3,
        "seed": opts.seed,
        "monitor": {"port": opts.dashboard_port},
    }


def agent_config(opts: DemoOptions, index: int) -> Dict:
    """Agent ``index``'s YAML: its own user (gain, noise, orientation) and its own class rotation."""
    return {
        "fleet": FLEET,
        "device_id": "demo-%02d" % (index + 1),
        # The board profile each agent simulates: its DVFS levels, and the name its Hello shows.
        "board": opts.boards[index % len(opts.boards)],
        "model": _model_section(opts),
        "sensor": {
            "kind": "synthetic",
            "windows_per_s": opts.windows_per_s,
            "schedule": "rotating",
            "classes_per_phase": 2,
            "phase_s": opts.phase_s,
            # Devices start one phase apart, so three agents cover all six classes at every moment.
            "phase_offset": index * 2,
            "user_id": index + 1,
            "seed": opts.seed,
        },
        "buffer_capacity": 400,
        "min_buffer": 32,
        "round_interval_s": 1.0,
        "telemetry_interval_s": 5.0,
        "seed": opts.seed + index,
        # Simulated clocks of a real board's profile: levels, modeled power, and rounds stretched
        # as the lower clock would stretch them, so the energy and the levels mean something.
        "dvfs": {"backend": "simulated", "policy": opts.dvfs_policy, "emulate_speed": True},
        # Each board predicts on its live windows once a second, as an app on it would see them.
        "predict": {"enabled": True, "max_per_s": 1.0, "class_names": list(CLASS_NAMES)},
    }


#: The synthetic sensor's classes, as the evaluation set and the boards' predictions name them.
CLASS_NAMES = tuple("class-%d" % k for k in range(6))


class LivePredictions:
    """The newest prediction of each demo board, from their MQTT prediction topics (JSON lines
    for apps, docs/predictions.md): what the demo prints beside the accuracy."""

    def __init__(self, host: str, port: int):
        from streamfl.protocol.topics import Topics
        from streamfl.protocol.transport.base import MqttSettings
        from streamfl.protocol.transport.paho import PahoTransport
        self.latest: Dict[str, Dict] = {}
        self.received = 0
        self._transport = PahoTransport(MqttSettings(host=host, port=port, client_id="demo-predictions",
                                                     persistent_session=False))
        self._transport.on_message = self._on_message
        self._transport.subscribe(Topics(FLEET).all_devices("prediction"), qos=0)
        self._transport.connect()

    def _on_message(self, topic: str, payload: bytes) -> None:
        try:
            p = json.loads(payload[:65536].decode("utf-8"))
            line = {"name": str(p["name"])[:32], "confidence": float(p["confidence"]),
                    "version": int(p["model"]["version"])}
            device = str(p["device_id"])[:64]
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return
        self.received += 1
        self.latest[device] = line

    def line(self) -> str:
        """``demo-01 class-2 (0.91, v42); ...`` or "" before the first prediction."""
        return "; ".join("%s %s (%.2f, v%d)" % (d, p["name"], p["confidence"], p["version"])
                         for d, p in sorted(self.latest.items())[:6])

    def close(self) -> None:
        self._transport.close()


def write_eval_set(path: Path, seed: int) -> None:
    """Held-out windows of every class from users no agent has, for the coordinator's accuracy."""
    from streamfl.sensors.config import SensorConfig
    from streamfl.sensors.datasets import save_npz
    from streamfl.sensors.synthetic import synthetic_dataset
    cfg = SensorConfig()
    X, y, subject = synthetic_dataset(600, users=[101, 102, 103], seed=seed + 999, cfg=cfg)
    save_npz(path, X, y, subject, list(CLASS_NAMES[:cfg.num_classes]))


class Fleet:
    """The child processes of one demo run, stopped in reverse order whatever happens."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.procs: List[subprocess.Popen] = []
        self._logs = []

    def spawn(self, name: str, argv: List[str]) -> subprocess.Popen:
        logf = open(self.run_dir / ("%s.log" % name), "wb")
        self._logs.append(logf)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env=env,
                                cwd=str(self.run_dir))
        self.procs.append(proc)
        return proc

    def stop(self, timeout_s: float = 20.0) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in reversed(self.procs):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for logf in self._logs:
            logf.close()


def summarize(metrics: List[Dict], num_classes: int) -> Dict:
    """Versions, updates, staleness and accuracy at start and end of a coordinator's run."""
    evals = [m for m in metrics if m.get("event") == "eval"]
    updates = [m for m in metrics if m.get("event") == "update"]
    staleness = [m["staleness"] for m in updates if m.get("staleness") is not None]
    fates: Dict[str, int] = {}
    for m in updates:
        fates[str(m.get("outcome"))] = fates.get(str(m.get("outcome")), 0) + 1
    return {
        "final_version": max([m.get("version", 0) for m in metrics] or [0]),
        "updates": len(updates),
        "aggregated": sum(1 for m in updates if m.get("aggregated")),
        # Where every received update went (aggregated, buffered, duplicate, rejected, ...).
        "updates_by_outcome": dict(sorted(fates.items())),
        "devices": sorted({m["device"] for m in updates if "device" in m}),
        "mean_staleness": sum(staleness) / len(staleness) if staleness else None,
        "max_staleness": max(staleness) if staleness else None,
        "initial_accuracy": evals[0]["accuracy"] if evals else None,
        "final_accuracy": evals[-1]["accuracy"] if evals else None,
        "best_accuracy": max(m["accuracy"] for m in evals) if evals else None,
        "chance": 1.0 / num_classes,
        "evaluations": len(evals),
    }


def energy_by_device(metrics: List[Dict]) -> Dict[str, float]:
    """Joules each device reported over the run (updates without ``energy_j`` add nothing)."""
    out: Dict[str, float] = {}
    for m in metrics:
        if m.get("event") == "update" and m.get("energy_j") is not None:
            out[m["device"]] = round(out.get(m["device"], 0.0) + float(m["energy_j"]), 3)
    return out


def _progress(run_dir: Path, started: float, predictions: Optional[LivePredictions] = None) -> str:
    metrics = read_metrics(run_dir / "metrics.jsonl")
    evals = [m for m in metrics if m.get("event") == "eval"]
    updates = [m for m in metrics if m.get("event") == "update"]
    acc = "%.3f" % evals[-1]["accuracy"] if evals else "-"
    version = max([m.get("version", 0) for m in metrics] or [0])
    live = predictions.line() if predictions is not None else ""
    return "t=%5.1fs version=%d updates=%d accuracy=%s%s" % (
        time.monotonic() - started, version, len(updates), acc, ("   predictions: " + live) if live else "")


def run_demo(opts: DemoOptions) -> Dict:
    """Run the demo fleet for ``opts.duration_s`` seconds; return (and write) the summary."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(opts.run_dir or Path("runs") / ("demo-" + stamp)).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    print("streamfl demo: %d agents for %.0f s, run folder %s" % (opts.agents, opts.duration_s, run_dir))
    write_eval_set(run_dir / "eval.npz", opts.seed)
    (run_dir / "coordinator.yaml").write_text(yaml.safe_dump(coordinator_config(opts, run_dir)))
    for i in range(opts.agents):
        (run_dir / ("agent-%02d.yaml" % (i + 1))).write_text(yaml.safe_dump(agent_config(opts, i)))

    broker = BrokerProcess(run_dir / "broker", kind=opts.broker).start()
    print("broker: %s on 127.0.0.1:%d" % (broker.kind, broker.port))
    fleet = Fleet(run_dir)
    common = ["--broker", broker.host, "--port", str(broker.port), "--fleet", FLEET, "--log-level", "INFO"]
    started = time.monotonic()
    predictions = LivePredictions(broker.host, broker.port)
    try:
        fleet.spawn("coordinator", [sys.executable, "-m", "streamfl.coordinator", *common,
                                    "--config", str(run_dir / "coordinator.yaml"),
                                    "--state-dir", str(run_dir / "coordinator-state"),
                                    "--run-dir", str(run_dir)])
        for i in range(opts.agents):
            name = "agent-%02d" % (i + 1)
            fleet.spawn(name, [sys.executable, "-m", "streamfl.agent", *common,
                               "--config", str(run_dir / (name + ".yaml")),
                               "--state-dir", str(run_dir / (name + "-state"))])
        next_report = started + opts.progress_every_s
        dashboard_shown = False
        while time.monotonic() - started < opts.duration_s:
            time.sleep(0.5)
            if not dashboard_shown and (run_dir / "monitor.url").is_file():
                dashboard_shown = True
                url = (run_dir / "monitor.url").read_text().strip()
                print("fleet dashboard: %s   (or in a terminal: streamfl status --url %s)" % (url, url),
                      flush=True)
            dead = [p for p in fleet.procs if p.poll() is not None]
            if dead:
                print("a demo process exited early (code %s); see the logs in %s" % (
                    dead[0].returncode, run_dir))
                break
            if time.monotonic() >= next_report:
                print(_progress(run_dir, started, predictions), flush=True)
                next_report += opts.progress_every_s
    finally:
        predictions.close()
        fleet.stop()
        broker.stop()
    summary = summarize(read_metrics(run_dir / "metrics.jsonl"), num_classes=6)
    summary["agents"] = opts.agents
    summary["boards"] = {agent_config(opts, i)["device_id"]: opts.boards[i % len(opts.boards)]
                         for i in range(opts.agents)}
    summary["energy_j"] = energy_by_device(read_metrics(run_dir / "metrics.jsonl"))
    summary["duration_s"] = round(time.monotonic() - started, 1)
    summary["broker"] = broker.kind
    summary["predictions_received"] = predictions.received
    summary["latest_predictions"] = dict(sorted(predictions.latest.items()))
    summary["processes_ok"] = all(p.returncode == 0 for p in fleet.procs)
    summary["learned"] = learned(summary, opts.duration_s)
    summary["ok"] = summary["processes_ok"] and summary["learned"]
    write_demo_summary(run_dir, summary)
    plot = plot_accuracy(read_metrics(run_dir / "metrics.jsonl"), run_dir / "accuracy.png",
                         title="streamfl demo: %d agents, %s" % (opts.agents, opts.strategy))
    clocks = plot_clock_levels(read_metrics(run_dir / "metrics.jsonl"), run_dir / "clocks.png",
                               boards=summary["boards"],
                               title="clocks (%s, simulated boards)" % opts.dvfs_policy)
    print(format_summary(summary, plot, clocks))
    return summary


def write_demo_summary(run_dir: Path, summary: Dict) -> None:
    """Put the demo's figures under ``demo`` in the run's ``summary.json``, beside what the
    coordinator wrote there at stop (so ``streamfl report`` reads a demo folder as any real run)."""
    path = run_dir / "summary.json"
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        run = {}
    if not isinstance(run, dict):
        run = {}
    run["demo"] = summary
    path.write_text(json.dumps(run, indent=1))


#: A full-length demo must end at least this many times above chance (README: 0.98 vs 0.167).
LEARNED_FACTOR = 2.0
#: Below this many seconds a run is a smoke test: it must only have evaluated the model.
LEARN_MIN_DURATION_S = 60.0


def learned(summary: Dict, duration_s: float) -> bool:
    """Did the fleet learn? An evaluated final model, and for a run of a minute or more, accuracy
    at least ``LEARNED_FACTOR`` times chance: a demo that ends near chance has failed."""
    final = summary.get("final_accuracy")
    if final is None:
        return False
    if duration_s < LEARN_MIN_DURATION_S:
        return True
    return final >= LEARNED_FACTOR * float(summary.get("chance") or 0.0)


def _fates(summary: Dict) -> str:
    """Where the updates that were not aggregated went, e.g. " (1 duplicate: resent ...)"."""
    from streamfl.coordinator.run_summary import FATES
    others = {k: n for k, n in (summary.get("updates_by_outcome") or {}).items() if k != "aggregated" and n}
    if not others:
        return ""
    return " (the others: %s)" % "; ".join("%d %s: %s" % (n, k, FATES.get(k, "")) for k, n in others.items())


def format_summary(summary: Dict, plot: Optional[Path], clocks: Optional[Path] = None) -> str:
    """The lines the demo ends with."""
    def fmt(value, pattern="%.3f"):
        return "-" if value is None else pattern % value
    lines = [
        "== streamfl demo summary ==",
        "versions: %s   updates received: %s   aggregated: %s%s" % (
            summary.get("final_version"), summary.get("updates"), summary.get("aggregated"),
            _fates(summary)),
        "staleness: mean %s, max %s" % (fmt(summary.get("mean_staleness"), "%.2f"),
                                         summary.get("max_staleness")),
        "accuracy: start %s -> end %s (best %s; chance %.3f)" % (
            fmt(summary.get("initial_accuracy")), fmt(summary.get("final_accuracy")),
            fmt(summary.get("best_accuracy")), summary.get("chance", 0.0)),
    ]
    energy = summary.get("energy_j") or {}
    if energy:
        boards = summary.get("boards") or {}
        lines.append("energy per device: %s" % ", ".join(
            "%s (%s) %.1f J" % (dev, boards.get(dev, "?"), joules) for dev, joules in sorted(energy.items())))
    latest = summary.get("latest_predictions") or {}
    if latest:
        lines.append("live predictions (%d received): %s" % (summary.get("predictions_received", 0), "; ".join(
            "%s %s (%.2f, v%d)" % (d, p["name"], p["confidence"], p["version"]) for d, p in latest.items())))
    if plot is not None:
        lines.append("plot: %s" % plot)
    if clocks is not None:
        lines.append("clocks plot: %s" % clocks)
    lines.append("all processes exited cleanly: %s" % ("yes" if summary.get("processes_ok") else "NO"))
    if not summary.get("learned", True):
        lines.append("the fleet did NOT learn: final accuracy below %.0fx chance" % LEARNED_FACTOR)
    return "\n".join(lines)
