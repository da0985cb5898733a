"""The agent's decisions without I/O: windows and messages in, ``Update`` out.

The daemon (threads, MQTT, disk) and the simulator (virtual clock) drive the same ``AgentCore``.
A round has three calls so that a runtime holds its lock only while the core's state is read and
does nothing but I/O: ``begin_round`` fixes the starting weights and hyper-parameters (and
``frequency_plan`` the clocks); ``finish_round`` trains, taking the runtime's lock only around each
minibatch draw, so the sensor thread keeps filling the buffer, and adds the plug-ins' statistics;
``complete_round`` takes what the runtime measured (clocks, time, energy) and returns the update
to send. The methods' plug-ins (``streamfl.agent.plugins``) are called, never named: each only
while the newest accepted global model carries one of its ``activated_by`` kinds, and replaced by
a fresh instance when it goes dormant. The core applies what they decide: the hyper-parameters,
the buffer's policy and emptying, the critical period, a veto on a round.
"""
import logging
import time
import uuid
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import (Any, Callable, ContextManager, Dict, Iterable, Iterator, List, Mapping, Optional,
                    Sequence, Tuple)

import numpy as np
import torch

import streamfl
from streamfl.agent.buffer import Buffer
from streamfl.agent.buffer_policies import ReplacementPolicy, make_buffer_policy
from streamfl.agent.config import AgentConfig
from streamfl.agent.divergence import DivergenceCause, DivergenceWatch, describe_pulls
from streamfl.agent.hparams import clamp_hparams, hparam_limits
from streamfl.agent.model_gate import RESYNC, STALE, UNNAMED, ModelGate
from streamfl.agent.orders import Orders
from streamfl.agent.plugin_set import DevicePlugins
from streamfl.agent.plugins import AgentPlugin, ReportContext, RoundContext
from streamfl.agent.quadratic import largest_curvature
from streamfl.agent.trainer import LocalTrainer, TrainingJob, TrainResult, run_job
from streamfl.dvfs.policies.base import DomainView, PolicyInput
from streamfl.dvfs.policies.factory import make_policy
from streamfl.errors import StreamflError
from streamfl.models import ModelSpec, arrays_to_model, build_model, model_to_arrays
from streamfl.protocol.messages import COMMAND_KINDS, Command, GlobalModel, Hello, Update
from streamfl.sensors.window import Window

log = logging.getLogger(__name__)

class NotReadyError(StreamflError):
    """``train_round`` was called before the core was ready (no global model or an empty buffer)."""


class RoundInterrupted(StreamflError):
    """The runtime asked to stop in the middle of a round; no update is made from the partial round."""


class DivergedError(StreamflError):
    """Local training produced a non-finite loss or weights; the next round restarts from the
    global model, once one other than this round's has arrived (``agent/divergence.py``)."""

    def __init__(self, message: str, cause: Optional[DivergenceCause] = None):
        super().__init__(message)
        #: What the round trained with (None where no core made it).
        self.cause = cause


@dataclass
class RoundPlan:
    """What ``begin_round`` fixed for one round: start weights (None = keep local) and hparams."""

    round_index: int
    base_version: int
    start_tensors: Optional[Dict[str, np.ndarray]]
    lr: float
    dropout: float
    local_steps: int
    batch_size: int
    #: ``ModelGate.resyncs`` when the round began: a run change during the round drops it.
    run_generation: int = 0
    #: True when a plug-in's weights, not the global model, are the start (``round_start_weights``):
    #: the next round starts from the newest global model again.
    side_start: bool = False


@dataclass
class PlannedRound:
    """A round ``plan_training`` prepared: its SGD as a job to run anywhere, and what
    ``finish_training`` needs afterwards (the plan, the named penalties, the model held)."""

    plan: RoundPlan
    job: TrainingJob
    penalties: List[Tuple[str, Optional[Any]]]
    held: Optional[GlobalModel]
    started_s: float


@dataclass(frozen=True)
class RoundMeasurement:
    """What the runtime measured of a round: the clock level per domain it ran at, seconds per
    sample at those clocks, the energy it cost, and (virtual runtimes) when it finished."""

    clock_levels: Dict[str, int]
    seconds_per_sample: float
    energy_j: Optional[float] = None
    finished_s: Optional[float] = None


