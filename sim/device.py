"""The simulator's device model: how long a virtual board trains and moves a model,
what it draws meanwhile, and when it is there at all.

- Compute, FedTeddi eq. 4: a round of ``n`` samples takes ``a*n`` plus an exponential delay of
  mean ``n/mu`` (CDF ``1 - exp(-mu/(tau*b) * (t - a*tau*b))``, ``tau*b = n``). Here
  ``noise_scale = 1/(a*mu)``: the exponential part's mean as a fraction of the shift.
- Clocks: timings at the top levels scale with the frequency ratio ``f_top/f`` of the domains
  AdaCLP s4.2.2 scales (GPUs if any, else CPUs), or follow a ``dvfs probe``'s measured walk.
- Power: the board profile's power model, weighted by what a round uses: idle + each domain's
  full-load watts at its level times the round's utilization of it (``DeviceModel.train_w``):
  GPU boards the GPU at 1.0 and about one core per CPU cluster, CPU-only boards every core
  (``streamfl.dvfs.utilization.training_utilization``; the shares are ``DeviceSpec`` fields).
- Network: a fixed bandwidth, or the Shannon rate ``B*log2(1 + P*|H|^2/(B*N0))`` of FedTeddi
  III-B2 with its V-A path loss ``128.1 + 37.6*log10(d_km)`` dB (the session paper, eqs. 24-25,
  uses the same rate with the server's power on the downlink).
- Availability: join/leave times and offline windows (the session paper's dynamic device set),
  plus a per-round participation probability.

Every random draw comes from the device's own numpy Generators, seeded, so a run repeats exactly.
"""
import dataclasses
import math
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from streamfl.config import allows_infinity
from streamfl.dvfs.profiles import PROFILE_NAMES, BoardProfile, load_profile, load_profile_file
from streamfl.dvfs.utilization import training_utilization
from streamfl.errors import ConfigError
from streamfl.sim.presence import Presence

CPU, GPU = "cpu", "gpu"
CHANNELS = ("fixed", "shannon")

#: Mean seconds per training sample at the top clocks when neither the scenario nor a probe says.
#: GPU boards: FedTeddi V-A's a_i = 0.5 ms/sample (a small CNN); CPU-only boards four times that
#: [U: a Cortex-A72/A76 cluster against a Jetson GPU on a small HAR model]. Set
#: ``seconds_per_sample_s`` per scenario model for anything quantitative.
DEFAULT_SECONDS_PER_SAMPLE_S = {GPU: 0.5e-3, CPU: 2.0e-3}

_BITS_PER_BYTE = 8
_MBPS = 1e6  # 1 Mbps = 1e6 bit/s


class DeviceSpecError(ConfigError, ValueError):
    """A bad device value: a ``ConfigError``, and a ``ValueError`` so ``config.build`` names the file."""


