"""``streamfl-agent dvfs probe``: time a training step at every clock level and measure the watts,
and write them into a board profile (``streamfl.dvfs.profiles``) of this board.

The probe trains the agent's own model (architecture, batch size, torch threads from the agent
config) on synthetic windows, steps the probed domains through their levels in ascending order,
and restores the original clocks at the end and on every error. Stop the agent first: the two
would fight over the same clock files and the same saved-settings file.

The file (YAML, written atomically) is the board's profile, with the levels the backend found,
plus a ``measured`` section, so it goes wherever a profile does (``dvfs.profile_path``, with
backend ``sysfs`` on this board or ``simulated`` anywhere) and loads with the same checks. Loaded,
its measured watts replace the power model (``profiles.measured_power_model``), so the modeled
meter of a simulated backend reports them, and ``BoardProfile.seconds_per_sample`` maps (domain,
level) to the measured time (the shape of ``PolicyInput.seconds_per_sample``). The simulator's
device model reads the timings, and an agent started with the file seeds its clp-aware policy with
them (``AgentDvfs.probe_timings``) when it trains the same model and batch size::

    name: jetson-orin-nano           # ... every key of the board profile, then:
    measured:
      format: 2
      backend: sysfs                 # sysfs or simulated
      meter: ina3221-hwmon           # the power meter that gave the watts
      arch_id: lstm-c6-w50-k6-h128   # the model that was trained
      batch_size: 32
      steps: 5                       # at least this many timed SGD steps per level
      measured_at: '2025-01-01T12:00:00+00:00'   # UTC
      idle_w: 4.8                    # mean board power, not training, clocks as found
      domains:
        gpu:                         # one figure per level of the profile's domain gpu
          seconds_per_sample: [0.00042, ...]     # wall time / samples trained
          train_w: [9.1, ...]                    # mean board power while training

Domains listed together were stepped in lockstep (level k on each, a shorter ladder held at its
top), so they carry the same figures. The watts are the meter's total over all its rails (the
whole board where the meter sees it), the other domains staying at the levels they had; ``null``
where no meter measures anything (``meter: null``), and then the profile's power model stays.
"""
import dataclasses
import datetime
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import yaml

from streamfl.agent.config import AgentConfig
from streamfl.agent.core import AgentCore
from streamfl.agent.dvfs import AgentDvfs
from streamfl.config import to_dict
from streamfl.dvfs.base import DvfsError, FrequencyDomain
from streamfl.dvfs.policies.clp_aware import scaled_domains
from streamfl.dvfs.power.null import NullMeter
from streamfl.dvfs.profiles import (MEASURED_FORMAT, BoardProfile, PowerModel,
                                    declared_power_model, from_mapping, load_profile_file)
from streamfl.errors import ConfigError, StorageError
from streamfl.fileio import atomic_write
from streamfl.models import model_to_arrays
from streamfl.protocol.messages import GlobalModel

log = logging.getLogger(__name__)

PROBE_FILE = "dvfs-probe.yaml"
#: The most SGD steps one round of the probe runs (the agent's own ``local_steps`` ceiling).
MAX_ROUND_STEPS = 10000
#: While the energy counter runs, the timed window lasts at least this many of its sample periods
#: and the warm-up this many, so the window holds samples taken at its level and the sample just
#: before it was taken during the warm-up, not at the previous level [U: the trapezoid's edge
#: error is at most one period per edge, so 3 periods keep it under a third of the window].
WINDOW_PERIODS = 3.0
SETTLE_PERIODS = 1.5


