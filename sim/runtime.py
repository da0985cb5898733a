"""The simulator's runtime: the unmodified ``AgentCore`` and ``CoordinatorCore`` in virtual time.

One discrete-event queue drives a fleet. A device's round trains its
real model on the windows its stream delivered; how long that took, what it cost and when the
update reaches the coordinator come from its ``DeviceModel`` (seconds per sample at the clock level
its DVFS policy chose, shifted-exponential noise, bandwidth), never from this machine's wall clock.
Every message goes through the real codec. A device sees the newest global model whose download
has finished, as an MQTT client with a retained model topic does. The same seed gives the same run.
Every new version, made by an update or by FedAvg's deadline, emits an ``aggregate`` event naming
what it merged (the summary's per-round figures count those).

The runtime names no method and no stream kind: a method's package states what a simulated
device's facts and a tuned learning rate set in its agent plug-in (``MethodPackage.sim``), a train
command's bandwidth grant is a generic field of it (``streamfl.protocol.train``), and a stream kind
states what its ``eval`` events add (``streamfl.sim.stream_kinds.evaluation``).
"""
import dataclasses
import itertools
import logging
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from streamfl.agent.config import AgentConfig
from streamfl.agent.core import AgentCore, DivergedError, PlannedRound, RoundMeasurement
from streamfl.config import build, merge
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.core import CoordinatorCore, Step
from streamfl.coordinator.strategies import staleness_of
from streamfl.dvfs.policies.base import DomainView
from streamfl.dvfs.simulated import SimulatedBackend, SimulatedDomain
from streamfl.models import ModelSpec, tensor_spec
from streamfl.models.evaluation import Evaluator
from streamfl.protocol.codec import Decoder, encode, encode_update
from streamfl.protocol.messages import GlobalModel, Offline, Telemetry, Tensors, Update
from streamfl.protocol.train import TrainRequest
from streamfl.sensors.window import Window
from streamfl.sim.device import DeviceModel, make_devices
from streamfl.sim.device_state import DeviceState, device_specs
from streamfl.sim.events import Event, EventQueue
from streamfl.sim.methods import Method, plugin_settings, run_settings
from streamfl.sim.rounds.base import RoundRunner
from streamfl.sim.rounds.inline import InlineRounds
from streamfl.sim.scenario import Scenario
from streamfl.sim.scenario_data import SimData
from streamfl.sim.stream_kinds import evaluation
from streamfl.sim.stream_timeline import AggregationClock

log = logging.getLogger(__name__)

Emit = Callable[[Dict[str, Any]], None]
FLEET = "sim"


@dataclasses.dataclass
class _Pending:
    """A round whose SGD runs elsewhere: what finishing it needs, and from when it could matter."""

    i: int
    t: float
    levels: Dict[str, int]
    interval_s: float
    planned: PlannedRound
    ticket: Any
    #: Two sequence numbers reserved for its pushes (the update, then the next round).
    seq: int
    #: The loop's event that started it (its emitted events go there).
    key: int
    #: No outcome of it lands before this virtual time.
    horizon_s: float


