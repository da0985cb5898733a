"""Board profiles: a board's frequency domains, sysfs paths, power sensor and power model.

One YAML per board ships in ``configs/boards/`` (package ``streamfl.boards``); users may point at
their own file. Both are loaded with the project's config loader, so unknown keys and wrong types
are ``ConfigError`` naming the file and key, and then cross-checked here (levels ascending, one
watts figure per level, kinds and drivers known).

The file ``streamfl-agent dvfs probe`` writes is such a profile with one more key, ``measured``
(see ``Measurement``): the seconds per sample and watts it measured per level. Its watts replace
the power model at load (``measured_power_model``), so a simulated backend's modeled meter reports
them, and ``BoardProfile.seconds_per_sample`` gives the timings to the simulator and the policies.
"""
import dataclasses
import importlib.resources
import logging
import math
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple


from streamfl.config import build, parse_yaml, read_yaml
from streamfl.errors import ConfigError

log = logging.getLogger(__name__)

#: Every profile shipped in ``streamfl.boards`` (file ``<name>.yaml``); generic-linux is the fallback.
PROFILE_NAMES = (
    "jetson-nano",
    "jetson-xavier-nx",
    "jetson-agx-orin",
    "jetson-orin-nano",
    "jetson-orin-nano-super",
    "raspberry-pi-4",
    "raspberry-pi-5",
    "generic-linux",
)
GENERIC = "generic-linux"

#: Domain kinds and the kernel framework each is driven through (cpufreq is kHz, devfreq Hz).
KINDS = ("cpu", "gpu")
DRIVERS = {"cpu": "cpufreq", "gpu": "devfreq"}
#: Power meters of ``streamfl.dvfs.power`` a profile can name.
METERS = ("ina3221-iio", "ina3221-hwmon", "rpi5-pmic", "rapl", "modeled", "null")

_PACKAGE = "streamfl.boards"


@dataclasses.dataclass(frozen=True)
class DomainSpec:
    """One frequency domain: a cpufreq policy or a devfreq GPU, its candidate sysfs dirs and levels."""

    name: str = ""
    kind: str = ""
    driver: str = ""
    #: Directories relative to the sysfs root; the first that exists is used (JP5 and JP6 GPU paths).
    paths: Tuple[str, ...] = ()
    #: Ascending; kHz for every domain, devfreq tables converted from Hz.
    levels_khz: Tuple[int, ...] = ()
    #: CPU domains: the CPUs of this cpufreq policy (its ``related_cpus``), which the per-level
    #: watts of the power model load all at once; None where unknown (a discovered domain).
    cores: Optional[int] = None

    def __post_init__(self):
        if not self.name:
            raise ValueError("missing or empty key 'name'")
        if self.kind not in KINDS:
            raise ValueError("key 'kind': %r is not one of %s" % (self.kind, ", ".join(KINDS)))
        if self.cores is not None and self.kind != "cpu":
            raise ValueError("key 'cores': only a cpu domain has cores")
        if self.cores is not None and self.cores < 1:
            raise ValueError("key 'cores': must be at least 1, got %r" % (self.cores,))
        if self.driver != DRIVERS[self.kind]:
            raise ValueError("key 'driver': a %s domain uses %r, not %r" % (
                self.kind, DRIVERS[self.kind], self.driver))
        if not self.paths:
            raise ValueError("key 'paths': at least one directory is needed")
        for path in self.paths:
            if not path or path.startswith("/") or ".." in path.split("/"):
                raise ValueError("key 'paths': %r must be relative to the sysfs root" % path)
        if not self.levels_khz:
            raise ValueError("key 'levels_khz': at least one level is needed")
        if any(f <= 0 for f in self.levels_khz):
            raise ValueError("key 'levels_khz': levels must be positive")
        if any(b <= a for a, b in zip(self.levels_khz, self.levels_khz[1:])):
            raise ValueError("key 'levels_khz': levels must be strictly ascending")

    def resolve(self, sysfs_root: Path) -> Optional[str]:
        """The first candidate path that exists under ``sysfs_root``, or None."""
        for path in self.paths:
            if (Path(sysfs_root) / path).exists():
                return path
        return None


