"""Device scheduling: each round the coordinator picks who trains (FedTeddi, Algorithm 1, or one
of its baselines, ``streamfl.methods.schedule.policies``) and tells the others to sit it out.

The global model carries a ``ScheduleRequest``; devices then report their ``ScheduleStats`` with
every update and, while skipping, in their telemetry (``on_report``). At each choice the plug-in
builds the candidates from the online devices that reported, the per-class weights L (eq. 18: the
largest per-class gradient norm over the chosen set S, i.e. among the updates since the last
choice, each measured at the model its device just trained; else the last estimate, else 1. A
skipping device's telemetry repeats the norms of its last trained round, at an older model: they
do not count, as eq. 18 takes its max over S only),
sigma (the root of the mean reported gradient variance, Alg. 1 line 12, unless ``gradient_noise``
is set),
the round's place in its frame (k since the last device reported a new frame, out of
``frame_rounds``), and the budget:

- with ``total_bandwidth_hz`` (a shared wireless channel, as the simulator models it): each
  device's least bandwidth to meet ``deadline_s`` by eq. 14, from its measured compute time and
  its reported channel (P|H|^2/N0); the chosen devices' sum must fit the total, and the ``train``
  command carries each one's grant (``bandwidth_hz``);
- without: measured round latency (from the ``train`` command to the update's arrival, timed here,
  not reported) against ``deadline_s``: a device that took longer last time is not chosen; one
  never measured is.

The chosen get ``train``, the other online devices ``skip`` (``skip_rounds`` round intervals; the
next choice re-commands them). When no device can meet the deadline (slow clocks, bad links), the
policy picks one device with the whole band rather than stall the fleet. Under FedAvg a choice
is made when the last one's devices have all reported (the round closed) or ``timeout_factor``
deadlines after it, and rounds wait for the chosen devices only (``FedAvgAggregator.expect``).
Under FedAsync the chosen are the cohort invited to train next. With ``refill`` each device that
comes back is replaced at once: the devices still out stay in the set (``busy`` to the policy:
FedTeddi's greedy and eq. 17 start from them) and keep their band, the rest compete for what is
left, one out for ``timeout_factor`` deadlines is given up, and k of lambda_k grows by the share
of the set replaced (a round is a turnover). Without it the next cohort waits for the whole last
one (or the timeout).

What a report says is not trusted beyond its types: counts must match the model's classes, a
device's sample count and class norms count for at most MEDIAN_BOUND times the fleet's median, and
a device's reports change only whether it is chosen and, that bounded, the weights of eq. 18 and
the shares a_n. A device that claims a new frame every round keeps lambda_k near lambda0 for the
fleet (the drift term stays on); that is not guarded.
"""
import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Set, Tuple

import numpy as np

from streamfl.config import SEED_MAX, bounded
from streamfl.coordinator.plugins.base import NOTHING, Addressed, Aggregation, CoordinatorPlugin, Effects, FleetView, \
    MethodState, Verdict
from streamfl.methods.schedule.policies import (
    DEFAULT_BATCH, DEFAULT_SIGMA, POLICIES, allocate_bandwidth, class_weights, make_policy,
)
from streamfl.methods.schedule.policies.base import Budget, Candidates, RoundInfo
from streamfl.protocol.extras import Extra
from streamfl.protocol.messages import Command, Update
from streamfl.methods.schedule.payloads import ScheduleRequest, ScheduleStats

log = logging.getLogger(__name__)

#: Policies whose choice reads gradient figures (eq. 18's L, or the update norm): devices compute
#: them only for these (a few backward passes a round).
GRADIENT_POLICIES = ("fedteddi", "fedcgd", "best-norm")


