"""The ``dvfs:`` section of an agent config: which backend, policy and power meter, and the one
board setting that names the board profile.

The defaults read clocks but change nothing (``policy: none``): an agent starts lowering clocks
only when its operator picks a policy, so installing streamfl never throttles a board by surprise.

One board setting: the agent config's top-level ``board`` names the board profile
(``configs/boards/<name>.yaml``), or ``auto`` to detect it; the same name is what the agent's
Hello tells the coordinator. It used to be two keys, a free label at the top level and the
profile in ``dvfs.board``, and agents whose ``dvfs.board`` was set told the coordinator they
were ``generic``. ``resolve_board_setting`` keeps old files loading: ``dvfs.board`` is read where
``board`` is ``auto`` (a deprecation WARNING, once per process), the old labels (``orin-nano``,
``rpi4``, ``generic``, ...) mean their profile (a WARNING too), and the two keys naming different
boards is a ``ConfigError``. Why the top-level key and not ``dvfs.board``: the board is what the
fleet view shows whatever the DVFS backend, ``none`` included; the DVFS section only reads it.
``DvfsConfig.board`` stays the field the DVFS code reads: the agent config copies the resolved
name into it (``None`` for ``auto``).
"""
import logging
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Set

from streamfl.config import bounded

log = logging.getLogger(__name__)

BACKENDS = ("sysfs", "simulated", "none")
MODES = ("cap", "pin")
#: The top-level ``board`` that detects the profile (device-tree model, else generic-linux).
AUTO_BOARD = "auto"
#: The labels the top-level ``board`` took before it named the profile, and the profile each is
#: (``generic``, the old default, meant "not said": detect).
LEGACY_BOARD_LABELS = {
    "generic": AUTO_BOARD,
    "xavier-nx": "jetson-xavier-nx",
    "agx-orin": "jetson-agx-orin",
    "orin-nano": "jetson-orin-nano",
    "rpi4": "raspberry-pi-4",
    "rpi5": "raspberry-pi-5",
}
_warned: Set[str] = set()


def _warn_once(key: str, message: str) -> None:
    """A deprecation WARNING, said once per process and key (a config is built more than once)."""
    if key not in _warned:
        _warned.add(key)
        log.warning("%s", message)


def resolve_board_setting(board: Optional[str], legacy: Optional[str]) -> str:
    """The profile name (or ``auto``) that the top-level ``board`` and the deprecated ``dvfs.board``
    say together; ``ValueError`` naming both keys where they name different boards.

    Whether a name is a known profile is checked where the profile loads (``agent.preflight``,
    exit 2 naming the key), as for ``dvfs.profile_path``.
    """
    board = AUTO_BOARD if board is None else board
    if board in LEGACY_BOARD_LABELS:
        new = LEGACY_BOARD_LABELS[board]
        _warn_once("label:" + board, "board %r is an old label; it now names the board profile: "
                   "write board: %s (the profile names of configs/boards, or auto)" % (board, new))
        board = new
    if legacy is None:
        return board
    if board == AUTO_BOARD:
        _warn_once("dvfs.board", "dvfs.board is deprecated: write board: %s at the top level of "
                   "the agent config (one key names the profile and what the coordinator shows)"
                   % legacy)
        return legacy
    if board != legacy:
        raise ValueError("board %r and dvfs.board %r name different boards: keep only the "
                         "top-level board (dvfs.board is deprecated)" % (board, legacy))
    return board


@dataclass(frozen=True)
class DvfsConfig:
    """How the agent reads and sets clocks and measures energy."""

    #: "sysfs" (the board's cpufreq/devfreq files), "simulated" (in memory, for demos) or "none".
    backend: str = "sysfs"
    #: Deprecated: the top-level ``board`` names the profile. Read only where that is ``auto``
    #: (a WARNING); naming another board than it is an error. In a built agent config this holds
    #: the resolved profile name (None: detect from the device tree).
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
        # The board may come from the agent config's top-level key, which copies it in and checks
        # again (``check_policy``); a policy needing the profile's watts waits for it.
        self.check_policy(board_pending=True)

    def check_policy(self, board_pending: bool = False) -> None:
        """Build the policy once, so a bad policy or option fails at load time (exit 2), not at
        the first round; ``ValueError``. ``board_pending``: skip a policy that needs the board's
        power model while no board is named yet."""
        from streamfl.dvfs.policies.factory import make_policy
        from streamfl.errors import ConfigError
        if board_pending and self._wants_power() and self.board is None and self.profile_path is None:
            return
        try:
            make_policy(self.policy, **self.policy_kwargs())
        except ConfigError as exc:
            raise ValueError("dvfs %s" % exc) from None

    def _wants_power(self) -> bool:
        """Whether the policy's options need board watts per level it does not give itself."""
        options = self.policy_options
        wants = options.get("clp_level") == "efficient" or options.get("climb_energy_ratio") is not None
        return self.policy == "clp-aware" and wants and "power_w" not in options

    def policy_kwargs(self) -> Dict[str, Any]:
        """``policy_options``, with the clp-aware energy options' ``power_w`` filled in from the
        board profile's power model when the options ask for it and do not give it (board watts
        per level while training, ``streamfl.dvfs.utilization.power_table``)."""
        options = dict(self.policy_options)
        if self._wants_power():
            from streamfl.dvfs.profiles import load_profile, load_profile_file
            from streamfl.dvfs.utilization import power_table, training_utilization
            from streamfl.errors import ConfigError
            if self.profile_path is None and self.board is None:
                raise ConfigError("clp-aware clp_level efficient / climb_energy_ratio need power_w, "
                                  "or a board (not auto: it is detected only at start) or "
                                  "dvfs.profile_path whose power model gives it")
            profile = (load_profile_file(self.profile_path) if self.profile_path is not None
                       else load_profile(self.board))
            options["power_w"] = power_table(profile, training_utilization(profile))
        return options