def probe(cfg: AgentConfig, dvfs: AgentDvfs, out_path: Path, steps: int = 5, warmup_steps: int = 2,
          domains: Optional[Sequence[str]] = None, clock: Callable[[], float] = time.perf_counter,
          min_window_s: Optional[float] = None,
          profile: Optional[BoardProfile] = None) -> Dict[str, Any]:
    """Measure seconds per sample and watts at every level of ``domains`` (default: the ones the
    clp-aware policy scales), write the profile to ``out_path`` and return it (parsed YAML).

    ``profile`` is the board profile ``dvfs`` was built from (None: ``cfg.dvfs``'s); the file
    copies it with the backend's levels.

    ``clock`` times the steps and stamps the energy window, so it must read the timeline ``dvfs``
    was built with (``time.monotonic`` and ``time.perf_counter`` are one clock on Linux).
    ``min_window_s`` (None: three energy-counter periods while the counter runs, else 0) stretches
    a level's timed window beyond ``steps`` steps. Errors: ``ConfigError`` for bad arguments,
    unknown domains or a profile lacking a domain of ``dvfs``, ``DvfsError`` for a refused clock
    write or clocks that would not go back; the clocks are restored on every way out.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError("dvfs probe: steps must be an integer >= 1, got %r" % (steps,))
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ConfigError("dvfs probe: warmup_steps must be an integer >= 0, got %r"
                          % (warmup_steps,))
    group = _group(dvfs, domains)
    if profile is None:
        from streamfl.dvfs.factory import board_profile
        profile = board_profile(cfg.dvfs)
    doc = _board_doc(profile, dvfs)
    counting = dvfs.counter.running
    period_s = 1.0 / dvfs.counter.rate_hz if counting else 0.0
    window_s = WINDOW_PERIODS * period_s if min_window_s is None else float(min_window_s)
    settle_s = SETTLE_PERIODS * period_s if warmup_steps else 0.0
    core = _ready_core(cfg)
    initial = model_to_arrays(core.model)
    results = {d.name: {"seconds_per_sample": [], "train_w": []} for d in group}
    idle_w = _idle_w(dvfs, SETTLE_PERIODS * period_s, window_s, clock)
    done = False
    dvfs.training = True  # for the whole walk: a modeled meter never dips to idle between levels
    try:
        for k in range(max(len(d.levels_khz) for d in group)):
            plan = {d.name: min(k, len(d.levels_khz) - 1) for d in group}
            dvfs.guard.apply(plan)
            # Every level starts from the same weights: comparable steps, and no drift to divergence.
            core.on_global_model(GlobalModel(version=k + 1, arch_id=core.arch_id, tensors=initial))
            sps, watts = _measure(core, dvfs, steps, warmup_steps, settle_s, window_s, clock)
            for dom in group:
                if k < len(dom.levels_khz):
                    results[dom.name]["seconds_per_sample"].append(sps)
                    results[dom.name]["train_w"].append(watts)
            log.info("probe level %s: %.3f ms/sample, %s W", plan, sps * 1e3, _watts(watts))
        now = datetime.datetime.now(datetime.timezone.utc)
        doc["measured"] = {
            "format": MEASURED_FORMAT, "backend": dvfs.backend.kind, "meter": dvfs.meter.kind,
            "arch_id": core.arch_id, "batch_size": int(core.hparams["batch_size"]), "steps": steps,
            "measured_at": now.isoformat(timespec="seconds"), "idle_w": idle_w, "domains": results}
        from_mapping(doc, str(out_path))  # what is written loads as a profile
        _write(Path(out_path), doc)
        done = True
    finally:
        dvfs.training = False
        restored = dvfs.guard.restore()
        if done and not restored:
            raise DvfsError("the probe could not put the clocks back; run 'streamfl-agent dvfs "
                            "restore' once the cause is fixed")
    return doc


def _group(dvfs: AgentDvfs, names: Optional[Sequence[str]]) -> List[FrequencyDomain]:
    """The domains to step together: those named, else those the clp-aware policy scales."""
    if names:
        try:
            return [dvfs.backend.domain(n) for n in dict.fromkeys(names)]
        except KeyError as exc:
            raise ConfigError("dvfs probe: %s" % exc.args[0]) from None
    chosen = [v.name for v in scaled_domains(dvfs.views())]
    if not chosen:
        raise DvfsError("dvfs probe: backend %s has no frequency domain to probe" % dvfs.backend.kind)
    return [dvfs.backend.domain(n) for n in chosen]


def _board_doc(profile: BoardProfile, dvfs: AgentDvfs) -> Dict[str, Any]:
    """``profile`` as YAML data with the backend's levels (the kernel's table on a real board) and
    its power model interpolated to them; ``ConfigError`` if the backend has a domain it lacks."""
    from streamfl.dvfs.factory import watts_for
    levels = {d.name: tuple(int(f) for f in d.levels_khz) for d in dvfs.backend.domains}
    missing = sorted(set(levels) - {d.name for d in profile.domains})
    if missing:
        raise ConfigError("dvfs probe: board profile %s has no domain %s; give the profile the "
                          "agent's clocks were built from" % (profile.name, ", ".join(missing)))
    model = declared_power_model(profile)
    specs, watts = [], {}
    for spec in profile.domains:
        new = levels.get(spec.name, spec.levels_khz)
        specs.append(dataclasses.replace(spec, levels_khz=new))
        watts[spec.name] = tuple(watts_for(new, spec.levels_khz, model.watts_per_level[spec.name]))
    board = dataclasses.replace(profile, domains=tuple(specs), measured=None,
                                power_model=PowerModel(idle_w=model.idle_w, watts_per_level=watts))
    doc = to_dict(board)
    del doc["measured"]
    return doc


def _ready_core(cfg: AgentConfig) -> AgentCore:
    """An agent core whose (FIFO) buffer holds a batch of windows shaped for its model."""
    core = AgentCore(cfg)
    spec = core.spec
    target = min(core.buffer.capacity, max(1, int(core.hparams["batch_size"])))
    if spec.in_channels in (3, 6):
        from streamfl.sensors import SensorConfig, make_source
        scfg = SensorConfig(kind="synthetic", windows_per_s=0.0, window_len=spec.window_len,
                            stride=spec.window_len, channels=spec.in_channels,
                            num_classes=spec.num_classes, schedule="all", seed=cfg.sensor.seed)
        source = make_source(scfg, cfg.device_id)
        try:
            for window in source.windows():
                core.add_window(window)
                if len(core.buffer) >= target:
                    break
        finally:
            source.close()
    else:  # the synthetic IMU has 3 or 6 channels; a step's time does not depend on the values
        rng = np.random.default_rng(core.seed)
        for i in range(target):
            x = rng.standard_normal((spec.window_len, spec.in_channels)).astype(np.float32)
            core.buffer.add(x, i % spec.num_classes)
    return core


def _idle_w(dvfs: AgentDvfs, settle_s: float, window_s: float,
            clock: Callable[[], float]) -> Optional[float]:
    """Mean board power with no training at the clocks as found; None where no meter measures."""
    if isinstance(dvfs.meter, NullMeter):
        return None
    if dvfs.counter.running:
        time.sleep(settle_s)  # the sample before the window is an idle one too
        t0 = clock()
        time.sleep(window_s)
        t1 = clock()
        if t1 > t0:
            try:
                return round(dvfs.counter.joules_between(t0, t1) / (t1 - t0), 4)
            except ValueError as exc:
                log.warning("energy counter cannot answer for the idle window (%s); reading the "
                            "meter", exc)
    return round(float(dvfs.meter.total_w()), 4)


def _train(core: AgentCore, steps: int, min_s: float,
           clock: Callable[[], float]) -> Tuple[int, float, float]:
    """Train ``steps`` steps, then more until ``min_s`` has passed; (samples, start, end)."""
    samples = done = 0
    t0 = now = clock()
    todo = steps
    while todo > 0:
        plan = dataclasses.replace(core.begin_round(), local_steps=min(todo, MAX_ROUND_STEPS))
        samples += core.finish_round(plan).num_samples
        done += plan.local_steps
        now = clock()
        elapsed = now - t0
        todo = 0
        if min_s > elapsed > 0:  # a clock that does not move cannot stretch the window
            todo = int(math.ceil((min_s - elapsed) / (elapsed / done)))
    return samples, t0, now


def _measure(core: AgentCore, dvfs: AgentDvfs, steps: int, warmup_steps: int, settle_s: float,
             window_s: float, clock: Callable[[], float]) -> Tuple[float, Optional[float]]:
    """(seconds per sample, watts) at the levels in force, ``dvfs.training`` set by the caller."""
    metered = not isinstance(dvfs.meter, NullMeter)
    counting = dvfs.counter.running
    readings = []
    if warmup_steps:
        _train(core, warmup_steps, settle_s, clock)
    if metered and not counting:
        readings.append(dvfs.meter.total_w())
    samples, t0, t1 = _train(core, steps, window_s, clock)
    if metered and not counting:
        readings.append(dvfs.meter.total_w())
    if not t1 > t0:  # policies and the simulator need a time above zero
        raise ValueError("the probe's clock did not advance over %d samples of training" % samples)
    seconds_per_sample = (t1 - t0) / max(1, samples) * dvfs.slowdown()
    watts = None
    if metered and counting:
        try:
            watts = dvfs.counter.joules_between(t0, t1) / (t1 - t0)
        except ValueError as exc:  # a clock that is not the counter's timeline
            log.warning("energy counter cannot answer for the probe window (%s); reading the meter",
                        exc)
            watts = dvfs.meter.total_w()
    elif readings:
        watts = sum(readings) / len(readings)
    return float("%.6g" % seconds_per_sample), (round(float(watts), 4) if watts is not None else None)


def _write(path: Path, doc: Dict[str, Any]) -> None:
    text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, text.encode("utf-8"))
    except OSError as exc:
        raise StorageError("cannot write the probe profile %s: %s"
                           % (path, exc.strerror or exc)) from exc


def load_probe(path: Path) -> BoardProfile:
    """The profile ``probe`` wrote, loaded like any profile; ``ConfigError`` naming the file if it
    is not a profile or has no ``measured`` section."""
    profile = load_profile_file(path)
    if profile.measured is None:
        raise ConfigError("%s: missing key 'measured': a board profile, not one 'dvfs probe' wrote"
                          % path)
    return profile


def run_probe(cfg: AgentConfig, state_dir: Path, out_path: Optional[Path] = None, steps: int = 5,
              domains: Optional[Sequence[str]] = None) -> int:
    """The CLI action: build the agent's clocks, probe, restore, print a table; exit code 0."""
    if cfg.dvfs.backend == "none":
        raise ConfigError("dvfs probe needs dvfs backend sysfs or simulated, not none")
    out_path = Path(out_path) if out_path is not None else Path(state_dir) / PROBE_FILE
    dvfs = AgentDvfs.from_config(cfg.dvfs, Path(state_dir), clock=time.perf_counter)
    dvfs.owner = "dvfs probe"  # what 'dvfs status' beside it says set the clocks
    core_log = logging.getLogger("streamfl.agent.core")
    level = core_log.level
    core_log.setLevel(max(logging.WARNING, core_log.getEffectiveLevel()))  # not a line per round
    dvfs.start()
    try:
        doc = probe(cfg, dvfs, out_path, steps=steps, domains=domains, clock=time.perf_counter)
    finally:
        dvfs.close()
        core_log.setLevel(level)
    measured = doc["measured"]
    lines = ["board %s, backend %s, meter %s, model %s, batch %d, idle %s W" % (
        doc["name"], measured["backend"], measured["meter"], measured["arch_id"],
        measured["batch_size"], _watts(measured["idle_w"])),
        "%-8s %5s %10s %11s %8s" % ("domain", "level", "kHz", "ms/sample", "W")]
    levels = {d["name"]: d["levels_khz"] for d in doc["domains"]}
    for name, entry in measured["domains"].items():
        for i, (khz, sps, w) in enumerate(zip(levels[name], entry["seconds_per_sample"],
                                               entry["train_w"])):
            lines.append("%-8s %5d %10d %11.4f %8s" % (name, i, khz, sps * 1e3, _watts(w)))
    lines.append("wrote %s" % out_path)
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _watts(value: Optional[float]) -> str:
    """A measured power for the table and the log; '-' where nothing measured it."""
    return "%.3f" % value if value is not None else "-"
