"""From a ``dvfs:`` config section to a board profile, a backend and a power meter."""
import logging
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from streamfl.dvfs.base import DvfsBackend, DvfsError, FrequencyDomain, SysfsIO
from streamfl.dvfs.config import DvfsConfig
from streamfl.dvfs.cpufreq import CpufreqDomain
from streamfl.dvfs.devfreq import DevfreqDomain
from streamfl.dvfs.limits import parse_levels
from streamfl.dvfs.null import NullBackend
from streamfl.dvfs.power.base import PowerError, PowerMeter
from streamfl.dvfs.profiles import BoardProfile, DomainSpec, load_profile, load_profile_file
from streamfl.dvfs.simulated import SimulatedBackend, SimulatedDomain
from streamfl.dvfs.sysfs_io import SysfsFiles
from streamfl.dvfs.sysfs_backend import SysfsBackend

log = logging.getLogger(__name__)

_LEVEL_FILES = {"cpufreq": ("scaling_available_frequencies", 1), "devfreq": ("available_frequencies", 1000)}


def board_profile(cfg: DvfsConfig) -> BoardProfile:
    """The configured profile (a file, or a shipped name), else the one detected on this board."""
    if cfg.profile_path:
        return load_profile_file(cfg.profile_path)
    if cfg.board:
        return load_profile(cfg.board)
    from streamfl.dvfs.detect import detect_board
    return detect_board(Path(cfg.proc_root), Path(cfg.sysfs_root))


def kernel_levels(io: SysfsIO, spec: DomainSpec, directory: str) -> Tuple[int, ...]:
    """The levels to use: the kernel's table where it has one (it is the truth on this board),
    else the profile's (intel_pstate lists none)."""
    name, divisor = _LEVEL_FILES[spec.driver]
    path = "%s/%s" % (directory, name)
    if not io.exists(path):
        return tuple(spec.levels_khz)
    levels = parse_levels(io.read(path), divisor)
    if levels and levels != tuple(spec.levels_khz):
        log.warning("%s: the kernel lists %d levels up to %d kHz, the profile %d up to %d kHz; "
                    "using the kernel's", spec.name, len(levels), levels[-1], len(spec.levels_khz),
                    spec.levels_khz[-1])
    return levels or tuple(spec.levels_khz)


def sysfs_backend(profile: BoardProfile, io: SysfsIO, sysfs_root: Path, mode: str = "cap") -> SysfsBackend:
    """The profile's domains whose folder exists on this board; a missing one is skipped, loudly."""
    domains: List[FrequencyDomain] = []
    for spec in profile.domains:
        directory = spec.resolve(sysfs_root)
        if directory is None:
            log.warning("board %s: no folder for domain %s (tried %s); it is left alone",
                        profile.name, spec.name, ", ".join(spec.paths))
            continue
        levels = kernel_levels(io, spec, directory)
        cls = CpufreqDomain if spec.driver == "cpufreq" else DevfreqDomain
        domains.append(cls(io, directory, name=spec.name, levels_khz=levels, mode=mode))
    return SysfsBackend(io, domains)


def make_backend(cfg: DvfsConfig, profile: Optional[BoardProfile],
                 clock: Callable[[], float] = time.monotonic,
                 io: Optional[SysfsIO] = None) -> DvfsBackend:
    """The backend ``cfg.backend`` names; ``io`` replaces the real sysfs seam (tests, fakes)."""
    if cfg.backend == "none" or profile is None:
        return NullBackend("dvfs backend none" if cfg.backend == "none" else "no board profile")
    if cfg.backend == "simulated":
        return SimulatedBackend([SimulatedDomain(s.name, s.kind, s.levels_khz, clock=clock)
                                 for s in profile.domains])
    root = Path(cfg.sysfs_root)
    return sysfs_backend(profile, io or SysfsFiles(root), root, cfg.mode)


def watts_for(levels_khz: Sequence[int], profile_levels: Sequence[int],
              profile_watts: Sequence[float]) -> List[float]:
    """The profile's power curve at other levels (linear in frequency, held flat past its ends)."""
    return [round(float(w), 4) for w in np.interp(levels_khz, profile_levels, profile_watts)]


#: The INA3221 driver of the other JetPack generation (IIO on 4.9 kernels, hwmon on 5.10 and later).
INA3221_OTHER = {"ina3221-iio": "ina3221-hwmon", "ina3221-hwmon": "ina3221-iio"}


def make_meter(cfg: DvfsConfig, profile: Optional[BoardProfile], backend: DvfsBackend,
               busy: Callable[[], bool],
               runner: Optional[Callable[[List[str]], str]] = None) -> PowerMeter:
    """The configured or profiled meter; a hardware meter that fails falls back to the model.

    ``runner`` replaces the command runner of the Raspberry Pi 5 PMIC meter (tests).
    """
    from streamfl.dvfs.power.factory import create_meter
    from streamfl.dvfs.power.modeled import ModeledMeter
    kind = cfg.meter or (profile.power.meter if profile is not None else "null")
    if kind != "modeled" and cfg.backend != "simulated":
        # A Jetson profile names the INA3221 driver of one JetPack; the board may run the other
        # (Xavier NX: IIO on JetPack 4, hwmon on 5), unless the user chose one.
        tries = [kind] + ([INA3221_OTHER[kind]] if not cfg.meter and kind in INA3221_OTHER else [])
        for n, name in enumerate(tries):
            try:
                return create_meter(name, cfg.sysfs_root, runner)
            except PowerError as exc:
                if n + 1 < len(tries):
                    log.info("power meter %s unavailable (%s); trying %s", name, exc, tries[n + 1])
                    continue
                if profile is None:
                    raise
                log.warning("power meter %s unavailable (%s); using the board's power model",
                            name, exc)
    if profile is None or kind == "null":
        return create_meter("null")
    model = profile.power_model
    watts = {}
    for dom in backend.domains:
        spec = profile.domain(dom.name)
        watts[dom.name] = watts_for(dom.levels_khz, spec.levels_khz, model.watts_per_level[dom.name])
    return ModeledMeter(backend.domains, watts, model.idle_w, busy)


def describe(backend: DvfsBackend) -> List[str]:
    """One line per domain for ``streamfl-agent dvfs status`` and the start-up log."""
    lines = []
    for dom in backend.domains:
        try:
            now = "%d kHz now, cap %d kHz (level %d)" % (dom.current_khz(), dom.cap_khz(),
                                                         dom.current_level())
        except DvfsError as exc:
            now = "unreadable: %s" % exc
        lines.append("%s (%s): %d levels %d..%d kHz, %s" % (
            dom.name, dom.kind, len(dom.levels_khz), dom.levels_khz[0], dom.levels_khz[-1], now))
    return lines