@dataclass(frozen=True)
class ScheduleConfig:
    """policy: a name in ``streamfl.methods.schedule.policies.POLICIES``; options: its settings
    (e.g. fedteddi's lambda0); deadline_s: T_max, a round's latency budget (None: the FedAvg
    strategy's round deadline, else 1 s, so a synchronous fleet states T_max once); total_bandwidth_hz:
    the shared channel's bandwidth (None: real boards, measured latency against the deadline);
    max_devices: cap on the chosen set; frame_rounds: K of lambda_k = lambda0 (1 - k/K);
    skip_rounds: round intervals the unchosen skip; gradient_noise: eq. 17's gradient-noise scale
    sigma (None: from the devices' reports); batch: eq. 17's b; class_gradients: ask devices for
    gradient figures (None: for the policies in GRADIENT_POLICIES); timeout_factor: deadlines
    after which a choice whose devices did not all report is replaced; headroom: the share of T_max eq. 14's
    plan leaves free (it counts compute and upload only; the model's download and eq. 4's
    exponential compute tail come on top, and a device that misses the deadline is lost to the
    round); retry_rounds: choices after which a device measured over the deadline is tried again
    (its link or its load may have changed; without it one slow round would exclude it for good);
    seed: the policies' random stream; refill: under FedAsync, replace each device as it comes back
    rather than wait for the whole cohort (off: no better on the shipped scenario, docs/results.md)."""

    #: Old key names (the paper's symbols) that files may still use.
    RENAMED: ClassVar[Dict[str, str]] = {"sigma": "gradient_noise"}

    policy: str = "fedteddi"
    options: Dict[str, Any] = field(default_factory=dict)
    deadline_s: Optional[float] = bounded(None, 0.0, 86400.0, lo_open=True)
    total_bandwidth_hz: Optional[float] = bounded(None, 0.0, 1e12, lo_open=True)
    max_devices: Optional[int] = bounded(None, 1, 10 ** 6)
    frame_rounds: int = bounded(30, 1, 10 ** 6)
    skip_rounds: int = bounded(10, 1, 10000)
    #: Eq. 17's gradient-noise scale (FedTeddi's sigma); None: from the devices' reports.
    gradient_noise: Optional[float] = bounded(None, 0.0, 1e12)
    batch: int = bounded(DEFAULT_BATCH, 1, 65536)
    class_gradients: Optional[bool] = None
    timeout_factor: float = bounded(2.0, 0.0, 100.0, lo_open=True)
    headroom: float = bounded(0.2, 0.0, 1.0, hi_open=True)
    retry_rounds: int = bounded(20, 1, 10 ** 6)
    seed: int = bounded(0, 0, SEED_MAX)
    refill: bool = False

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError("policy %r is not one of %s" % (self.policy, ", ".join(POLICIES)))
        make_policy(self.policy, self.seed, self.options)  # ValueError on a bad option
        for key in ("deadline_s", "timeout_factor"):
            value = getattr(self, key)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError("%s must be a finite number > 0, got %r" % (key, value))
        if self.total_bandwidth_hz is not None and not (math.isfinite(self.total_bandwidth_hz)
                                                        and self.total_bandwidth_hz > 0):
            raise ValueError("total_bandwidth_hz must be > 0, got %r" % (self.total_bandwidth_hz,))
        for key in ("frame_rounds", "skip_rounds", "batch", "retry_rounds"):
            if getattr(self, key) < 1:
                raise ValueError("%s must be >= 1, got %r" % (key, getattr(self, key)))
        if self.max_devices is not None and self.max_devices < 1:
            raise ValueError("max_devices must be >= 1, got %r" % (self.max_devices,))
        if not 0.0 <= self.headroom < 1.0:
            raise ValueError("headroom must be in [0, 1), got %r" % (self.headroom,))
        if self.gradient_noise is not None and not (math.isfinite(self.gradient_noise)
                                                    and self.gradient_noise >= 0):
            raise ValueError("gradient_noise must be finite and >= 0, got %r" % (self.gradient_noise,))


#: A report counts for at most this many times the fleet's median (sample counts, class norms):
#: eq. 18's max and the sample shares a_n would otherwise follow one device's claim.
MEDIAN_BOUND = 10.0