@dataclasses.dataclass(frozen=True)
class PowerSpec:
    """Which meter reads this board's power and the rail names the hardware gives it."""

    meter: str = "null"
    #: The rail measuring the whole board (``VDD_IN``), or None where the board has none.
    input_rail: Optional[str] = None
    rails: Tuple[str, ...] = ()

    def __post_init__(self):
        if self.meter not in METERS:
            raise ValueError("key 'meter': %r is not one of %s" % (self.meter, ", ".join(METERS)))
        if len(set(self.rails)) != len(self.rails):
            raise ValueError("key 'rails': rail names repeat")
        if self.input_rail is not None and self.input_rail not in self.rails:
            raise ValueError("key 'input_rail': %r is not among the rails" % self.input_rail)


@dataclasses.dataclass(frozen=True)
class PowerModel:
    """Board power while idle, plus the extra watts of training at each level of each domain."""

    idle_w: float = 0.0
    #: Domain name -> one figure per level (same length as that domain's ``levels_khz``).
    watts_per_level: Dict[str, Tuple[float, ...]] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.idle_w < 0:
            raise ValueError("key 'idle_w': must not be negative")
        for name, watts in self.watts_per_level.items():
            if any(w < 0 for w in watts):
                raise ValueError("key 'watts_per_level.%s': watts must not be negative" % name)
            if any(b < a for a, b in zip(watts, watts[1:])):
                raise ValueError("key 'watts_per_level.%s': watts must not fall as the level rises"
                                 % name)


@dataclasses.dataclass(frozen=True)
class MeasuredPowerModel(PowerModel):
    """A power model from probe measurements: watts may dip as the level rises (meter noise)."""

    #: The model the profile file declares, kept so a profile written from this one stays valid.
    declared: PowerModel = dataclasses.field(default_factory=PowerModel)

    def __post_init__(self):
        if self.idle_w < 0 or any(w < 0 for ws in self.watts_per_level.values() for w in ws):
            raise ValueError("measured watts must not be negative")


@dataclasses.dataclass(frozen=True)
class MeasuredDomain:
    """What the probe measured at each level of one domain (index = level, as in ``levels_khz``)."""

    #: Training wall time / samples trained; what a round costs per sample at that level.
    seconds_per_sample: Tuple[float, ...] = ()
    #: Mean total board power while training (all rails of the meter); null where nothing measured.
    train_w: Tuple[Optional[float], ...] = ()

    def __post_init__(self):
        if not self.seconds_per_sample:
            raise ValueError("key 'seconds_per_sample': at least one level is needed")
        if any(not (math.isfinite(s) and s > 0) for s in self.seconds_per_sample):
            raise ValueError("key 'seconds_per_sample': times must be finite and above zero")
        if len(self.train_w) != len(self.seconds_per_sample):
            raise ValueError("key 'train_w': %d figures for %d seconds_per_sample"
                             % (len(self.train_w), len(self.seconds_per_sample)))
        if len({w is None for w in self.train_w}) > 1:
            raise ValueError("key 'train_w': either every level has watts or none has")
        if any(w is not None and not (math.isfinite(w) and w >= 0) for w in self.train_w):
            raise ValueError("key 'train_w': watts must be finite and not negative")


#: Version of the ``measured`` section (1 was a stand-alone probe file, not a profile).
MEASURED_FORMAT = 2


@dataclasses.dataclass(frozen=True)
class Measurement:
    """A ``dvfs probe`` run: how it measured, and per domain stepped (in lockstep) the figures."""

    format: int = MEASURED_FORMAT
    #: The backend (sysfs or simulated) and power meter kind the figures came from.
    backend: str = ""
    meter: str = "null"
    #: The model trained (``ModelSpec.arch_id``): timings hold for this model and batch size only.
    arch_id: str = ""
    batch_size: int = 0
    #: At least this many timed SGD steps per level.
    steps: int = 0
    #: ISO 8601, UTC.
    measured_at: str = ""
    #: Mean board power with no training, clocks as found; null where nothing measured it.
    idle_w: Optional[float] = None
    #: Domains stepped together (a shorter ladder held at its top), so their figures agree.
    domains: Dict[str, MeasuredDomain] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.format != MEASURED_FORMAT:
            raise ValueError("key 'format': %r, this streamfl reads format %d"
                             % (self.format, MEASURED_FORMAT))
        if not self.arch_id:
            raise ValueError("missing or empty key 'arch_id'")
        if self.batch_size < 1 or self.steps < 1:
            raise ValueError("keys 'batch_size' and 'steps' must be at least 1")
        if self.idle_w is not None and not (math.isfinite(self.idle_w) and self.idle_w >= 0):
            raise ValueError("key 'idle_w': must be finite and not negative")
        if not self.domains:
            raise ValueError("key 'domains': at least one measured domain is needed")
        longest = max(self.domains.values(), key=lambda d: len(d.seconds_per_sample))
        for name, dom in self.domains.items():
            n = len(dom.seconds_per_sample)
            if (dom.seconds_per_sample != longest.seconds_per_sample[:n]
                    or dom.train_w != longest.train_w[:n]):
                raise ValueError("key 'domains.%s': domains probed together must carry the same "
                                 "figures at the levels they share" % name)