def _finite(name: str, value: float, low: float = -math.inf, strict: bool = False) -> float:
    """``value`` as a float if finite and above ``low`` (``strict``) or at least ``low``."""
    value = float(value)
    if not math.isfinite(value) or value < low or (strict and value == low):
        raise DeviceSpecError("key %r: must be a finite number %s %g, got %r"
                              % (name, ">" if strict else ">=", low, value))
    return value


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """What a scenario says about one virtual device (units in names; Mbps = 1e6 bit/s)."""

    #: A shipped board profile (``configs/boards``); ignored when ``profile_path`` is set.
    board: str = "raspberry-pi-4"
    #: A profile file (e.g. a ``dvfs probe`` output, whose measured timings then apply).
    profile_path: Optional[str] = None
    #: Slowness multiplier: 5 trains five times slower (AdaCLP Table 3 fast/slow mixes 1:5..1:20).
    speed: float = 1.0
    #: Mean seconds per sample at the top clocks for the scenario's model; None: the profile's
    #: measured timings, else ``DEFAULT_SECONDS_PER_SAMPLE_S`` of the board's kind.
    seconds_per_sample_s: Optional[float] = None
    #: FedTeddi eq. 4 noise: exponential mean / shift (``1/(a*mu)``). FedTeddi V-A's a = 0.5
    #: ms/sample and mu = 2 samples/ms give 1.0; default 0.05, the few-percent round-to-round
    #: jitter of a board with pinned clocks [U] (clp_aware.py's threshold assumes the same).
    noise_scale: float = 0.05
    #: What one per-window backward pass (FedCurv's Fisher diagonal) costs in samples of batched
    #: training. bench/bench_fisher.py: 50 per-window passes took 49.8% of a 250-sample lstm round,
    #: i.e. 2.5 samples each; AdaCLP's trace (one backward over n windows) costs n samples.
    per_window_backward_samples: float = 2.5
    #: Share of each domain's full-load watts (the profile's per-level figures) a training round
    #: draws; see ``streamfl.dvfs.utilization.training_utilization`` for the choice and its reasons.
    #: On a GPU board: the GPU's share (1.0: GPU-bound), and every CPU domain's (None: one core of
    #: that cluster, 1/cores; 1/(all cores) bills one core spread over the board).
    gpu_utilization: float = 1.0
    cpu_utilization_with_gpu: Optional[float] = None
    #: On a CPU-only board: every CPU domain's share (1.0: PyTorch's threads use every core).
    cpu_utilization_without_gpu: float = 1.0
    #: "fixed" (``up_mbps``/``down_mbps``) or "shannon" (the radio fields below).
    channel: str = "fixed"
    #: Fixed rates [U: a shared Wi-Fi link; near the Shannon default's 12.6 Mbps below].
    up_mbps: float = 10.0
    down_mbps: float = 10.0
    #: Per-device bandwidth: FedTeddi V-A's 20 MHz shared by 20 concurrent uploaders.
    bandwidth_hz: float = 1e6
    #: Device transmit power, FedTeddi V-A.
    tx_power_dbm: float = 23.0
    #: Server transmit power for the downlink (session paper eq. 25) [U: our copy lacks the value;
    #: equal to the device's, the downlink takes as long as the uplink].
    server_tx_power_dbm: float = 23.0
    #: Thermal noise density, FedTeddi V-A.
    noise_dbm_per_hz: float = -174.0
    #: Path loss ``path_loss_1km_db + 10*exponent*log10(d_km)``: FedTeddi V-A's 128.1 + 37.6*log10.
    path_loss_exponent: float = 3.76
    path_loss_1km_db: float = 128.1
    #: Mean distance of a uniform draw in FedTeddi V-A's 250 m disk (2R/3).
    distance_m: float = 167.0
    #: Log-normal shadowing, drawn once per device; FedTeddi V-A uses 8 dB, default 0 (no draw).
    shadowing_std_db: float = 0.0
    #: Virtual time the device first appears, and leaves for good (None: never).
    join_s: float = 0.0
    leave_s: Optional[float] = None
    #: Probability it takes part in a round it could start (partial participation).
    participation: float = 1.0
    #: Sorted, non-overlapping [start_s, end_s) windows offline (session churn); end may be inf.
    offline: Tuple[Tuple[float, float], ...] = allows_infinity(default=())

    def __post_init__(self):
        if self.profile_path is None and self.board not in PROFILE_NAMES:
            raise DeviceSpecError("key 'board': unknown board profile %r (known: %s)"
                                  % (self.board, ", ".join(PROFILE_NAMES)))
        _finite("speed", self.speed, 0.0, strict=True)
        if self.seconds_per_sample_s is not None:
            _finite("seconds_per_sample_s", self.seconds_per_sample_s, 0.0, strict=True)
        _finite("noise_scale", self.noise_scale, 0.0)
        _finite("per_window_backward_samples", self.per_window_backward_samples, 0.0)
        for key in ("gpu_utilization", "cpu_utilization_with_gpu", "cpu_utilization_without_gpu"):
            value = getattr(self, key)
            if value is not None and _finite(key, value, 0.0) > 1.0:
                raise DeviceSpecError("key %r: a share of full load, within [0, 1], got %r"
                                      % (key, value))
        if self.channel not in CHANNELS:
            raise DeviceSpecError("key 'channel': %r is not one of %s"
                                  % (self.channel, ", ".join(CHANNELS)))
        for key in ("up_mbps", "down_mbps", "bandwidth_hz", "path_loss_exponent", "distance_m"):
            _finite(key, getattr(self, key), 0.0, strict=True)
        for key in ("tx_power_dbm", "server_tx_power_dbm", "noise_dbm_per_hz", "path_loss_1km_db"):
            _finite(key, getattr(self, key))
        _finite("shadowing_std_db", self.shadowing_std_db, 0.0)
        join_s = _finite("join_s", self.join_s, 0.0)
        if self.leave_s is not None and not _finite("leave_s", self.leave_s) > join_s:
            raise DeviceSpecError("key 'leave_s': %r is not after join_s %r"
                                  % (self.leave_s, self.join_s))
        participation = float(self.participation)
        if not 0.0 <= participation <= 1.0:
            raise DeviceSpecError("key 'participation': must be within [0, 1], got %r"
                                  % (self.participation,))
        windows = []
        for i, window in enumerate(self.offline):
            if len(window) != 2:
                raise DeviceSpecError("key 'offline[%d]': expected [start_s, end_s], got %r"
                                      % (i, window))
            start_s = _finite("offline[%d] start" % i, window[0], 0.0)
            end_s = float(window[1])
            if not end_s > start_s:
                raise DeviceSpecError("key 'offline[%d]': end %r is not after start %r"
                                      % (i, end_s, start_s))
            if windows and start_s < windows[-1][1]:
                raise DeviceSpecError("key 'offline[%d]': windows must be sorted and must not "
                                      "overlap (starts at %g, the one before ends at %g)"
                                      % (i, start_s, windows[-1][1]))
            windows.append((start_s, end_s))
        object.__setattr__(self, "offline", tuple(windows))


