"""The agent's clocks and energy: a backend behind the guard, a power meter, an energy counter.

The daemon asks the core for a frequency plan before each round (the policy is sans-I/O) and hands
it here; this object does the writes, knows what a round cost in joules, and restores the clocks
on every way out (``close``), including a crash of an earlier run (``start``). It records what it
has set (``streamfl.agent.dvfs_state``) at start, on every level change and at stop, for
``streamfl-agent dvfs status``.
"""
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from streamfl.dvfs.base import DvfsBackend, DvfsError, SysfsIO
from streamfl.dvfs.config import DvfsConfig
from streamfl.dvfs.guard import DvfsGuard, restore_saved
from streamfl.dvfs.null import NullBackend
from streamfl.dvfs.policies.base import DomainView
from streamfl.dvfs.power.base import PowerMeter
from streamfl.dvfs.power.energy import EnergyCounter
from streamfl.dvfs.power.null import NullMeter
from streamfl.dvfs.profiles import BoardProfile
from streamfl.dvfs.thermal import read_temperatures_c
from streamfl.errors import StorageError

log = logging.getLogger(__name__)


class AgentDvfs:
    """Clock control and energy accounting for one agent; every method is safe to call from the
    training thread while the main loop reads telemetry."""

    def __init__(self, backend: DvfsBackend, meter: PowerMeter, state_dir: Optional[Path],
                 energy_rate_hz: float = 10.0, clock: Callable[[], float] = time.monotonic,
                 restore_io: Optional[SysfsIO] = None, thermal_zones: Sequence[str] = (),
                 board: Optional[str] = None, emulate_speed: bool = False,
                 read_temperatures: Optional[bool] = None, profile: Optional[BoardProfile] = None,
                 policy: str = "none", mode: str = "cap"):
        self.backend = backend
        #: The board profile, kept for the timings a ``dvfs probe`` profile carries.
        self.profile = profile
        self.meter = meter
        #: The board profile's name (None: not known), which the agent's Hello announces.
        self.board = board
        #: Which command sets the clocks, for the clock record: ``agent`` or ``dvfs probe``.
        self.owner = "agent"
        self.policy = policy
        self.mode = mode
        self._recorded: Optional[Dict[str, int]] = None
        self._record_failed = False
        self.guard = DvfsGuard(backend, state_dir)
        self.counter = EnergyCounter(meter, rate_hz=energy_rate_hz, clock=clock)
        self._state_dir = state_dir
        self._restore_io = restore_io
        self._thermal_zones = tuple(thermal_zones)
        #: Thermal zones are read from ``restore_io`` only where it is the board the clocks are on.
        self._read_temperatures = restore_io is not None if read_temperatures is None else read_temperatures
        self._clock = clock
        self._lock = threading.Lock()
        self.training = False
        self.errors = 0
        self.emulate_speed = emulate_speed

    @classmethod
    def disabled(cls, state_dir: Optional[Path] = None,
                 restore_io: Optional[SysfsIO] = None) -> "AgentDvfs":
        """Touches no clock and measures nothing (tests, and boards where DVFS is off); given a
        state folder and sysfs, ``start`` still puts back clocks a crashed earlier run left."""
        return cls(NullBackend("DVFS off"), NullMeter(), state_dir, restore_io=restore_io,
                   read_temperatures=False)

    @staticmethod
    def board_name(cfg: DvfsConfig) -> Optional[str]:
        """The board profile's name without building its domains (backend none, or DVFS that
        failed): the profile file's, the configured one, else the one the device-tree model
        matches, else generic-linux; None where a profile file cannot be read."""
        from streamfl.errors import StreamflError
        if cfg.profile_path:
            from streamfl.dvfs.profiles import load_profile_file
            try:
                return load_profile_file(cfg.profile_path).name
            except StreamflError as exc:
                log.warning("board name unknown: %s", exc)
                return None
        if cfg.board:
            return cfg.board
        from streamfl.dvfs.detect import match_model, read_model
        from streamfl.dvfs.profiles import GENERIC
        model = read_model(Path(cfg.proc_root))
        found = match_model(model) if model is not None else None
        return found[0] if found is not None else GENERIC

    @classmethod
    def from_config(cls, cfg: DvfsConfig, state_dir: Path,
                    clock: Callable[[], float] = time.monotonic) -> "AgentDvfs":
        """Profile, backend and meter as ``cfg`` says (errors: ``ConfigError``/``DvfsError``)."""
        from streamfl.dvfs.factory import board_profile, describe, make_backend, make_meter
        from streamfl.dvfs.sysfs_io import SysfsFiles
        profile = board_profile(cfg) if cfg.backend != "none" else None
        backend = make_backend(cfg, profile, clock=clock)
        holder: List[AgentDvfs] = []
        meter = make_meter(cfg, profile, backend, busy=lambda: bool(holder and holder[0].training))
        # Whatever the backend now, an earlier sysfs run's saved clocks are put back at start.
        io = SysfsFiles(Path(cfg.sysfs_root))
        self = cls(backend, meter, state_dir, cfg.energy_rate_hz, clock, restore_io=io,
                   thermal_zones=profile.thermal_zones if profile else (),
                   board=profile.name if profile else cls.board_name(cfg),
                   emulate_speed=cfg.emulate_speed, read_temperatures=cfg.backend == "sysfs",
                   profile=profile, policy=cfg.policy, mode=cfg.mode)
        holder.append(self)
        log.info("DVFS: board %s, backend %s, meter %s", self.board, backend.kind, meter.kind)
        for line in describe(backend):
            log.info("DVFS domain %s", line)
        return self

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Put back clocks a crashed earlier run left changed, then start counting energy."""
        if self._restore_io is not None and self._state_dir is not None:
            try:
                restore_saved(self._state_dir, self._restore_io)
            except DvfsError as exc:
                self.errors += 1
                log.error("could not restore the clocks an earlier run changed: %s", exc)
        if not isinstance(self.meter, NullMeter):
            self.counter.start()
        self.record(running=True)

    def close(self) -> bool:
        """Restore the original clocks and stop the counter; True if the clocks are back."""
        with self._lock:
            ok = self.guard.restore()
        self.counter.stop()
        self.meter.close()
        self.record(running=False)
        return ok

    def record(self, running: bool = True) -> None:
        """Write what the clocks are now to the state folder's clock record (for ``dvfs status``);
        a failed write is logged once and never stops training."""
        if self._state_dir is None:
            return
        from streamfl.agent.dvfs_state import DomainRecord, this_process, write_record
        domains = {}
        for dom in self.backend.domains:
            try:
                domains[dom.name] = DomainRecord(dom.current_level(), dom.current_khz(),
                                                 len(dom.levels_khz))
            except DvfsError:
                pass  # unreadable now: left out, as in telemetry
        record = this_process(owner=self.owner, running=running, backend=self.backend.kind,
                              policy=self.policy, mode=self.mode, board=self.board,
                              meter=self.meter.kind, measured_power=self.meter.measured,
                              domains=domains)
        try:
            write_record(self._state_dir, record)
        except StorageError as exc:
            if not self._record_failed:
                log.warning("%s; 'streamfl-agent dvfs status' will not show this agent's clocks", exc)
            self._record_failed = True
            return
        self._recorded = {name: d.level for name, d in domains.items()}

    # ---- rounds -------------------------------------------------------------------------------

    def views(self) -> Tuple[DomainView, ...]:
        """What the policy sees of each domain (a domain that cannot be read is left out)."""
        out = []
        for dom in self.backend.domains:
            try:
                out.append(DomainView(dom.name, dom.kind, tuple(dom.levels_khz), dom.current_level()))
            except DvfsError as exc:
                log.warning("DVFS domain %s unreadable, left out of the plan: %s", dom.name, exc)
        return tuple(out)

    def apply(self, plan: Mapping[str, int]) -> Dict[str, int]:
        """Apply a plan; on a refused write, log it, count it and train at the levels in force."""
        with self._lock:
            try:
                self.guard.apply(plan)
            except (DvfsError, KeyError, IndexError) as exc:
                self.errors += 1
                log.error("DVFS plan %s not applied: %s", dict(plan), exc)
        levels = self.levels()
        if levels != self._recorded:
            self.record()
        return levels

    @property
    def changed(self) -> bool:
        """True while a clock is set away from its original (between a round's plan and a restore)."""
        return self.guard.changed

    def relax(self) -> bool:
        """Put the original clocks back while no round trains (a paused board, fleet control):
        the next round's plan sets them again. True if they are back."""
        with self._lock:
            ok = self.guard.restore()
        if not ok:
            self.errors += 1
        self.record()
        return ok

    def levels(self) -> Dict[str, int]:
        """Each domain's level now (unreadable domains left out)."""
        out = {}
        for dom in self.backend.domains:
            try:
                out[dom.name] = dom.current_level()
            except DvfsError:
                pass
        return out

    def probe_timings(self, arch_id: str, batch_size: int) -> Dict[Tuple[str, int], float]:
        """Seconds per sample per (domain, level) from a ``dvfs probe`` profile, to seed the clock
        policy with; empty unless the probe trained this model at this batch size on the same
        ladders, since other timings would mislead it."""
        measured = self.profile.measured if self.profile is not None else None
        if measured is None:
            return {}
        if (measured.arch_id, measured.batch_size) != (arch_id, batch_size):
            log.info("DVFS probe timings are for model %s, batch %d, not %s, batch %d; not used",
                     measured.arch_id, measured.batch_size, arch_id, batch_size)
            return {}
        usable = [name for name in measured.domains if self._same_ladder(name)]
        for name in sorted(set(measured.domains) - set(usable)):
            log.info("DVFS probe timings of %s are for other levels than this board's; not used",
                     name)
        return {(name, level): seconds for (name, level), seconds
                in self.profile.seconds_per_sample.items() if name in usable}

    def _same_ladder(self, name: str) -> bool:
        """Whether the backend's domain ``name`` has the levels the profile (and the probe) had."""
        try:
            return tuple(self.backend.domain(name).levels_khz) == tuple(
                self.profile.domain(name).levels_khz)
        except (KeyError, DvfsError):
            return False

    def slowdown(self) -> float:
        """How much longer a round takes at the current levels than at the top ones, for
        ``emulate_speed``: top/current frequency of the domain the clocks policy scales (the GPU
        where there is one); 1.0 otherwise, real clocks needing no help."""
        if not self.emulate_speed:
            return 1.0
        doms = [d for d in self.backend.domains if d.kind == "gpu"] or list(self.backend.domains)
        return max([d.levels_khz[-1] / float(d.current_khz()) for d in doms] or [1.0])

    def joules(self, t0_s: float, t1_s: float) -> Optional[float]:
        """Energy between two instants of ``clock``; None when nothing is measured or too old."""
        if isinstance(self.meter, NullMeter):
            return None
        if not self.counter.running:
            self.counter.sample_once(self._clock())
        try:
            return round(self.counter.joules_between(t0_s, t1_s), 6)
        except ValueError as exc:
            log.debug("no energy for the round: %s", exc)
            return None

    # ---- reporting ----------------------------------------------------------------------------

    def hello_levels(self) -> Dict[str, List[int]]:
        """Levels per domain for the Hello message."""
        return {d.name: list(d.levels_khz) for d in self.backend.domains}

    def telemetry(self) -> Dict[str, Any]:
        """The board's fields of a ``Telemetry`` message: watts now (board and per rail), kHz per
        domain, degrees C per thermal zone; each best effort, from the counter's newest reading."""
        measured = not isinstance(self.meter, NullMeter)
        power = self.counter.last_w() if measured else None
        rails = {name: round(w, 3) for name, w in self.counter.last_rails_w().items()} if measured else {}
        clocks = {}
        for dom in self.backend.domains:
            try:
                clocks[dom.name] = dom.current_khz()
            except DvfsError:
                pass
        temps: Dict[str, float] = {}
        if self._restore_io is not None and self._read_temperatures:
            temps = read_temperatures_c(self._restore_io, self._thermal_zones or None)
        return {"power_w": round(power, 3) if power is not None else None, "rails_w": rails,
                "power_meter": self.meter.kind if measured else "",
                "power_measured": bool(self.meter.measured) if measured else None,
                "clocks_khz": clocks, "temperatures_c": temps}
