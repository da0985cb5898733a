"""The ``clp-aware`` policy: AdaCLP's CLP-aware DVFS (AdaCLP s4.2).

During the critical learning period the scaled domains run at their lowest level ``f_0``, which
lengthens the CLP in wall-clock time and saves energy (s4.1). After it, the level rises by one per
round while the step buys enough time per training sample, ``dt = t_avg(f_{n-1}) - t_avg(f_n)``
above a threshold, and holds once it does not (s4.2.1). Boards with a GPU scale the GPU, CPU-only
boards the CPU (s4.2.2).
"""
import collections
import logging
import math
from typing import Deque, Dict, Mapping, Optional, Sequence, Tuple

from streamfl.dvfs.base import CPU, GPU
from streamfl.dvfs.policies.base import DomainView, DvfsPolicy, PolicyInput, check_seconds_per_sample
from streamfl.errors import ConfigError

log = logging.getLogger(__name__)

RELATIVE, ABSOLUTE = "relative", "absolute"
#: How ``dt`` is measured: a fraction of ``t_avg(f_{n-1})``, or seconds per sample.
SAVINGS = (RELATIVE, ABSOLUTE)
LOWEST, EFFICIENT = "lowest", "efficient"
#: Where the scaled domains run during the CLP: s4.2.1's ``f_0``, or the efficient level.
CLP_LEVELS = (LOWEST, EFFICIENT)

Timings = Mapping[Tuple[str, int], float]


def scaled_domains(domains: Sequence[DomainView]) -> Tuple[DomainView, ...]:
    """The domains AdaCLP scales: every GPU domain if the board has one (s4.2.2), else every CPU
    domain (s4.2.1; on a multi-cluster board "the CPU" is all of its cpufreq policies)."""
    gpus = tuple(d for d in domains if d.kind == GPU)
    return gpus or tuple(d for d in domains if d.kind == CPU)