def _bounded(values: np.ndarray) -> np.ndarray:
    """``values`` clipped to MEDIAN_BOUND times their median over the positive ones (3 or more)."""
    positive = values[values > 0]
    if positive.size < 3:
        return values
    return np.minimum(values, MEDIAN_BOUND * float(np.median(positive)))


def _bounded_rows(rows: np.ndarray) -> np.ndarray:
    """Each class's column of ``rows`` [S, C] bounded as in ``_bounded``."""
    return np.stack([_bounded(rows[:, c]) for c in range(rows.shape[1])], axis=1) if rows.size else rows


@dataclass
class _Device:
    """What the plug-in knows of one device."""

    stats: ScheduleStats
    #: Seconds of compute of its last round (seconds per sample times samples), measured on board.
    compute_s: Optional[float] = None
    #: Seconds from its last ``train`` command to its update, timed here, and the choice it was
    #: timed at (a measurement ``retry_rounds`` choices old is forgotten).
    latency_s: Optional[float] = None
    latency_round: int = 0
    #: Bits of its last update's model (eq. 14's D_s).
    model_bits: Optional[float] = None
    #: Its class norms came with an update after the last choice: measured at the model it trained
    #: for the current choice, so fresh for eq. 18 (norms a skipping device re-sends in its
    #: telemetry are from an older round and never count).
    fresh_norms: bool = False

    @property
    def new_class(self) -> bool:
        """It holds a class its previous frame lacked."""
        return any(n > 0 and m == 0 for n, m in zip(self.stats.counts, self.stats.prev_counts))