class DeviceModel:
    """One virtual device: its timings, radio, power and presence, with its own seeded draws."""

    def __init__(self, spec: DeviceSpec, profile: BoardProfile, seed: int):
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise DeviceSpecError("seed must be a non-negative integer, got %r" % (seed,))
        self.spec = spec
        self.profile = profile
        self.levels_khz: Dict[str, Tuple[int, ...]] = {
            d.name: tuple(d.levels_khz) for d in profile.domains}
        gpus = tuple(d.name for d in profile.domains if d.kind == GPU)
        #: The domains whose clock sets the pace (AdaCLP s4.2.2), as clp_aware.scaled_domains.
        self.scaled_domains: Tuple[str, ...] = gpus or tuple(
            d.name for d in profile.domains if d.kind == CPU)
        self.kind = GPU if gpus else CPU
        #: Domain name -> share of its full-load watts a training round draws.
        self.utilization: Dict[str, float] = training_utilization(
            profile, gpu=spec.gpu_utilization, cpu_with_gpu=spec.cpu_utilization_with_gpu,
            cpu_without_gpu=spec.cpu_utilization_without_gpu)
        compute, participation, channel = np.random.SeedSequence(int(seed)).spawn(3)
        self._compute_rng = np.random.default_rng(compute)
        self._participation_rng = np.random.default_rng(participation)
        channel_rng = np.random.default_rng(channel)
        self._walk = _measured_walk(profile)
        #: Shadowing of this device's channel, dB (0 unless ``shadowing_std_db``).
        self.shadowing_db = (float(channel_rng.normal(0.0, spec.shadowing_std_db))
                             if spec.shadowing_std_db > 0 else 0.0)
        if spec.channel == "shannon":
            self.up_bps = self._shannon_bps(spec.tx_power_dbm)
            self.down_bps = self._shannon_bps(spec.server_tx_power_dbm)
        else:
            self.up_bps = spec.up_mbps * _MBPS
            self.down_bps = spec.down_mbps * _MBPS
        #: When it is there: join, leave and offline windows.
        self.presence = Presence(spec.join_s, spec.leave_s, spec.offline)

    # --- clocks and compute --------------------------------------------------------------------

    @property
    def top_levels(self) -> Dict[str, int]:
        """Every domain at its highest level (what an uncapped board runs at)."""
        return {name: len(levels) - 1 for name, levels in self.levels_khz.items()}

    def _levels(self, levels: Mapping[str, int]) -> Dict[str, int]:
        """``levels`` checked, with domains it leaves out at their top (uncapped)."""
        full = self.top_levels
        for name, index in levels.items():
            if name not in full:
                raise ValueError("board %s has no domain %r (have: %s)" % (
                    self.profile.name, name, ", ".join(full) or "none"))
            if isinstance(index, bool) or not isinstance(index, (int, np.integer)) \
                    or not 0 <= index <= full[name]:
                raise ValueError("domain %s: level %r is outside 0..%d" % (name, index, full[name]))
            full[name] = int(index)
        return full

    def expected_seconds_per_sample(self, levels: Mapping[str, int]) -> float:
        """Mean seconds per sample at ``levels`` (domain -> level index; missing = top), times speed.

        With a probe's measured walk: its timing at the walk step ``levels`` matches (rescaled to
        ``seconds_per_sample_s`` at the top when that is set: the walk then gives the shape only).
        Otherwise compute-bound scaling, t ~ f_top/f, of the scaled domain slowed the most.
        """
        full = self._levels(levels)
        spec_s = self.spec.seconds_per_sample_s
        if self._walk is not None:
            lengths, walk = self._walk
            steps = [full[n] for n, count in lengths.items() if full[n] < count - 1]
            step_s = walk[min(steps)] if steps else walk[-1]
            base_s = step_s if spec_s is None else spec_s * step_s / walk[-1]
            return base_s * self.spec.speed
        base_s = DEFAULT_SECONDS_PER_SAMPLE_S[self.kind] if spec_s is None else spec_s
        ratio = max((self.levels_khz[n][-1] / self.levels_khz[n][full[n]]
                     for n in self.scaled_domains), default=1.0)
        return base_s * self.spec.speed * ratio

    def work_samples(self, trained: int, statistics_windows: Mapping[str, int]) -> int:
        """Samples' worth of compute in a round: the ``trained`` ones plus the statistics the agent's
        plug-ins computed after training (``AgentCore.statistics_windows``): windows of one batched
        backward (e.g. AdaCLP's Fisher trace) at a sample each, and windows that each need a
        backward of their own (e.g. FedCurv's diagonal) at ``per_window_backward_samples`` each."""
        extra = (statistics_windows.get("batched", 0)
                 + self.spec.per_window_backward_samples * statistics_windows.get("per_window", 0))
        return int(trained) + int(round(extra))

    def min_seconds_per_sample(self, levels: Mapping[str, int]) -> float:
        """The shift ``a_n`` of FedTeddi eq. 4: no round is faster than this per sample."""
        return self.expected_seconds_per_sample(levels) / (1.0 + self.spec.noise_scale)

    def compute_s(self, n_samples: int, levels: Mapping[str, int]) -> float:
        """Seconds to train ``n_samples`` at ``levels``: shift + exponential noise (FedTeddi eq. 4)."""
        if isinstance(n_samples, bool) or not isinstance(n_samples, (int, np.integer)) \
                or n_samples < 0:
            raise ValueError("n_samples must be a non-negative integer, got %r" % (n_samples,))
        shift_s = int(n_samples) * self.min_seconds_per_sample(levels)
        if n_samples == 0 or self.spec.noise_scale == 0:
            return shift_s
        return shift_s + float(self._compute_rng.exponential(self.spec.noise_scale * shift_s))

    # --- power ---------------------------------------------------------------------------------

    @property
    def idle_w(self) -> float:
        """Board power while not training (the profile's, measured idle where probed)."""
        return float(self.profile.power_model.idle_w)

    def train_w(self, levels: Mapping[str, int]) -> float:
        """Board power while training at ``levels`` (missing = top), what every round is billed:
        idle + each domain's full-load watts at its level times ``utilization`` of it."""
        return float(self.profile.utilized_w(self._levels(levels), self.utilization))

    def full_load_w(self, levels: Mapping[str, int]) -> float:
        """Board power with every domain fully loaded at ``levels`` (ModeledMeter's sum): the
        bound ``train_w`` weights down, kept for comparison."""
        return float(self.profile.modeled_w(self._levels(levels)))

    # --- network -------------------------------------------------------------------------------

    def _shannon_bps(self, tx_power_dbm: float) -> float:
        """FedTeddi III-B2 rate ``B*log2(1 + P*|H|^2/(B*N0))`` with the V-A path loss, bit/s."""
        spec = self.spec
        path_loss_db = (spec.path_loss_1km_db + 10.0 * spec.path_loss_exponent
                        * math.log10(spec.distance_m / 1000.0) + self.shadowing_db)
        noise_dbm = spec.noise_dbm_per_hz + 10.0 * math.log10(spec.bandwidth_hz)
        snr = 10.0 ** ((tx_power_dbm - path_loss_db - noise_dbm) / 10.0)
        return spec.bandwidth_hz * math.log2(1.0 + snr)

    @property
    def snr_hz(self) -> Optional[float]:
        """The uplink's ``P*|H|^2/N0`` in Hz (the rate at bandwidth B is ``B*log2(1 + snr_hz/B)``);
        None on a fixed-rate channel. A scheduler plans FedTeddi eq. 14's bandwidth from it."""
        if self.spec.channel != "shannon":
            return None
        spec = self.spec
        path_loss_db = (spec.path_loss_1km_db + 10.0 * spec.path_loss_exponent
                        * math.log10(spec.distance_m / 1000.0) + self.shadowing_db)
        return 10.0 ** ((spec.tx_power_dbm - path_loss_db - spec.noise_dbm_per_hz) / 10.0)

    def upload_s(self, nbytes: int, bandwidth_hz: Optional[float] = None) -> float:
        """Seconds to send ``nbytes`` to the coordinator (FedTeddi: t_cm = D_s / R); on a Shannon
        channel ``bandwidth_hz`` is a scheduler's grant of the shared band (None: ``bandwidth_hz``
        of the spec). A zero or non-finite grant is no grant."""
        if bandwidth_hz is None or self.spec.channel != "shannon":
            return _bytes(nbytes) * _BITS_PER_BYTE / self.up_bps
        if not (math.isfinite(bandwidth_hz) and bandwidth_hz > 0):
            raise ValueError("bandwidth_hz must be a finite number > 0, got %r" % (bandwidth_hz,))
        rate = bandwidth_hz * math.log2(1.0 + self.snr_hz / bandwidth_hz)
        return _bytes(nbytes) * _BITS_PER_BYTE / rate

    def download_s(self, nbytes: int) -> float:
        """Seconds to receive ``nbytes`` from the coordinator."""
        return _bytes(nbytes) * _BITS_PER_BYTE / self.down_bps

    # --- participation -------------------------------------------------------------------------

    def participates(self) -> bool:
        """One Bernoulli(``participation``) draw: does it take part in this round?"""
        return bool(self._participation_rng.random() < self.spec.participation)