@dataclasses.dataclass(frozen=True)
class BoardProfile:
    """Everything streamfl knows about one kind of board, as loaded from its YAML."""

    name: str = ""
    description: str = ""
    #: Substrings of /proc/device-tree/model that identify the board (matched case-insensitively).
    model_patterns: Tuple[str, ...] = ()
    #: A 4.9 kernel (JetPack 4): crossing min over max gives EINVAL, so limits go in a safe order.
    legacy_limits: bool = False
    has_gpu: bool = False
    domains: Tuple[DomainSpec, ...] = ()
    power: PowerSpec = dataclasses.field(default_factory=PowerSpec)
    power_model: PowerModel = dataclasses.field(default_factory=PowerModel)
    #: Thermal zone ``type`` strings worth reporting in telemetry.
    thermal_zones: Tuple[str, ...] = ()
    #: What ``streamfl-agent dvfs probe`` measured on this board; None for a modeled profile.
    measured: Optional[Measurement] = None

    @property
    def seconds_per_sample(self) -> Dict[Tuple[str, int], float]:
        """Measured (domain, level) -> seconds per sample, for the simulator and the policies."""
        if self.measured is None:
            return {}
        return {(name, i): s for name, dom in self.measured.domains.items()
                for i, s in enumerate(dom.seconds_per_sample)}

    @property
    def measured_arch_id(self) -> Optional[str]:
        """The model the timings hold for (others train at other speeds); None if unmeasured."""
        return self.measured.arch_id if self.measured is not None else None

    def domain(self, name: str) -> DomainSpec:
        """The domain called ``name``; ``KeyError`` naming the known ones otherwise."""
        for dom in self.domains:
            if dom.name == name:
                return dom
        raise KeyError("board %s has no domain %r (have: %s)" % (
            self.name, name, ", ".join(d.name for d in self.domains) or "none"))

    def modeled_w(self, levels: Mapping[str, int]) -> float:
        """Modeled board power while training with each named domain at level index ``levels[name]``."""
        total = self.power_model.idle_w
        for name, index in levels.items():
            total += self.power_model.watts_per_level[name][index]
        return total

    def utilized_w(self, levels: Mapping[str, int], utilization: Mapping[str, float]) -> float:
        """Modeled board power while each named domain, at level index ``levels[name]``, draws the
        share ``utilization[name]`` (default 1.0) of its full-load watts: a training round's power
        (see ``training_utilization``); all shares 1.0 give ``modeled_w``."""
        total = self.power_model.idle_w
        for name, index in levels.items():
            total += self.power_model.watts_per_level[name][index] * utilization.get(name, 1.0)
        return total


def model_watts(levels_khz: Sequence[int], top_w: float) -> Tuple[float, ...]:
    """Extra watts per level for a domain that adds ``top_w`` at its top level.

    Dynamic power is C*V^2*f and DVFS lowers V with f, so power grows between linearly and
    cubically in f; the shipped profiles use top_w * (0.3*x + 0.7*x^3) with x = f / f_max, rounded
    to milliwatts. Where a profile was measured instead, its YAML says so.
    """
    top = float(levels_khz[-1])
    return tuple(round(top_w * (0.3 * (f / top) + 0.7 * (f / top) ** 3), 3) for f in levels_khz)