class ClpAwarePolicy(DvfsPolicy):
    """AdaCLP s4.2 as a stateful plan: lowest level in the CLP, then one level up per round while
    the time saved per sample exceeds ``threshold``, else hold.

    The paper leaves these open; each is a constructor parameter:

    - ``threshold`` and ``saving``: s4.2.1 says only "a predefined threshold". Default a relative
      saving of 5% (``saving="relative"``, ``threshold=0.05``). Relative, because one number must
      serve a Raspberry Pi 4 and an AGX Orin whose seconds per sample differ by more than tenfold,
      and any model; an absolute one (``saving="absolute"``, seconds per sample) needs tuning per
      board and model. 5%, because a step saves at most ``1 - f_{n-1}/f_n`` when training is
      compute-bound (t ~ 1/f), and the median such saving per step of the shipped ladders
      (configs/boards) is 6.5-20% (AGX Orin CPU 6.5%, Pi 4 9%, Orin GPU 12.5%, Nano GPU 14%): 5%
      keeps climbing while a step buys most of its frequency ratio and stops once training turns
      memory- or I/O-bound and a step buys much less, the "below maximum power" optimum s4.1
      cites from Zeus [44]. It also sits above the few-percent jitter of per-round timings [U],
      so noise alone rarely triggers a step. Caveat: where the ladder itself steps finely (the
      Pi 5's 100 MHz steps save 4-6%, Orin CPU steps near the top under 4%), the climb stops
      early even when compute-bound; lower ``threshold`` there.
    - ``probe_unmeasured``: the next level's time is unknown until it has run. When it has a
      measurement (an earlier climb, a ``dvfs probe`` profile) the step is judged on it, the
      literal s4.2.1 rule. When it has none, default True steps up once to measure it, provided the
      last step up saved more than the threshold (or there was no last step to judge, as on the
      first round after the CLP); this is the paper's "one level per round while it pays". False
      climbs only on measured data. Either way, a level without a measurement of its own holds
      until one arrives (one round), so the policy never climbs blind past a missing timing. A step
      that turns out not to pay is kept, not undone: s4.2.1 says "maintain the current frequency".
    - ``drop_on_clp``: whether a CLP that starts again (AdaCLP's dropout, eq. 6, pushes the model
      back into it) sends the levels back to the lowest. Default True: s4.2.1 runs "within CLP" at
      ``f_0``, whichever CLP it is, and the re-entered CLP needs the wall-clock stretch as much.
      False holds the level reached once the climb has started.
    - ``start_at_current``: where the climb starts when the first round is already past the CLP
      (the coordinator leaves the CLP flag false until the CLP probe exists). Default False starts
      at the CLP's level (``clp_level``), as after a CLP, so the climb finds the knee from below;
      True starts from the level the domain runs at now.
    - ``clp_level`` and ``power_w``: the level the CLP runs at. Default ``"lowest"``, s4.2.1's
      ``f_0``. ``"efficient"``: the lowest level whose energy per sample is not worse than the next
      level's, i.e. the first minimum from below of board power x time per sample, with the power
      from ``power_w`` (domain -> board watts while training with that domain at each level, e.g.
      ``streamfl.dvfs.utilization.power_table``) and the time ratio of two levels from their timings
      where both have one, else compute-bound, ``t ~ 1/f`` (the threshold's assumption). Why: s4.1
      says ``f_0`` saves energy, but once the board's idle power and the CPU core feeding the GPU
      are counted a round at ``f_0`` can cost several times the joules of a higher level (the
      Jetson Nano's lowest GPU level runs 12x longer; bench/bench_dvfs_oracle.py), while the
      efficient level still runs the CLP below the top, longer in wall-clock time, wherever that
      costs no extra energy per sample.
    - ``climb_energy_ratio``: after the CLP the climb buys time, and while training is
      compute-bound every step pays, so it runs to the top; the top can cost well above the
      energy per sample of the efficient level (AGX Orin's GPU about 20% more in the profile's
      model). A number (at least 1; needs ``power_w``) stops the climb below any level above
      the efficient level (as ``clp_level`` finds it) whose energy per sample exceeds that
      level's by more than the factor (1.1 = 10%): the energy side of the "below maximum power"
      knee s4.1 cites from Zeus [44]. The climb never steps down for it. Energy per sample as
      for ``clp_level``, time ratios measured where both levels have timings, else ``t ~ 1/f``.
      Default None: the paper's climb, limited by time only.
    - ``window``: how many of its own observations per level are averaged into ``t_avg`` ("over
      the recent training iterations", s4.2.1). Default 4. These take precedence over the input's
      ``seconds_per_sample``, which fills the levels the policy has not observed.

    Call ``plan`` once per round: every call may move a level.
    """

    name = "clp-aware"

    def __init__(self, threshold: float = 0.05, saving: str = RELATIVE,
                 probe_unmeasured: bool = True, drop_on_clp: bool = True,
                 start_at_current: bool = False, window: int = 4, clp_level: str = LOWEST,
                 power_w: Optional[Mapping[str, Sequence[float]]] = None,
                 climb_energy_ratio: Optional[float] = None):
        if saving not in SAVINGS:
            raise ConfigError("clp-aware policy: saving must be one of %s, got %r" % (
                ", ".join(SAVINGS), saving))
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
            raise ConfigError("clp-aware policy: threshold must be a number, got %r" % (threshold,))
        if not threshold >= 0:
            raise ConfigError("clp-aware policy: threshold must be >= 0, got %r" % (threshold,))
        if saving == RELATIVE and threshold >= 1:
            raise ConfigError("clp-aware policy: a relative threshold is a fraction below 1 "
                              "(0.05 = 5%%), got %r" % (threshold,))
        for option, value in (("probe_unmeasured", probe_unmeasured), ("drop_on_clp", drop_on_clp),
                              ("start_at_current", start_at_current)):
            if not isinstance(value, bool):
                raise ConfigError("clp-aware policy: %s must be true or false, got %r" % (option, value))
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ConfigError("clp-aware policy: window must be an integer >= 1, got %r" % (window,))
        if clp_level not in CLP_LEVELS:
            raise ConfigError("clp-aware policy: clp_level must be one of %s, got %r" % (
                ", ".join(CLP_LEVELS), clp_level))
        self.power_w = _check_power_w(power_w)
        if clp_level == EFFICIENT and not self.power_w:
            raise ConfigError("clp-aware policy: clp_level efficient needs power_w (board watts "
                              "while training at each level of the scaled domains)")
        if climb_energy_ratio is not None:
            if isinstance(climb_energy_ratio, bool) \
                    or not isinstance(climb_energy_ratio, (int, float)) \
                    or not (math.isfinite(climb_energy_ratio) and climb_energy_ratio >= 1):
                raise ConfigError("clp-aware policy: climb_energy_ratio must be a number >= 1 "
                                  "(1.1 = 10%% above the efficient level), got %r"
                                  % (climb_energy_ratio,))
            if not self.power_w:
                raise ConfigError("clp-aware policy: climb_energy_ratio needs power_w (board "
                                  "watts while training at each level of the scaled domains)")
        self.clp_level = clp_level
        self.climb_energy_ratio = (None if climb_energy_ratio is None
                                   else float(climb_energy_ratio))
        self.threshold = float(threshold)
        self.saving = saving
        self.probe_unmeasured = probe_unmeasured
        self.drop_on_clp = drop_on_clp
        self.start_at_current = start_at_current
        self.window = window
        #: The level each scaled domain was last planned at.
        self._target = {}  # type: Dict[str, int]
        #: Whether a domain has started climbing (left the CLP at least once).
        self._climbing: Dict[str, bool] = {}
        self._observed: Dict[Tuple[str, int], Deque[float]] = {}

    @property
    def targets(self) -> Dict[str, int]:
        """The level each scaled domain was last planned at (for status and telemetry)."""
        return dict(self._target)

    def observe(self, domain: str, level: int, seconds_per_sample: float) -> None:
        value = check_seconds_per_sample(domain, level, seconds_per_sample)
        key = (domain, int(level))
        if key not in self._observed:
            self._observed[key] = collections.deque(maxlen=self.window)
        self._observed[key].append(value)

    def t_avg(self, domain: str, level: int, inp: Optional[PolicyInput] = None) -> Optional[float]:
        """Seconds per sample at ``level``: the mean of this policy's recent observations, else the
        input's figure, else None."""
        seen = self._observed.get((domain, level))
        if seen:
            return sum(seen) / len(seen)
        if inp is not None:
            return inp.seconds_per_sample.get((domain, level))
        return None

    def saved(self, slower_s: float, faster_s: float) -> float:
        """``dt`` of s4.2.1 in this policy's measure: seconds, or a fraction of ``slower_s``."""
        dt = slower_s - faster_s
        return dt / slower_s if self.saving == RELATIVE else dt

    def plan(self, inp: PolicyInput) -> Dict[str, int]:
        out = {}
        for dom in scaled_domains(inp.domains):
            before = self._target.get(dom.name)
            if before is None:
                before = dom.current_level if self.start_at_current else self.clp_target(dom, inp)
            level = min(before, dom.top_level)
            if inp.critical_period:
                if self.drop_on_clp or not self._climbing.get(dom.name, False):
                    level = self.clp_target(dom, inp)
            else:
                self._climbing[dom.name] = True
                level = self._climb(dom, level, inp)
            if level != before:
                log.info("clp-aware: %s level %d -> %d (%d kHz, critical period %s)", dom.name, before,
                         level, dom.levels_khz[level], inp.critical_period)
            self._target[dom.name] = level
            out[dom.name] = level
        return out

    def clp_target(self, dom: DomainView, inp: Optional[PolicyInput] = None) -> int:
        """The level ``dom`` runs at during the CLP (``clp_level``)."""
        return 0 if self.clp_level == LOWEST else self.efficient_level(dom, inp)

    def efficient_level(self, dom: DomainView, inp: Optional[PolicyInput] = None) -> int:
        """The lowest level whose energy per sample is not above the next level's (``power_w``)."""
        watts = self._watts(dom)
        for level in range(dom.top_level):
            if watts[level] * self._time_ratio(dom, level, level + 1, inp) <= watts[level + 1]:
                return level
        return dom.top_level

    def energy_ratio(self, dom: DomainView, level: int, ref: int,
                     inp: Optional[PolicyInput] = None) -> float:
        """Energy per sample at ``level`` over that at ``ref`` (``power_w`` x time per sample)."""
        watts = self._watts(dom)
        return watts[level] / watts[ref] * self._time_ratio(dom, level, ref, inp)

    def _time_ratio(self, dom: DomainView, a: int, b: int, inp: Optional[PolicyInput]) -> float:
        """Time per sample at level ``a`` over level ``b``: measured where both have a timing,
        else compute-bound, ``f_b / f_a``."""
        t_a, t_b = self.t_avg(dom.name, a, inp), self.t_avg(dom.name, b, inp)
        if t_a is not None and t_b is not None:
            return t_a / t_b
        return dom.levels_khz[b] / dom.levels_khz[a]

    def _watts(self, dom: DomainView) -> Tuple[float, ...]:
        """``power_w`` of ``dom``; ConfigError if it lacks the domain or has other levels."""
        watts = self.power_w.get(dom.name)
        if watts is None:
            raise ConfigError("clp-aware policy: power_w has no watts for domain %r (has: %s)" % (
                dom.name, ", ".join(sorted(self.power_w))))
        if len(watts) != len(dom.levels_khz):
            raise ConfigError("clp-aware policy: power_w[%s] has %d figures for %d levels" % (
                dom.name, len(watts), len(dom.levels_khz)))
        return watts

    def _step_up(self, dom: DomainView, level: int, inp: PolicyInput) -> int:
        """``level + 1``, unless ``climb_energy_ratio`` rules that level out: then ``level``. Up
        to the efficient level every step is allowed (they are what brings energy per sample down
        to it)."""
        if self.climb_energy_ratio is None:
            return level + 1
        ref = self.efficient_level(dom, inp)
        if level + 1 <= ref:
            return level + 1
        ratio = self.energy_ratio(dom, level + 1, ref, inp)
        if ratio > self.climb_energy_ratio:
            log.debug("clp-aware: %s holds at %d: level %d costs %.3gx the efficient level %d's "
                      "energy per sample (cap %.3g)", dom.name, level, level + 1, ratio, ref,
                      self.climb_energy_ratio)
            return level
        return level + 1

    def _climb(self, dom: DomainView, level: int, inp: PolicyInput) -> int:
        """The level for the next post-CLP round, starting from ``level`` (s4.2.1)."""
        if level >= dom.top_level:
            return level
        here = self.t_avg(dom.name, level, inp)
        if here is None:
            log.debug("clp-aware: %s holds at %d until it has a timing there", dom.name, level)
            return level
        above = self.t_avg(dom.name, level + 1, inp)
        if above is not None:
            gain = self.saved(here, above)
            log.debug("clp-aware: %s step %d->%d saves %.4g (threshold %.4g)", dom.name, level,
                      level + 1, gain, self.threshold)
            return self._step_up(dom, level, inp) if gain > self.threshold else level
        if not self.probe_unmeasured:
            return level
        below = self.t_avg(dom.name, level - 1, inp) if level > 0 else None
        if below is None:
            # No last step to judge (first round after the CLP, or its timing is missing).
            return self._step_up(dom, level, inp)
        gain = self.saved(below, here)
        log.debug("clp-aware: %s last step %d->%d saved %.4g (threshold %.4g)", dom.name, level - 1,
                  level, gain, self.threshold)
        return self._step_up(dom, level, inp) if gain > self.threshold else level


def _check_power_w(power_w: Optional[Mapping[str, Sequence[float]]]
                   ) -> Dict[str, Tuple[float, ...]]:
    """``power_w`` as domain name -> tuple of watts; ConfigError naming the bad entry (YAML can hand
    over strings, booleans and negative numbers)."""
    if power_w is None:
        return {}
    if not isinstance(power_w, Mapping):
        raise ConfigError("clp-aware policy: power_w must map domain names to lists of watts, "
                          "got %r" % (power_w,))
    out = {}
    for name, watts in power_w.items():
        if not isinstance(name, str) or not name:
            raise ConfigError("clp-aware policy: power_w has a bad domain name %r" % (name,))
        if isinstance(watts, (str, bytes)) or not isinstance(watts, Sequence) or not watts:
            raise ConfigError("clp-aware policy: power_w[%s] must be a list of watts, got %r"
                              % (name, watts))
        for w in watts:
            if isinstance(w, bool) or not isinstance(w, (int, float)) \
                    or not (math.isfinite(w) and w > 0):
                raise ConfigError("clp-aware policy: power_w[%s] must hold finite watts > 0, got %r"
                                  % (name, w))
        out[name] = tuple(float(w) for w in watts)
    return out