class SimRun:
    """One method on one seed: builds the fleet, runs the event loop, emits metric events."""

    def __init__(self, scenario: Scenario, method: Method, seed: int, data: SimData,
                 emit: Emit, progress: Optional[Callable[[float], None]] = None,
                 rounds: Optional[RoundRunner] = None):
        self.scenario = scenario
        self.data = data
        T, C, K = data.shape
        self.spec = ModelSpec(name=scenario.model.name, in_channels=C, window_len=T, num_classes=K,
                              hidden=scenario.model.hidden)
        # The method laid over the scenario (``streamfl.sim.methods.run_settings``): its plug-ins
        # with the scenario's settings under its own, a tuned rate over both.
        coordinator, self._agent_values = run_settings(scenario, method)
        # Simulated boards are honest and train back to back in virtual time, faster than the
        # fixed cap a real coordinator puts on a device, and the event queue hands the coordinator
        # uploads and ticks in the order they complete, not always in time order: the per-device
        # rate limit is off here (a scenario may set it).
        ccfg = merge({"fleet": FLEET, "seed": int(seed), "model": dataclasses.asdict(self.spec)},
                     coordinator)
        admission = ccfg.setdefault("admission", {})     # (merge drops None values: set it here)
        admission.setdefault("max_updates_per_s", None)
        admission.setdefault("round_time_fraction", 0.0)
        #: Version 0 trained beforehand (``scenario.pretrain``), and how well; None: built from
        #: the coordinator's seed, as on a fleet without a shipped model.
        initial, self.pretrain_accuracy = data.pretrained(int(seed), self.spec)
        self._start(build(CoordinatorConfig, ccfg, "%s: coordinator" % scenario.name), method, seed,
                    emit, progress, rounds, initial)
        policy = method.dvfs_policy or scenario.dvfs_policy
        models = make_devices(device_specs(scenario), self.seed)
        streams = data.streams(self.seed, self.clock)
        for i, dev in enumerate(models):
            self.devices.append(self._device(i, dev, streams[i], policy))
        self.evaluator = Evaluator(self.spec, *data.eval_set(self.seed))
        self.end_s = float(scenario.duration_s)

    # ---- construction -------------------------------------------------------------------------

    def _start(self, config: CoordinatorConfig, method: Method, seed: int, emit: Emit,
               progress: Optional[Callable[[float], None]] = None,
               rounds: Optional[RoundRunner] = None, initial: Optional[Tensors] = None) -> None:
        """The coordinator side: its core behind the codec, the event queue, version 0 (``initial``,
        or built from the coordinator's seed) published."""
        self.method = method
        self.seed = int(seed)
        self._sink = emit
        self.progress = progress
        #: Where the devices' SGD runs (``streamfl.sim.rounds``); inline: the serial run.
        self.rounds: RoundRunner = rounds if rounds is not None else InlineRounds()
        #: Rounds whose SGD runs elsewhere, in the order they started (``_commit`` finishes them).
        self._pending: List[_Pending] = []
        #: Events emitted while rounds are pending, by (the event that made them, order made).
        self._held: List[Tuple[int, int, Dict[str, Any]]] = []
        self._event_key = 0
        self._emitted = itertools.count()  # the order events were emitted in, among equal keys
        self._committing = False
        self.queue = EventQueue()
        #: When each version was made: streams whose periods count aggregations read it.
        self.clock = AggregationClock()
        self.coordinator = CoordinatorCore(config, tensors=initial)
        # As the coordinator's server: admission checks an update for NaN/Inf in its own pass.
        self.decoder = Decoder({config.model.arch_id: tensor_spec(config.model)},
                               receiver_checks_finite=(Update,))
        self.devices: List[DeviceState] = []
        self._index: Dict[str, int] = {}
        self.published: List[Tuple[float, GlobalModel, int]] = []
        self._publish(0.0)

    def _now(self) -> float:
        return self.queue.now_s

    def _device(self, i: int, dev: DeviceModel, stream: Any, policy: str) -> DeviceState:
        T, C, K = self.data.shape
        # What the device's facts (its radio) set in the methods' agent plug-ins, under the
        # scenario's and the run's own settings.
        facts = plugin_settings("device_settings", dev)
        values = merge({"fleet": FLEET, "device_id": "dev-%03d" % i, "board": dev.profile.name,
                        "model": dataclasses.asdict(self.spec),
                        # The runtime delivers the stream's windows itself: the sensor section only
                        # states their shape ("mqtt" takes any channel count, the IMU kinds 3 or 6).
                        "sensor": {"kind": "mqtt", "window_len": T, "channels": C, "num_classes": K},
                        "dvfs": {"backend": "simulated", "board": dev.profile.name, "policy": policy},
                        "seed": self.seed * 100003 + i, "round_interval_s": 1.0, "min_buffer": 32},
                       facts, self._agent_values)
        cfg = build(AgentConfig, values, "%s: agent" % self.scenario.name)
        agent = AgentCore(cfg, clock=self._now, timer=lambda: 0.0)
        backend = SimulatedBackend([SimulatedDomain(s.name, s.kind, s.levels_khz, clock=self._now)
                                    for s in dev.profile.domains])
        agent.dvfs_levels = {d.name: list(d.levels_khz) for d in backend.domains}
        self._index[agent.device_id] = i
        return DeviceState(model=dev, agent=agent, backend=backend, stream=stream)

    # ---- the loop -----------------------------------------------------------------------------

    def run(self) -> Dict[str, Any]:
        """Run to ``duration_s`` (or ``max_aggregations``); returns per-device totals."""
        q = self.queue
        # Boards do not boot in lockstep: each starts within its first round interval.
        offsets = np.random.default_rng([self.seed, 0x5EED]).random(len(self.devices))
        for i, d in enumerate(self.devices):
            start = d.model.presence.next_available_s(0.0)
            if start is not None and start < self.end_s:
                self._next_round(i, start + offsets[i] * float(d.agent.config.round_interval_s))
        q.push(0.0, "eval")
        self._loop()
        self._evaluate(self.end_s, final=True)
        return self.totals()

    def _loop(self) -> None:
        """Pop and handle events up to ``end_s`` (or ``max_aggregations``).

        With a round runner that ``overlaps``, a round's SGD runs elsewhere while the loop goes
        on with the events its outcome cannot change (``_independent``); pending rounds are
        finished (``_commit``, oldest first) only as far as the next event needs. Its pushes take sequence numbers reserved when it started
        and its emitted events are put back in their serial place, so the run is the serial
        run, bit for bit."""
        q = self.queue
        q.push(q.now_s + self.scenario.tick_s, "tick")  # FedAvg's deadline, plug-ins' timers
        limit = self.scenario.max_aggregations
        while True:
            if self._pending:
                self.rounds.poll()
                self._commit_until_independent()
            if not len(q) or q.peek_time() > self.end_s:
                break
            ev = q.pop()
            self._event_key += 1
            if ev.kind == "round":
                i, gen = ev.payload
                if gen == self.devices[i].round_gen:
                    self._round(i, ev.time_s)
            elif ev.kind == "update":
                self._arrive(ev.time_s, *ev.payload)
            elif ev.kind == "command":
                self._command(ev.time_s, *ev.payload)
            elif ev.kind == "tick":
                self._apply(self.coordinator.tick(ev.time_s), ev.time_s)
                q.push(ev.time_s + self.scenario.tick_s, "tick")
            elif ev.kind == "eval":
                self._evaluate(ev.time_s)
                q.push(ev.time_s + self.scenario.eval_every_s, "eval")
            if limit is not None and self.coordinator.counters["aggregated"] >= limit:
                self._commit_all()
                self.end_s = q.now_s
                break
        self._commit_all()

    def _independent(self, ev: Optional[Event]) -> bool:
        """True if ``ev`` may be handled while the pending rounds' SGD runs: it comes before any
        of their outcomes can (``_Pending.horizon_s``), reads nothing they change (an evaluation
        reads every device's energy and buffer) and is not for a device with a pending round.
        Its absence, or an event past the end, waits for them: they may push earlier events."""
        if ev is None or ev.time_s > self.end_s or ev.kind == "eval":
            return False
        if ev.time_s >= min(p.horizon_s for p in self._pending):
            return False
        if ev.kind in ("round", "command"):
            return all(p.i != ev.payload[0] for p in self._pending)
        return True

    def _round(self, i: int, t: float) -> None:
        d = self.devices[i]
        interval = max(1e-3, float(d.agent.config.round_interval_s))
        if not d.model.presence.available(t):
            if d.online:
                d.online = False
                self._message(Offline(device_id=d.agent.device_id), t)
            nxt = d.model.presence.next_available_s(t)
            if nxt is not None and nxt < self.end_s:
                self._next_round(i, max(nxt, t + 1e-6))
            return
        if not d.online:
            d.online = True
            self._message(d.agent.hello(), t)
        X, y, states = d.stream.windows_with_states(d.fed_until_s, t)
        d.fed_until_s = t
        for x, label, state in zip(X, y, states.tolist()):
            d.agent.add_window(Window(x, int(label), t, state))
        gm = self._newest_for(d, t)
        if gm is not None and (d.agent.global_model is None or gm.version > d.agent.global_model.version):
            d.agent.on_global_model(gm)
        if not (d.agent.ready(t) and d.agent.round_opportunity(t)) or not d.model.participates():
            self._report(d, t)
            self._next_round(i, t + interval)
            return
        views = tuple(DomainView(dom.name, dom.kind, tuple(dom.levels_khz), dom.current_level())
                      for dom in d.backend.domains)
        for name, level in d.agent.frequency_plan(views).items():
            d.backend.domain(name).set_level(level)
        levels = {dom.name: dom.current_level() for dom in d.backend.domains}
        planned = d.agent.plan_training()
        ticket = self.rounds.submit(d.agent.trainer, self.spec, planned.job)
        # No outcome of the round lands before its least compute time (the noise only adds),
        # nor before the device leaves: events before both cannot depend on it.
        samples = min(sum(len(y) for _, y in planned.job.batches),
                      planned.plan.local_steps * planned.plan.batch_size)
        horizon_s = t + samples * d.model.min_seconds_per_sample(levels)
        gone_s = d.model.presence.next_unavailable_s(t)
        if gone_s is not None:
            horizon_s = min(horizon_s, gone_s)
        self._pending.append(_Pending(i=i, t=t, levels=levels, interval_s=interval, planned=planned,
                                      ticket=ticket, seq=self.queue.reserve(2),
                                      key=self._event_key, horizon_s=horizon_s))
        if not self.rounds.overlaps:
            self._commit_all()

    def _commit_until_independent(self) -> None:
        """Finish pending rounds, oldest first, until the next event is independent of the rest
        (``_independent``; a finished round may push an earlier one): the others keep training."""
        while self._pending and not self._independent(self.queue.peek()):
            self._commit(self._pending.pop(0))
        self._release_held()

    def _commit_all(self) -> None:
        """Finish every pending round, oldest first; then emit what was held, in serial order."""
        while self._pending:
            self._commit(self._pending.pop(0))
        self._release_held()

    def _release_held(self) -> None:
        """Emit the held events that no pending round's events go before, in serial order."""
        if not self._held:
            return
        first = min((p.key for p in self._pending), default=None)
        held = sorted(self._held, key=lambda h: h[:2])
        cut = len(held) if first is None else next((k for k, h in enumerate(held) if h[0] >= first), len(held))
        self._held = held[cut:]
        for _, _, event in held[:cut]:
            self._sink(event)

    def _commit(self, p: "_Pending") -> None:
        """The rest of a round once its SGD is done: the update, its timing and energy, its pushes."""
        d = self.devices[p.i]
        result = self.rounds.result(p.ticket)
        key, self._event_key, self._committing = self._event_key, p.key, True
        try:
            self._finish_round(p, d, result)
        finally:
            self._event_key, self._committing = key, False

    def _finish_round(self, p: "_Pending", d: DeviceState, result: Any) -> None:
        """What the serial runtime did after ``train_round``, with the round's reserved sequence numbers."""
        i, t, levels, interval = p.i, p.t, p.levels, p.interval_s
        try:
            update = d.agent.finish_training(p.planned, result)
        except DivergedError as exc:
            self._diverged(i, d, t, levels, interval, exc, p.seq)
            return
        # The plug-ins' round statistics (a Fisher trace or diagonal) take time too (a real agent spends it the same way).
        work = d.model.work_samples(update.num_samples, d.agent.statistics_windows)
        compute_s = d.model.compute_s(work, levels)
        train_j = d.model.train_w(levels) * compute_s
        update = d.agent.complete_round(update, RoundMeasurement(
            clock_levels=levels, seconds_per_sample=compute_s / max(1, work),
            energy_j=round(train_j, 6), finished_s=t + compute_s))
        # The agent's update_encoding, with the base it holds, as the daemon sends it.
        frame = encode_update(update, d.agent.config.update_encoding, d.agent.global_model)
        upload_s = d.model.upload_s(len(frame), d.grant_hz)
        d.grant_hz = None
        d.busy_until_s = t + compute_s
        gone_s = d.model.presence.next_unavailable_s(t)
        if gone_s is not None and gone_s < t + compute_s + upload_s:
            # It leaves before its update is out: the work until then is spent, the update lost.
            spent_s = max(0.0, min(compute_s, gone_s - t))
            d.busy_s += spent_s
            d.train_j += d.model.train_w(levels) * spent_s
            d.lost_rounds += 1
            self._next_round(i, gone_s, p.seq)
            return
        d.busy_s += compute_s
        d.train_j += train_j
        d.rounds += 1
        d.latency_s += compute_s + upload_s
        self.queue.push(t + compute_s + upload_s, "update", (i, frame, compute_s, upload_s, train_j),
                        seq=p.seq)
        self._next_round(i, max(t + interval, t + compute_s), p.seq + 1)

    def emit(self, event: Dict[str, Any]) -> None:
        """Every event the run emits: straight out, or held while rounds are pending (a pending
        round's own events go before those of the events handled after it started)."""
        if self._pending or self._committing or self._held:
            self._held.append((self._event_key, next(self._emitted), event))
        else:
            self._sink(event)

    def _next_round(self, i: int, t: float, seq: Optional[int] = None) -> None:
        """Queue device ``i``'s next round event (of its current generation); ``seq``: a reserved one."""
        self.queue.push(t, "round", (i, self.devices[i].round_gen), seq=seq)

    def _report(self, d: DeviceState, t: float) -> None:
        """A device that does not train now sends its plug-ins' reports (if any ask for one) in a
        telemetry message, through the codec, as the daemon does while told to skip."""
        extras = d.agent.report_extras(t)
        if extras:
            self._message(Telemetry(device_id=d.agent.device_id, time_s=float(t),
                                    buffer_fill=len(d.agent.buffer),
                                    buffer_capacity=int(d.agent.config.buffer_capacity),
                                    rounds=d.rounds, extras=extras), t)

    def _diverged(self, i: int, d: DeviceState, t: float, levels: Dict[str, int], interval: float,
                  exc: DivergedError, seq: Optional[int] = None) -> None:
        """A round whose training diverged: its work is spent, no update is sent, and the device
        goes on from the global model next round, as the daemon does (agent/daemon.py)."""
        hp = d.agent.hparams
        compute_s = d.model.compute_s(int(hp["local_steps"]) * int(hp["batch_size"]), levels)
        d.busy_s += compute_s
        d.train_j += d.model.train_w(levels) * compute_s
        d.diverged_rounds += 1
        d.busy_until_s = t + compute_s
        log.info("%s: %s", d.agent.device_id, exc)
        self.emit({"event": "diverged", "method": self.method.name, "seed": self.seed,
                   "time_s": round(t, 6), "device_id": d.agent.device_id, "lr": hp["lr"]})
        self._next_round(i, max(t + interval, t + compute_s), seq)

    def _arrive(self, t: float, i: int, frame: bytes, compute_s: float, upload_s: float,
                train_j: float) -> None:
        # A replay (``sim/replay.py``) feeds recorded frames with no simulated devices behind them.
        device_id = self.devices[i].agent.device_id if 0 <= i < len(self.devices) else ""
        update = self.decoder.try_decode(frame, source=device_id)
        if update is None:  # refused by the codec, as the coordinator's server refuses it: lost
            self.emit({"event": "refused_frame", "method": self.method.name, "seed": self.seed,
                       "time_s": round(t, 6), "device_id": device_id, "frame_bytes": len(frame)})
            return
        step = self.coordinator.on_update(update, t)
        event = step.update.as_event()
        event.update(event="update", method=self.method.name, seed=self.seed, time_s=round(t, 6),
                     train_s=round(compute_s, 6), upload_s=round(upload_s, 6), frame_bytes=len(frame))
        self.emit(event)
        self._apply(step, t)

    def _apply(self, step: Step, t: float) -> None:
        """Do what the coordinator's step asks: publish each new version and record what it
        merged (deadline rounds included), log the plug-ins' events, send the commands."""
        for aggregation in step.aggregations:
            self.clock.record(t, len(aggregation.merged))
            self._publish(t)
            version, merged = aggregation.version, aggregation.merged
            self.emit({"event": "aggregate", "method": self.method.name, "seed": self.seed,
                       "time_s": round(t, 6), "version": version,
                       "devices": [u.device_id for u in merged], "n": len(merged),
                       # The published frame's size (every subscribed device downloads it).
                       "model_bytes": self.published[-1][2],
                       # Relative to the version merged into (version - 1), as the update records count it.
                       "staleness": [staleness_of(version - 1, u.base_version) for u in merged]})
        for event in step.events:
            self.emit(dict(event, method=self.method.name, seed=self.seed, time_s=round(t, 6)))
        for addressed in step.commands:
            i = self._index.get(addressed.device_id)
            if i is None:
                log.warning("command for unknown device %s dropped", addressed.device_id)
                continue
            frame = encode(addressed.command)
            self.queue.push(t + self.devices[i].model.download_s(len(frame)), "command", (i, frame))

    def _command(self, t: float, i: int, frame: bytes) -> None:
        """A command reaches its device through the codec, as over MQTT. A device offline at that
        moment misses it here, where a broker holding the device's persistent session would
        deliver it on reconnect: plug-ins must not rely on either. A ``train`` command starts a
        round at once on a device not computing one, as the daemon does, and its bandwidth grant
        (``TrainRequest.bandwidth_hz``) sets the next upload's bandwidth."""
        d = self.devices[i]
        if not d.online:
            return
        command = self.decoder.decode(frame)
        d.agent.on_command(command)
        if command.kind != "train":
            return
        request = TrainRequest.of(command.params)
        d.grant_hz = request.bandwidth_hz
        d.agent.take_train_request()
        if t >= d.busy_until_s:
            d.round_gen += 1
            # The daemon starts the round once the model the command names has arrived.
            wanted = request.version
            arrive_s = [t_pub + d.model.download_s(nbytes) for t_pub, gm, nbytes in self.published
                        if wanted is not None and gm.version >= wanted]
            self._next_round(i, max([t] + arrive_s[:1]))

    def _message(self, msg: Any, t: float) -> None:
        """A status message from a device, through the codec like everything else (one the codec
        refuses is counted and logged by it, and lost, as on the coordinator's server)."""
        decoded = self.decoder.try_decode(encode(msg), source=getattr(msg, "device_id", ""))
        if decoded is not None:
            self._apply(self.coordinator.on_message(decoded, t), t)

    def _publish(self, t: float) -> None:
        frame = encode(self.coordinator.global_model(), encoding=self.coordinator.config.model_encoding)
        self.published.append((t, self.decoder.decode(frame), len(frame)))
        # Forget models every device has a newer download of, so memory stays flat over a run.
        keep = 0
        for k, (t_pub, _, nbytes) in enumerate(self.published):
            if self.devices and all(t_pub + d.model.download_s(nbytes) <= t for d in self.devices):
                keep = k
        del self.published[:keep]

    def _newest_for(self, d: DeviceState, t: float) -> Optional[GlobalModel]:
        """The newest model whose download to ``d`` has finished by ``t``."""
        for t_pub, gm, nbytes in reversed(self.published):
            if t_pub + d.model.download_s(nbytes) <= t:
                return gm
        return None

    # ---- measuring ----------------------------------------------------------------------------

    def energy_split_j(self, t: float) -> Tuple[float, float]:
        """Fleet (training, idle) joules up to ``t``. Training: each round's whole-board power (idle
        floor included, as a meter on the board measures a round) times its time; idle: idle power
        over the rest of the online time. Split by time, as ``train_s`` and ``idle_s`` are."""
        return (sum(d.train_j for d in self.devices),
                sum(d.model.idle_w * d.idle_s(t) for d in self.devices))

    def energy_j(self, t: float) -> float:
        """Fleet energy up to ``t``: training joules plus idle power over the rest of online time."""
        return sum(self.energy_split_j(t))

    def _evaluate(self, t: float, final: bool = False) -> None:
        seen = set()
        for d in self.devices:
            if d.model.presence.online_s(t) > 0:
                seen |= set(d.stream.classes_seen(t))
        tensors = self.coordinator.model
        kind = evaluation(self.scenario.stream.kind)
        sets = [seen] + kind.class_sets(t, self.devices)
        accuracy, loss, on_sets = self.evaluator.evaluate_sets(tensors, sets)
        accuracy_seen = on_sets[0]
        train_j, idle_j = self.energy_split_j(t)
        event = {"event": "eval", "method": self.method.name, "seed": self.seed,
                 "time_s": round(t, 6), "version": self.coordinator.version,
                 "accuracy": accuracy, "loss": loss, "accuracy_seen": accuracy_seen,
                 "energy_j": round(train_j + idle_j, 3), "train_energy_j": round(train_j, 3),
                 "idle_energy_j": round(idle_j, 3), "period": self.data.period(t),
                 "final": final}
        event.update(kind.fields(t, self.devices, self.evaluator, tensors, on_sets[1:]))
        self.emit(event)
        if self.progress is not None:
            self.progress(min(1.0, t / self.end_s))

    def totals(self) -> Dict[str, Any]:
        """Per-device figures at the run's end (``DeviceState.totals``)."""
        return {d.agent.device_id: d.totals(self.end_s) for d in self.devices}