def _check(profile: BoardProfile, source: str) -> BoardProfile:
    """Cross-field checks the dataclasses cannot make alone; ``ConfigError`` names file and key."""
    if not profile.name:
        raise ConfigError("%s: missing or empty key 'name'" % source)
    names = [d.name for d in profile.domains]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError("%s: key 'domains': domain %r appears twice" % (source, name))
    gpus = [d.name for d in profile.domains if d.kind == "gpu"]
    if profile.has_gpu != bool(gpus):
        raise ConfigError("%s: key 'has_gpu' is %s but the GPU domains are [%s]" % (
            source, str(profile.has_gpu).lower(), ", ".join(gpus)))
    if any(not p for p in profile.model_patterns):
        raise ConfigError("%s: key 'model_patterns': empty pattern" % source)
    watts = profile.power_model.watts_per_level
    for name in watts:
        if name not in names:
            raise ConfigError("%s: key 'power_model.watts_per_level.%s': no such domain (have: %s)"
                              % (source, name, ", ".join(names) or "none"))
    for dom in profile.domains:
        if dom.name not in watts:
            raise ConfigError("%s: key 'power_model.watts_per_level': domain %r has no watts"
                              % (source, dom.name))
        if len(watts[dom.name]) != len(dom.levels_khz):
            raise ConfigError("%s: key 'power_model.watts_per_level.%s': %d figures for %d levels"
                              % (source, dom.name, len(watts[dom.name]), len(dom.levels_khz)))
    if profile.measured is not None:
        for name, dom in profile.measured.domains.items():
            if name not in names:
                raise ConfigError("%s: key 'measured.domains.%s': no such domain (have: %s)"
                                  % (source, name, ", ".join(names) or "none"))
            count = len(profile.domain(name).levels_khz)
            if len(dom.seconds_per_sample) != count:
                raise ConfigError("%s: key 'measured.domains.%s': %d figures for %d levels"
                                  % (source, name, len(dom.seconds_per_sample), count))
    return profile


def declared_power_model(profile: BoardProfile) -> PowerModel:
    """The power model as the profile's file wrote it, before measured watts replaced it."""
    model = profile.power_model
    return model.declared if isinstance(model, MeasuredPowerModel) else model


def measured_power_model(profile: BoardProfile) -> PowerModel:
    """The power model that gives back the probe's watts, else the profile's own.

    Idle is the measured idle (else the model's); the measured domain with the most levels carries
    measured training watts minus idle (floored at 0), every other domain 0 W: the probe measured
    whole-board power with the other domains where they were, so only its walk is known.
    """
    measured, declared = profile.measured, declared_power_model(profile)
    if measured is None or all(d.train_w[0] is None for d in measured.domains.values()):
        return declared
    idle_w = measured.idle_w if measured.idle_w is not None else declared.idle_w
    name = max(measured.domains, key=lambda n: len(measured.domains[n].train_w))
    watts = {d.name: (0.0,) * len(d.levels_khz) for d in profile.domains}
    watts[name] = tuple(round(max(0.0, w - idle_w), 4) for w in measured.domains[name].train_w)
    return MeasuredPowerModel(idle_w=idle_w, watts_per_level=watts, declared=declared)


def from_mapping(data: Mapping[str, Any], source: str) -> BoardProfile:
    """Build and check a profile from parsed YAML (measured watts, if any, as its power model)."""
    if "format" in data and "measured" not in data:
        raise ConfigError("%s: unknown key 'format': a 'dvfs probe' file of format %r, from before "
                          "probe files were board profiles; run 'streamfl-agent dvfs probe' again"
                          % (source, data["format"]))
    profile = _check(build(BoardProfile, data, source), source)
    if profile.measured is None:
        return profile
    return dataclasses.replace(profile, power_model=measured_power_model(profile))


def validate(profile: BoardProfile, source: str) -> BoardProfile:
    """Check a profile made in code (a discovered one) the way a loaded one is checked."""
    return _check(profile, source)


def _read_packaged(filename: str) -> str:
    """Text of a shipped YAML: ``files()`` on 3.9+, ``read_text`` on 3.8 (deprecated in 3.11)."""
    if hasattr(importlib.resources, "files"):
        return (importlib.resources.files(_PACKAGE)  # novermin (guarded by hasattr)
                .joinpath(filename).read_text(encoding="utf-8"))
    return importlib.resources.read_text(_PACKAGE, filename, encoding="utf-8")


def load_profile(name: str) -> BoardProfile:
    """The shipped profile called ``name``; ``ConfigError`` listing the known ones otherwise."""
    if name not in PROFILE_NAMES:
        raise ConfigError("unknown board profile %r (known: %s)" % (name, ", ".join(PROFILE_NAMES)))
    filename = name + ".yaml"
    source = "%s/%s" % (_PACKAGE, filename)
    try:
        text = _read_packaged(filename)
    except OSError as exc:
        raise ConfigError("cannot read board profile %s: %s" % (source, exc.strerror or exc)) from exc
    profile = from_mapping(parse_yaml(text, "board profile %s" % source), source)
    if profile.name != name:
        raise ConfigError("%s: key 'name' is %r, expected %r" % (source, profile.name, name))
    return profile


def load_profile_file(path) -> BoardProfile:
    """A user-supplied profile from a YAML file (same schema and checks as the shipped ones)."""
    path = Path(path)
    return from_mapping(read_yaml(path), str(path))