class SchedulePlugin(CoordinatorPlugin):
    """Chooses who trains each round by a scheduling policy; commands ``train`` and ``skip``."""

    name = "schedule"
    Config = ScheduleConfig

    def __init__(self, config: ScheduleConfig, fleet: FleetView, peers: Mapping[str, CoordinatorPlugin]):
        super().__init__(config, fleet, peers)
        self.policy = make_policy(config.policy, config.seed, config.options)
        self._devices: Dict[str, _Device] = {}
        #: The current choice: devices not yet reported, when it was made, the band each holds.
        self._cohort: Set[str] = set()
        self._grants_hz: Dict[str, float] = {}
        self._cohort_s: Optional[float] = None
        self._invited_s: Dict[str, float] = {}
        self._chosen_last: Set[str] = set()
        self.rounds = 0
        #: The newest global version: a chosen device trains from it (or a newer one).
        self.version = 0
        self.frame = 0
        #: k of lambda_k: choices since the frame began (with refill, turnovers of the set).
        self.frame_round = 0.0
        self.L: Optional[np.ndarray] = None
        self._sync = fleet.synchronous
        self._refill = config.refill and not self._sync
        #: T_max: the configured one, else the synchronous rounds' deadline, else 1 s.
        self.deadline_s = float(config.deadline_s if config.deadline_s is not None
                                else fleet.round_deadline_s if fleet.round_deadline_s is not None else 1.0)
        gradients = config.class_gradients
        self._gradients = config.policy in GRADIENT_POLICIES if gradients is None else bool(gradients)

    # ---- inputs -------------------------------------------------------------------------------
    def _num_classes(self, stats: ScheduleStats) -> bool:
        c = self.fleet.num_classes
        return len(stats.counts) == c if c else len(stats.counts) > 0

    def _observe(self, device_id: str, stats: Any, trained: bool = False) -> Optional[_Device]:
        """Keep ``stats`` as the device's newest report; ``trained``: it came with an update."""
        if not isinstance(stats, ScheduleStats):
            return self._devices.get(device_id)
        if not self._num_classes(stats):
            log.warning("schedule: %s reported %d classes, the model has %d; report ignored",
                        device_id, len(stats.counts), self.fleet.num_classes)
            return self._devices.get(device_id)
        known = self._devices.get(device_id)
        if known is not None and stats.frame > known.stats.frame:
            self._new_frame(device_id, stats.frame)
        if known is None:
            known = self._devices[device_id] = _Device(stats)
        known.stats = stats
        if trained and stats.class_grad_norms:
            known.fresh_norms = True
        return known

    def _new_frame(self, device_id: str, frame: int) -> None:
        """A device saw new data: the fleet's frame restarts its drift weight (k = 0)."""
        if self.frame_round > 0:
            self.frame += 1
            log.info("schedule: frame %d begins (%s reported its frame %d)", self.frame, device_id, frame)
        self.frame_round = 0.0

    def on_device_report(self, device_id: str, extras: Mapping[str, Extra], now: float) -> Effects:
        self._observe(device_id, extras.get(ScheduleStats.KIND))
        return NOTHING

    def on_update_admitted(self, update: Update, now: float) -> Verdict:
        # Judged now: a choice made when this update closes a round is for the next round.
        verdict = Verdict(fields={"scheduled": update.device_id in self._chosen_last})
        known = self._observe(update.device_id, update.extras.get(ScheduleStats.KIND), trained=True)
        if known is None:
            return verdict
        known.compute_s = max(0.0, update.seconds_per_sample * update.num_samples)
        known.model_bits = float(sum(a.size * 32 for a in update.tensors.values()))
        invited = self._invited_s.pop(update.device_id, None)
        if invited is not None:
            known.latency_s, known.latency_round = now - invited, self.rounds
        self._cohort.discard(update.device_id)
        self._grants_hz.pop(update.device_id, None)
        return verdict

    def on_model_made(self, aggregation: Aggregation) -> Effects:
        self.version = aggregation.version
        if self._sync or not self._cohort:
            return self._choose(aggregation.time_s)
        if self._refill and len(self._cohort) < len(self._chosen_last):
            return self._choose(aggregation.time_s, keep=set(self._cohort))
        return NOTHING

    def on_tick(self, now: float) -> Effects:
        patience_s = self.deadline_s * self.config.timeout_factor
        if self._refill and self._chosen_last:
            lost = {d for d in self._cohort if now - self._invited_s.get(d, now) > patience_s}
            for device_id in lost:  # given up: it takes at least this long; the rest stay
                self._slow(device_id, now - self._invited_s[device_id])
            if lost or len(self._cohort) < len(self._chosen_last):  # room a return left unfilled
                return self._choose(now, keep=self._cohort - lost)
            return NOTHING
        # A choice whose devices are not all back (or that chose nobody) times out.
        late = (self._cohort_s is not None and (self._cohort or not self._chosen_last)
                and now - self._cohort_s > patience_s)
        if late or (self._cohort_s is None and self._devices):
            return self._choose(now)
        return NOTHING

    # ---- the choice ---------------------------------------------------------------------------
    def _candidates(self, ids: List[str], keep: Set[str]) -> Candidates:
        n, rows = len(ids), [self._devices[d] for d in ids]
        p_now = np.array([r.stats.counts for r in rows], dtype=np.float64)
        p_prev = np.array([r.stats.prev_counts for r in rows], dtype=np.float64)
        num_classes = p_now.shape[1]
        fresh = [r.stats.class_grad_norms for r in rows if r.fresh_norms and r.stats.class_grad_norms]
        self.L = class_weights(num_classes, _bounded_rows(np.array(fresh)) if fresh else None,
                               previous=self.L)
        for r in rows:
            r.fresh_norms = False

        def column(values: List[Optional[float]]) -> np.ndarray:
            return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)

        snr = column([r.stats.snr_hz for r in rows])
        latency = column([r.latency_s if self.rounds - r.latency_round < self.config.retry_rounds
                          else None for r in rows])
        cost = np.zeros(n)
        if self.config.total_bandwidth_hz is not None:
            compute = column([r.compute_s for r in rows])
            known = compute[np.isfinite(compute)]
            compute = np.where(np.isfinite(compute), compute, np.median(known) if known.size else 0.0)
            bits = [r.model_bits for r in rows if r.model_bits]
            gain = np.where(np.isfinite(snr), snr, 0.0)  # an unknown channel cannot be planned
            cost = allocate_bandwidth(max(bits) if bits else 0.0, compute, gain, 1.0, 1.0,
                                      self.deadline_s * (1.0 - self.config.headroom)).bandwidth_hz
        else:
            cost[np.isfinite(latency) & (latency > self.deadline_s)] = np.inf
        busy = np.array([d in keep for d in ids], dtype=bool)
        cost[busy] = 0.0  # their band is held already (taken off the budget)
        return Candidates(device_ids=tuple(ids), p_now=p_now, p_prev=p_prev,
                          samples=_bounded(p_now.sum(axis=1)), L=self.L, cost=cost,
                          grad_norm=column([r.stats.grad_norm for r in rows]),
                          loss=column([r.stats.loss for r in rows]), snr_hz=snr, latency_s=latency,
                          busy=busy)

    def _sigma_and_source(self) -> Tuple[float, str]:
        """Eq. 17's sigma and where it came from: "set" (``gradient_noise``), "reports" (the
        devices' gradient variances) or "default" (no report yet)."""
        if self.config.gradient_noise is not None:
            return float(self.config.gradient_noise), "set"
        var = [r.stats.grad_var for r in self._devices.values() if r.stats.grad_var is not None]
        return (float(math.sqrt(np.mean(var))), "reports") if var else (DEFAULT_SIGMA, "default")

    def _slow(self, device_id: str, waited_s: float) -> None:
        """``device_id`` was not back ``waited_s`` after its invitation: it takes at least this long."""
        known = self._devices.get(device_id)
        if known is not None:
            known.latency_s = max(known.latency_s or 0.0, waited_s)
            known.latency_round = self.rounds

    def _choose(self, now: float, keep: Set[str] = frozenset()) -> Effects:
        """A new choice, as the commands to send (and the devices a synchronous round waits
        for); ``keep``: devices still out that stay in the set (FedAsync refill)."""
        waited_s = None if self._cohort_s is None else now - self._cohort_s
        if not keep and waited_s is not None and waited_s > self.deadline_s:
            for device_id in self._cohort:  # not back by the deadline
                self._slow(device_id, waited_s)
        online = sorted(self.fleet.online())
        keep = {d for d in keep if d in self._devices and d in online}
        ids = [d for d in online if d in self._devices]
        cap = self.config.max_devices
        if not ids or (cap is not None and len(keep) >= cap):
            return NOTHING  # nobody to choose from, or the set is full (the next return makes room)
        cand = self._candidates(ids, keep)
        total = self.config.total_bandwidth_hz
        held_hz = sum(self._grants_hz.get(d, 0.0) for d in keep)
        budget = Budget(total=math.inf if total is None else max(0.0, float(total) - held_hz),
                        max_devices=None if cap is None else cap - len(keep))
        sigma, sigma_from = self._sigma_and_source()
        info = RoundInfo(k=self.frame_round, K=self.config.frame_rounds, sigma=sigma,
                         batch=self.config.batch)
        picks = self.policy.select(cand, budget, info)
        grants = {ids[i]: float(cand.cost[i]) for i in range(len(ids))}
        if len(picks) == 0 and not keep and cand.holds_data().any():
            # Nobody meets T_max (slow clocks, a bad link): one device, the policy's pick with the
            # band to itself, rather than a fleet that stops learning.
            free = replace(cand, cost=np.zeros(len(ids)))
            picks = self.policy.select(free, Budget(max_devices=1), info)
            for i in picks:
                grants[ids[int(i)]] = float(total) if total is not None else 0.0
            log.warning("schedule: no device meets the %.3g s deadline; %s trains alone",
                        self.deadline_s, ", ".join(ids[int(i)] for i in picks) or "nobody")
        chosen = [ids[int(i)] for i in picks]
        chosen_set = set(chosen)
        commands: List[Addressed] = []
        for device_id in online:
            if device_id in keep:
                continue  # still training: its invitation stands
            if device_id in chosen_set:
                params: Dict[str, Any] = {"rounds": 1, "then_skip": self.config.skip_rounds,
                                          "version": self.version}
                if total is not None:
                    params["bandwidth_hz"] = grants[device_id]
                commands.append(Addressed(device_id, Command("train", params)))
                self._invited_s[device_id] = now
                self._grants_hz[device_id] = grants[device_id]
            else:
                commands.append(Addressed(device_id, Command("skip", {"rounds": self.config.skip_rounds})))
                self._invited_s.pop(device_id, None)
                self._grants_hz.pop(device_id, None)
        # Synchronous rounds wait for the chosen; nobody fits: rounds wait as usual (an empty
        # set), and the timeout chooses again.
        expected = frozenset(chosen_set) if self._sync else None
        in_set = keep | chosen_set
        self._cohort, self._cohort_s, self._chosen_last = set(in_set), now, in_set
        event = {
            "event": "schedule", "policy": self.config.policy, "round": self.rounds,
            "version": self.version,
            "frame": self.frame, "frame_round": round(self.frame_round, 3), "candidates": len(ids),
            "chosen": chosen, "in_flight": len(keep), "sigma": round(info.sigma, 6),
            "sigma_from": sigma_from,
            # eq. 18's L as the devices' class-gradient norms give it (None where not asked for)
            "L_mean": round(float(np.mean(cand.L)), 6) if cand.L.size and self._gradients else None,
            "with_new_class": sum(self._devices[d].new_class for d in chosen)}
        self.rounds += 1
        self.frame_round += len(chosen_set) / len(in_set) if keep and in_set else 1.0
        return Effects(commands=tuple(commands), events=(event,), expected_devices=expected)

    # ---- outputs ------------------------------------------------------------------------------
    def before_publish(self) -> List[Extra]:
        return [ScheduleRequest(class_gradients=self._gradients)]

    def describe(self, now: float) -> MethodState:
        """The policy, choices made, the fleet's frame and k of lambda_k (choices since it began),
        T_max, devices in the current choice and those still out; per reporting device whether it
        is scheduled (in the last choice) or skipping, whether it is still out (training, not yet
        reported), its own frame (its data's frame counter), its last measured latency and the
        band it holds."""
        devices: Dict[str, Dict[str, Any]] = {}
        for device_id, known in self._devices.items():
            latency = known.latency_s
            grant = self._grants_hz.get(device_id)
            devices[device_id] = {
                "scheduled": device_id in self._chosen_last, "out": device_id in self._cohort,
                "frame": int(known.stats.frame),
                "latency_s": None if latency is None else round(float(latency), 3),
                "bandwidth_hz": None if grant is None or self.config.total_bandwidth_hz is None
                else float(grant)}
        return MethodState(
            fleet={"policy": self.config.policy, "rounds": self.rounds, "frame": self.frame,
                   "frame_round": round(float(self.frame_round), 3), "deadline_s": self.deadline_s,
                   "scheduled": len(self._chosen_last), "out": len(self._cohort)},
            devices=devices)

    def state(self) -> Dict[str, Any]:
        return {"rounds": self.rounds, "frame": self.frame, "frame_round": float(self.frame_round),
                "L": None if self.L is None else [float(v) for v in self.L]}

    def load_state(self, state: Mapping[str, Any]) -> None:
        try:
            rounds, frame = (int(state.get(k, 0)) for k in ("rounds", "frame"))
            frame_round = float(state.get("frame_round", 0))
            L = state.get("L")
            L = None if L is None else np.array([float(v) for v in L], dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise ValueError("schedule state is malformed: %s" % exc) from None
        counts_ok = math.isfinite(frame_round) and min(rounds, frame, frame_round) >= 0
        if not counts_ok or (L is not None and not (np.isfinite(L).all() and (L >= 0).all())):
            raise ValueError("schedule state holds negative counts or weights")
        self.rounds, self.frame, self.frame_round, self.L = rounds, frame, frame_round, L