class AgentCore:
    """One device's learner: buffer, model, trainer, and the newest global model it has received.

    ``clock`` stamps ``Update.created_s`` (the daemon passes wall time, the simulator virtual time);
    ``timer`` measures seconds per sample; ``seed`` (default ``config.seed``) seeds the model's
    initialization, the minibatch draws and dropout; ``spec`` overrides ``config.model``.
    """

    def __init__(self, config: AgentConfig, clock: Callable[[], float] = time.monotonic,
                 seed: Optional[int] = None, timer: Callable[[], float] = time.perf_counter,
                 policy: Optional[ReplacementPolicy] = None, spec: Optional[ModelSpec] = None):
        self.config = config
        self.spec = spec if spec is not None else config.model
        self.device_id = config.device_id
        self.arch_id = self.spec.arch_id
        self._clock = clock
        self._timer = timer
        self.seed = int(config.seed if seed is None else seed)
        if config.torch_threads > 0:
            torch.set_num_threads(config.torch_threads)
        self.model = build_model(self.spec, dropout=config.dropout, seed=self.seed)
        #: The configured replacement policy (a method's plug-in may lend the buffer another).
        self.policy = policy if policy is not None else make_buffer_policy(config.buffer_policy, self.seed)
        self.buffer = Buffer(config.buffer_capacity, self.spec.window_len, self.spec.in_channels,
                             self.spec.num_classes, self.policy)
        self.trainer = LocalTrainer(self.model, self.spec.num_classes, momentum=config.momentum)
        #: The methods' device sides, each dormant until a global model asks for it.
        self.methods = DevicePlugins(config.plugins, self.seed, self.spec.num_classes, dvfs=config.dvfs)
        self._rng = np.random.default_rng(self.seed)
        #: What this board accepts from the coordinator (``hparam_limits`` in its YAML).
        self.hparam_limits = hparam_limits(config.hparam_limits)
        #: Which global models and commands are followed (run identity, versions, replays).
        self.gate = ModelGate(config.accept_unnamed_runs, config.run_alternation_window_s, clock=clock)
        self.hparams: Dict[str, float] = {"lr": config.lr, "batch_size": config.batch_size,
                                          "local_steps": config.local_steps,
                                          "dropout": config.dropout}
        #: The newest accepted global model (None until the first arrives).
        self.global_model: Optional[GlobalModel] = None
        #: Version of the global model the local model last started from (-1: none yet).
        self.base_version = -1
        #: Rounds completed (the next update's ``round_index``).
        self.rounds = 0
        #: The coordinator's skip and train orders in force.
        self.orders = Orders(config.max_skip_rounds, config.round_interval_s)
        #: Diverged rounds: reported once with their cause, not retried on the same global model.
        self.divergence = DivergenceWatch(config.round_interval_s * config.diverged_retry_rounds)
        self.rejected_models = 0
        self.last_update: Optional[Update] = None
        #: Windows the last round's plug-in statistics ran on, besides training: ``batched`` (in
        #: one batched backward) and ``per_window`` (a backward per window). The simulator charges
        #: them to the round's time and energy.
        self.statistics_windows: Dict[str, int] = {}
        #: Decides the clock levels of each round.
        self.dvfs_policy = make_policy(config.dvfs.policy, **config.dvfs.policy_kwargs())
        #: Levels per DVFS domain, announced in Hello (set by the runtime that owns the clocks).
        self.dvfs_levels: Dict[str, List[int]] = {}
        #: The board profile's name, announced in Hello: the config's ``board``, replaced by the
        #: runtime that owns the clocks with the profile it resolved (``auto``, a profile file).
        self.board = config.board
        #: This process's random id, in every Hello: the coordinator tells two boards that share
        #: a device id apart by it (``coordinator/registry.py``).
        self.instance = uuid.uuid4().hex[:16]

    # ---- inputs -------------------------------------------------------------------------------

    def hello(self) -> Hello:
        """The retained status message announcing this device on every connect."""
        return Hello(device_id=self.device_id, board=self.board,
                     software_version=streamfl.__version__, arch_id=self.arch_id,
                     buffer_capacity=self.buffer.capacity, dvfs_levels=dict(self.dvfs_levels),
                     instance=self.instance)

    def add_window(self, window: Window) -> bool:
        """Offer one sensor window to the buffer; False if it was not stored (see buffer counters)."""
        window = self.methods.window_arrived(window)
        return self.buffer.add(window.x, window.label, window.state)

    def on_global_model(self, gm: GlobalModel) -> bool:
        """Accept a newer global model of our architecture and apply its hyper-parameters."""
        if gm.arch_id != self.arch_id:
            self.rejected_models += 1
            log.warning("ignoring global model v%d of architecture %s: this device runs %s",
                        gm.version, gm.arch_id, self.arch_id)
            return False
        verdict = self.gate.judge(gm)
        if verdict == UNNAMED:
            self.gate.refuse_unnamed(gm)
            return False
        if verdict == STALE:
            if self.global_model is not None and gm.version < self.global_model.version:
                log.info("ignoring stale global model v%d (have v%d)", gm.version,
                         self.global_model.version)
            return False
        self.gate.follow(gm, verdict)
        if verdict == RESYNC:
            self.base_version = -1  # the next round starts from the new run's model
        elif gm.version < self.base_version:
            # Only after a restart: the checkpoint's base is ahead of the run's real models (a
            # forged version, or a coordinator restored from a backup). Continuing from it would
            # keep that version in every update and checkpoint.
            log.warning("the local model came from v%d, ahead of the followed model v%d of run %s: "
                        "the next round starts from v%d", self.base_version, gm.version,
                        gm.run_id or "(unnamed)", gm.version)
            self.base_version = -1
        self.global_model = gm
        decided = self.methods.model_received(gm, gm.hparams)
        if decided.forget_windows:
            log.info("window buffer emptied (%d windows): they describe a world that is gone", len(self.buffer))
            self.buffer.clear()
        self.buffer.use(decided.buffer_policy if decided.buffer_policy is not None else self.policy)
        if decided.clock_policy is not None:  # the coordinator's method changed the clock policy
            self.dvfs_policy = decided.clock_policy
        before = dict(self.hparams)
        self.apply_hparams(decided.hparams, "global model v%d" % gm.version)
        if self.hparams != before:
            log.info("hyper-parameters from v%d: lr %.4g, batch %d, local steps %d, dropout %.3g",
                     gm.version, self.hparams["lr"], self.hparams["batch_size"],
                     self.hparams["local_steps"], self.hparams["dropout"])
        log.debug("global model v%d received", gm.version)
        return True

    @property
    def active_plugins(self) -> List[AgentPlugin]:
        """The plug-ins whose hooks are called now, in calling order."""
        return self.methods.active

    @property
    def plugins(self) -> List[AgentPlugin]:
        """Every method's device plug-in, active or dormant, in calling order."""
        return self.methods.plugins

    def on_command(self, cmd: Command) -> bool:
        """Handle a coordinator command: skip n rounds, train now or override hyper-parameters;
        False (logged) for any other kind."""
        if not self.gate.command_ok(cmd):
            return False
        if cmd.kind not in COMMAND_KINDS:
            log.warning("ignoring unsupported command %r", cmd.kind)
            return False
        if cmd.kind == "skip":
            return self.orders.skip(cmd.params)
        if cmd.kind == "train":
            self.orders.train(cmd.params)
        else:
            self.apply_hparams(cmd.params, "override command")
        return True

    def apply_hparams(self, values: Mapping[str, Any], source: str = "") -> Dict[str, float]:
        """Set the known hyper-parameters from ``values``, clamped to this board's limits."""
        applied = clamp_hparams(values, self.hparam_limits, source)
        self.hparams.update(applied)
        return applied

    # ---- scheduling ---------------------------------------------------------------------------

    def ready(self, now: float) -> bool:
        """True when the core could start a round: enough windows, a global model, the orders
        allow it (no skip in force, the commanded model arrived) and the last round did not
        diverge on the model held (``DivergenceWatch.allows``). The methods are not asked here:
        a runtime that finds the core ready when a round is due calls ``round_opportunity``."""
        version = None if self.global_model is None else self.global_model.version
        return (self.orders.allow(now, version) and self.global_model is not None
                and self.divergence.allows((self.global_model.run_id, version), now)
                and len(self.buffer) >= self.config.min_buffer)

    def wants_model(self) -> bool:
        """True while only a newer global model lets a round start: none held yet, a "train"
        command names a version not held, the last rounds diverged on the model held, or a
        method vetoes rounds until a newer model comes (``waits_for_newer_model``). The
        runtime keeps the model topic subscribed meanwhile (``agent/model_feed.py``); otherwise it
        fetches one model per round it starts."""
        gm = self.global_model
        if gm is None:
            return True
        wanted = self.orders.train_from_version
        return (wanted is not None and gm.version < wanted) or \
            self.divergence.waits_for_other_than((gm.run_id, gm.version)) or \
            self.methods.waits_for_newer_model()

    def round_opportunity(self, now: float) -> bool:
        """A round is due and the core is ready: every active plug-in is told of the opportunity,
        whatever the others answer (a plug-in may count opportunities or end a rest there, so
        stopping at the first no would hide it from the plug-ins after one that declines); True
        if none declines. Runtimes call it once per opportunity, not to poll."""
        return self.methods.round_opportunity(now)

    @property
    def train_requested(self) -> bool:
        """True while a "train" command waits (``take_train_request`` takes it)."""
        return self.orders.train_requested

    @property
    def skipping(self) -> bool:
        """True while a skip command is in force."""
        return self.orders.skipping

    def take_train_request(self) -> bool:
        """True once after a "train" command: the runtime may start a round without pacing."""
        return self.orders.take_train_request()

    def plugin(self, name: str) -> Optional[AgentPlugin]:
        """The plug-in called ``name`` (every registered one is held, active or dormant), None if
        there is none."""
        return self.methods.get(name)

    # ---- clocks -------------------------------------------------------------------------------

    @property
    def critical_period(self) -> bool:
        """True while an active plug-in said, on the newest global model, that the learning is in a
        critical period; False by default, so clock policies see "after the critical period"."""
        return self.methods.critical_period

    def frequency_plan(self, domains: Sequence[DomainView]) -> Dict[str, int]:
        """The clock level per domain for the next round; empty means "touch nothing"."""
        if not domains:
            return {}
        return self.dvfs_policy.plan(PolicyInput(self.critical_period, tuple(domains)))

    def observe_clocks(self, levels: Mapping[str, int], seconds_per_sample: float) -> None:
        """Tell the policy what a round at these levels cost per sample (its climb rule needs it)."""
        if seconds_per_sample > 0:
            for name, level in levels.items():
                self.dvfs_policy.observe(name, level, seconds_per_sample)

    # ---- training -----------------------------------------------------------------------------

    def begin_round(self) -> RoundPlan:
        """Fix the round's start weights and hyper-parameters.

        Start from the newest global model if it is newer than the one the previous round started
        from, else continue from the local model: FedAsync devices pull the latest global model,
        and restarting from the same global model again would throw the last round's work away.
        A plug-in may name other start weights for this one round (``round_start_weights``).
        """
        if self.global_model is None or len(self.buffer) == 0:
            raise NotReadyError("no global model yet" if self.global_model is None
                                else "the buffer is empty")
        self.orders.round_started()
        gm = self.global_model
        start = gm.tensors if gm.version > self.base_version else None
        base = gm.version if start is not None else self.base_version
        side = self.methods.round_start_weights()
        if side is not None:
            start, base = side, gm.version
        return RoundPlan(round_index=self.rounds, base_version=base, start_tensors=start,
                         side_start=side is not None,
                         lr=float(self.hparams["lr"]), dropout=float(self.hparams["dropout"]),
                         local_steps=int(self.hparams["local_steps"]),
                         batch_size=int(self.hparams["batch_size"]),
                         run_generation=self.gate.resyncs)

    def _batches(self, plan: RoundPlan, lock: ContextManager,
                 should_stop: Optional[Callable[[], bool]]) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        """Uniform minibatches drawn one step at a time (memory stays one batch, whatever the plan)."""
        for _ in range(plan.local_steps):
            if (should_stop is not None and should_stop()) or self.gate.resyncs != plan.run_generation:
                return
            with lock:
                if len(self.buffer) == 0:  # emptied mid-round: the round is interrupted
                    return
                X, y = self.buffer.sample(plan.batch_size, self._rng)
            yield X, y

    def finish_round(self, plan: RoundPlan, lock: Optional[ContextManager] = None,
                     should_stop: Optional[Callable[[], bool]] = None) -> Update:
        """Train ``plan.local_steps`` SGD steps and return the ``Update``.

        ``lock`` (the runtime's, guarding the buffer) is held only while each minibatch is drawn;
        ``should_stop`` is polled before every step so a shutdown never waits for a long round
        (``RoundInterrupted``; the local model keeps the steps already taken).
        """
        penalties, held = self._prepare(plan)
        t0 = self._timer()
        batches = self._batches(plan, lock if lock is not None else nullcontext(), should_stop)
        result = run_job(self.model, self.trainer, self._job(plan, batches))
        return self._finish(plan, result, penalties, held, max(0.0, self._timer() - t0), lock)

    def plan_training(self) -> PlannedRound:
        """``begin_round`` and all of the round before its SGD, the minibatches drawn now: for a
        runtime that runs the SGD elsewhere (the simulator's round workers) and hands the result
        to ``finish_training``. The draws are those ``finish_round`` makes step by step (nothing
        else draws from this core's generator in between), so the round is the same."""
        plan = self.begin_round()
        penalties, held = self._prepare(plan)
        batches = list(self._batches(plan, nullcontext(), None))
        return PlannedRound(plan=plan, job=self._job(plan, batches), penalties=penalties, held=held,
                            started_s=self._timer())

    def finish_training(self, planned: PlannedRound, result: TrainResult) -> Update:
        """The round of ``planned`` after its SGD ran: ``run_job`` on this core's ``model`` and
        ``trainer``, or elsewhere with the trained weights loaded back into ``model``. Raises
        ``DivergedError`` as ``finish_round`` does."""
        return self._finish(planned.plan, result, planned.penalties, planned.held,
                            max(0.0, self._timer() - planned.started_s))

    def _prepare(self, plan: RoundPlan) -> Tuple[List[Tuple[str, Optional[Any]]], Optional[GlobalModel]]:
        """The model at the round's start weights and dropout, and the methods' penalties for it;
        returns the named penalties and the global model the round trains with."""
        if plan.start_tensors is not None:
            arrays_to_model(self.model, plan.start_tensors)
        # After a round from a plug-in's weights the local model is not the fleet's: the next
        # round starts from the newest global model, whatever its version.
        self.base_version = -1 if plan.side_start else plan.base_version
        held = self.global_model  # the model whose pulls and lr this round trains with
        self.model.set_dropout(plan.dropout)
        penalties = self.methods.penalties(self.model)
        self.trainer.penalties = [p for _, p in penalties if p is not None]
        return penalties, held

    def _job(self, plan: RoundPlan, batches: Iterable[Tuple[np.ndarray, np.ndarray]]) -> TrainingJob:
        """The round's SGD as a ``TrainingJob``: dropout and penalties as ``_prepare`` set them,
        the round's own torch seed (the same dropout masks wherever it runs)."""
        return TrainingJob(batches=batches, lr=plan.lr, dropout=plan.dropout,
                           torch_seed=(self.seed * 1000003 + plan.round_index) & 0x7FFFFFFFFFFFFFFF,
                           penalties=list(self.trainer.penalties), momentum=self.trainer.momentum,
                           weight_decay=self.trainer.weight_decay)

    def _finish(self, plan: RoundPlan, result: TrainResult, penalties: Sequence[Tuple[str, Any]],
                held: Optional[GlobalModel], elapsed_s: float,
                lock: Optional[ContextManager] = None) -> Update:
        """The update of a round whose SGD gave ``result`` (the trained weights in ``model``)."""
        if self.gate.resyncs != plan.run_generation:
            self.base_version = -1  # never send, or continue from, a model of the run left
            raise RoundInterrupted("round %d dropped after %d of %d steps: it trained from v%d of "
                                   "the run the agent left; the next round starts from run %s" % (
                                       plan.round_index, result.steps, plan.local_steps,
                                       plan.base_version, self.gate.run_id or "(unnamed)"))
        if result.steps < plan.local_steps:
            raise RoundInterrupted("round %d stopped after %d of %d steps" % (
                plan.round_index, result.steps, plan.local_steps))
        self.rounds = plan.round_index + 1
        self.statistics_windows = {}
        tensors = model_to_arrays(self.model)
        if not (np.isfinite(result.mean_loss) and all(np.isfinite(t).all() for t in tensors.values())):
            self.base_version = -1  # never send or continue from a diverged model
            cause = self._divergence_cause(plan, result.mean_loss, penalties, held)
            self.divergence.diverged(cause)
            raise DivergedError("diverged: %s" % cause.describe(), cause)
        self.divergence.succeeded(plan.round_index, plan.base_version)
        update = Update(device_id=self.device_id, update_id=uuid.uuid4().hex,
                        base_version=plan.base_version, arch_id=self.arch_id,
                        tensors=tensors, num_samples=result.num_samples,
                        class_counts=result.class_counts, loss=result.mean_loss,
                        seconds_per_sample=elapsed_s / max(1, result.num_samples),
                        round_index=plan.round_index, created_s=float(self._clock()),
                        extras=self._statistics(plan, tensors, lock if lock is not None else nullcontext(),
                                                result.mean_loss,
                                                result.losses[0] if result.losses else None))
        self.last_update = update
        log.info("round %d from v%d: %d samples, loss %.4f, %.2f ms/sample", plan.round_index,
                 plan.base_version, result.num_samples, result.mean_loss,
                 update.seconds_per_sample * 1e3)
        return update

    def _divergence_cause(self, plan: RoundPlan, loss: float, penalties: Sequence[Tuple[str, Any]],
                          gm: Optional[GlobalModel]) -> DivergenceCause:
        """What a diverged round trained with: its pulls, as built and as applied, its lr, and
        the global model it held."""
        pulls, terms = describe_pulls(penalties, plan.lr)
        return DivergenceCause(
            round_index=plan.round_index, loss=float(loss), lr=plan.lr, base_version=plan.base_version,
            model_version=None if gm is None else gm.version, run_id="" if gm is None else gm.run_id,
            pulls=pulls, applied=plan.lr * largest_curvature(self.trainer.applied.values()),
            capped=self.trainer.capped, terms=terms)

    def _statistics(self, plan: RoundPlan, tensors: Dict[str, np.ndarray],
                    lock: ContextManager, loss: Optional[float] = None,
                    start_loss: Optional[float] = None) -> Dict[str, Any]:
        """The plug-ins' round statistics at the trained model, as the update's extras; what they
        cost goes to ``statistics_windows``."""
        def sample(n: int) -> Tuple[np.ndarray, np.ndarray]:
            with lock:
                return self.buffer.sample(n, self._rng)

        with lock:
            buffer_counts = self.buffer.class_counts()
        ctx = RoundContext(model=self.model, tensors=tensors, round_index=plan.round_index,
                           seed=self.seed, sample=sample, buffer_len=len(self.buffer),
                           loss=loss, start_loss=start_loss, num_classes=self.spec.num_classes,
                           buffer_counts=buffer_counts, base_version=plan.base_version,
                           round_interval_s=float(self.config.round_interval_s),
                           local_steps=int(plan.local_steps))
        extras, self.statistics_windows = self.methods.statistics(ctx)
        return extras

    def report_extras(self, now: float, lock: Optional[ContextManager] = None) -> Dict[str, Any]:
        """The active plug-ins' cheap reports for a telemetry message while no round runs (empty
        when no method asks for one, or before the first global model)."""
        if self.global_model is None:
            return {}
        with lock if lock is not None else nullcontext():
            counts = self.buffer.class_counts()
        ctx = ReportContext(buffer_counts=counts, num_classes=self.spec.num_classes, now_s=float(now))
        return self.methods.reports(ctx)

    def complete_round(self, update: Update, measured: RoundMeasurement) -> Update:
        """The round's update as sent: stamped with what the runtime measured, which the clock
        policy also learns from (its climb rule compares time per sample across levels)."""
        update = replace(
            update, seconds_per_sample=measured.seconds_per_sample, energy_j=measured.energy_j,
            clock_levels=dict(measured.clock_levels),
            created_s=update.created_s if measured.finished_s is None else measured.finished_s)
        self.last_update = update
        self.observe_clocks(measured.clock_levels, measured.seconds_per_sample)
        return update

    def train_round(self) -> Update:
        """``begin_round`` then ``finish_round``: one local round for single-threaded runtimes."""
        return self.finish_round(self.begin_round())

    # ---- persistence --------------------------------------------------------------------------

    def checkpoint(self) -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
        """The local model and the meta a restart needs to continue from it."""
        meta = {"global_version": self.base_version, "round_index": self.rounds,
                "device_id": self.device_id, "arch_id": self.arch_id}
        meta.update(self.gate.state())
        return model_to_arrays(self.model), meta

    def restore(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
        """Continue from a checkpoint: its weights, the global version they came from, the round."""
        arrays_to_model(self.model, arrays)
        self.base_version = int(meta.get("global_version", -1))
        self.rounds = int(meta.get("round_index", 0))
        self.gate.load_state(dict(meta))

    def stats(self) -> Dict[str, Any]:
        """State for telemetry and tests."""
        return {"rounds": self.rounds, "base_version": self.base_version, **self.divergence.status(),
                "global_version": self.global_model.version if self.global_model else None,
                "buffer": self.buffer.stats(), "hparams": dict(self.hparams),
                "rejected_models": self.rejected_models, "skipping": self.skipping,
                "run_id": self.gate.run_id, "resyncs": self.gate.resyncs,
                "rejected_commands": self.gate.rejected_commands,
                "unnamed_models": self.gate.unnamed_models,
                "run_alternations": self.gate.run_alternations}
