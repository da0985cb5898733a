"""The ``dvfs:`` section of an agent config: which backend, board profile, policy and power meter.

The defaults read clocks but change nothing (``policy: none``): an agent starts lowering clocks
only when its operator picks a policy, so installing streamfl never throttles a board by surprise.
"""
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from streamfl.config import bounded

BACKENDS = ("sysfs", "simulated", "none")
MODES = ("cap", "pin")


@dataclass(frozen=True)
class DvfsConfig:
    """How the agent reads and sets clocks and measures energy."""

    #: "sysfs" (the board's cpufreq/devfreq files), "simulated" (in memory, for demos) or "none".
    backend: str = "sysfs"
    #: Board profile name (configs/boards/<name>.yaml); None = detect from the device tree.
    board: Optional[str] = None
    #: A profile YAML of your own instead of a shipped one.
    profile_path: Optional[str] = None
    #: "cap" writes only the maximum and keeps the board's governor; "pin" uses userspace.
    mode: str = "cap"
    #: "none", "performance", "powersave", "fixed" or "clp-aware".
    policy: str = "none"
    #: Options of the policy (fixed: levels; clp-aware: threshold...).
    policy_options: Dict[str, Any] = field(default_factory=dict)
    #: Power meter kind; None = the profile's.
    meter: Optional[str] = None
    #: Samples per second of the energy counter's thread.
    energy_rate_hz: float = bounded(10.0, 0.0, 1000.0, lo_open=True)
    #: Simulated backend only: stretch each round as the lower clock would (time proportional to
    #: 1/f, a compute-bound round), so a demo on one machine shows what the levels cost and save.
    emulate_speed: bool = False
    #: Hardware roots, for tests and containers that mount the host's /sys elsewhere.
    sysfs_root: str = "/sys"
    #: Where /proc is (board detection reads <proc_root>/device-tree/model), for tests and
    #: containers.
    proc_root: str = "/proc"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError("dvfs backend must be one of %s, got %r" % (", ".join(BACKENDS), self.backend))
        if self.mode not in MODES:
            raise ValueError("dvfs mode must be one of %s, got %r" % (", ".join(MODES), self.mode))
        if self.emulate_speed and self.backend != "simulated":
            raise ValueError("dvfs emulate_speed needs backend simulated (real clocks slow down "
                             "by themselves)")
        if not self.energy_rate_hz > 0:
            raise ValueError("dvfs energy_rate_hz must be > 0, got %r" % (self.energy_rate_hz,))
        from streamfl.dvfs.policies.factory import make_policy
        from streamfl.errors import ConfigError
        try:  # a bad policy or option fails at load time (exit 2), not at the first round
            make_policy(self.policy, **self.policy_kwargs())
        except ConfigError as exc:
            raise ValueError("dvfs %s" % exc) from None

    def policy_kwargs(self) -> Dict[str, Any]:
        """``policy_options``, with the clp-aware energy options' ``power_w`` filled in from the
        board profile's power model when the options ask for it and do not give it (board watts
        per level while training, ``streamfl.dvfs.utilization.power_table``)."""
        options = dict(self.policy_options)
        wants_power = (options.get("clp_level") == "efficient"
                       or options.get("climb_energy_ratio") is not None)
        if self.policy == "clp-aware" and wants_power and "power_w" not in options:
            from streamfl.dvfs.profiles import load_profile, load_profile_file
            from streamfl.dvfs.utilization import power_table, training_utilization
            from streamfl.errors import ConfigError
            if self.profile_path is None and self.board is None:
                raise ConfigError("clp-aware clp_level efficient / climb_energy_ratio need power_w, "
                                  "or a dvfs board or profile_path whose power model gives it")
            profile = (load_profile_file(self.profile_path) if self.profile_path is not None
                       else load_profile(self.board))
            options["power_w"] = power_table(profile, training_utilization(profile))
        return options
