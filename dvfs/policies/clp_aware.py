"""The ``clp-aware`` policy: AdaCLP's CLP-aware DVFS (adaclp.txt s4.2; DESIGN.md s8).

During the critical learning period the scaled domains run at their lowest level ``f_0``, which
lengthens the CLP in wall-clock time and saves energy (s4.1). After it, the level rises by one per
round while the step buys enough time per training sample, ``dt = t_avg(f_{n-1}) - t_avg(f_n)``
above a threshold, and holds once it does not (s4.2.1). Boards with a GPU scale the GPU, CPU-only
boards the CPU (s4.2.2).
"""
import collections
import logging
from typing import Deque, Dict, Mapping, Optional, Sequence, Tuple

from streamfl.dvfs.base import CPU, GPU
from streamfl.dvfs.policies.base import DomainView, DvfsPolicy, PolicyInput, check_seconds_per_sample
from streamfl.errors import ConfigError

log = logging.getLogger(__name__)

RELATIVE, ABSOLUTE = "relative", "absolute"
#: How ``dt`` is measured: a fraction of ``t_avg(f_{n-1})``, or seconds per sample.
SAVINGS = (RELATIVE, ABSOLUTE)

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
      at the lowest level, as after a CLP, so the climb finds the knee from below; True starts from
      the level the domain runs at now.
    - ``window``: how many of its own observations per level are averaged into ``t_avg`` ("over
      the recent training iterations", s4.2.1). Default 4. These take precedence over the input's
      ``seconds_per_sample``, which fills the levels the policy has not observed.

    Call ``plan`` once per round: every call may move a level.
    """

    name = "clp-aware"

    def __init__(self, threshold: float = 0.05, saving: str = RELATIVE,
                 probe_unmeasured: bool = True, drop_on_clp: bool = True,
                 start_at_current: bool = False, window: int = 4):
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
                before = dom.current_level if self.start_at_current else 0
            level = min(before, dom.top_level)
            if inp.in_clp:
                if self.drop_on_clp or not self._climbing.get(dom.name, False):
                    level = 0
            else:
                self._climbing[dom.name] = True
                level = self._climb(dom, level, inp)
            if level != before:
                log.info("clp-aware: %s level %d -> %d (%d kHz, in_clp=%s)", dom.name, before, level,
                         dom.levels_khz[level], inp.in_clp)
            self._target[dom.name] = level
            out[dom.name] = level
        return out

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
            return level + 1 if gain > self.threshold else level
        if not self.probe_unmeasured:
            return level
        below = self.t_avg(dom.name, level - 1, inp) if level > 0 else None
        if below is None:
            # No last step to judge (first round after the CLP, or its timing is missing).
            return level + 1
        gain = self.saved(below, here)
        log.debug("clp-aware: %s last step %d->%d saved %.4g (threshold %.4g)", dom.name, level - 1,
                  level, gain, self.threshold)
        return level + 1 if gain > self.threshold else level