def _bytes(nbytes: int) -> int:
    """``nbytes`` checked: a transfer size is a non-negative integer."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
        raise ValueError("nbytes must be a non-negative integer, got %r" % (nbytes,))
    return int(nbytes)


def _measured_walk(profile: BoardProfile) -> Optional[Tuple[Dict[str, int], Tuple[float, ...]]]:
    """(levels per measured domain, timing per walk step) of a probe profile; None if unprobed.

    The probe steps its domains in lockstep, a shorter ladder held at its top (dvfs_probe.py), so
    step k has domain d at ``min(k, len_d - 1)``; the longest ladder's figures are the walk.
    """
    if profile.measured is None:
        return None
    domains = profile.measured.domains
    longest = max(domains.values(), key=lambda d: len(d.seconds_per_sample))
    return ({name: len(d.seconds_per_sample) for name, d in domains.items()},
            tuple(longest.seconds_per_sample))


def make_devices(specs: Sequence[DeviceSpec], seed: int) -> List[DeviceModel]:
    """One model per spec; device i draws from a seed derived from (seed, i), so adding a device
    leaves the others' draws alone. Profiles load once per board or file."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise DeviceSpecError("seed must be a non-negative integer, got %r" % (seed,))
    profiles: Dict[Tuple[str, str], BoardProfile] = {}
    devices = []
    for i, spec in enumerate(specs):
        key = ("file", spec.profile_path) if spec.profile_path is not None else ("board", spec.board)
        if key not in profiles:
            profiles[key] = (load_profile_file(spec.profile_path) if key[0] == "file"
                             else load_profile(spec.board))
        child = int(np.random.SeedSequence([int(seed), i]).generate_state(1, dtype=np.uint64)[0])
        devices.append(DeviceModel(spec, profiles[key], child))
    return devices
