"""The agent's wall-clock runtime: sensor thread, training thread, MQTT side, outbox, checkpoints.

All decisions are the ``AgentCore``'s; this module only moves windows, frames and files around it
(docs/architecture.md). One lock guards the core; the training thread holds it only to start a
round and to draw each minibatch, never while publishing, so a synchronous (in-memory) transport
that calls ``on_message`` from inside ``publish`` cannot deadlock.
"""
import logging
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Optional

from streamfl.agent.config import AgentConfig
from streamfl.agent.coordinator_watch import CoordinatorWatch
from streamfl.agent.disk import state_disk
from streamfl.agent.core import AgentCore, DivergedError, RoundInterrupted, RoundMeasurement
from streamfl.agent.dvfs import AgentDvfs
from streamfl.agent.fleet_control import FleetControl
from streamfl.agent.log_ring import LogRing
from streamfl.agent.model_feed import ModelFeed
from streamfl.agent.model_wait import ModelWait
from streamfl.notify import SystemdNotifier
from streamfl.agent.outbox import Outbox
from streamfl.agent.predictor import make_predictor
from streamfl.agent.state import StateDir
from streamfl.agent.takeover import TakeoverWatch
from streamfl.errors import ProtocolError, SensorError, StorageError, StreamflError
from streamfl.models import model_to_arrays, tensor_spec
from streamfl.protocol.codec import Decoder, encode, encode_update
from streamfl.protocol.messages import (FLEET_CONTROL_KINDS, Command, CoordinatorStatus, GlobalModel,
                                       Offline, Telemetry)
from streamfl.protocol.signing import BAD_SIGNATURE, ENVELOPE_BYTES, UNSIGNED, make_verifier
from streamfl.protocol.topics import Topics
from streamfl.protocol.transport.base import Transport

log = logging.getLogger(__name__)

#: Seconds to wait for the training thread when stopping (rounds stop at the next SGD step, so this
#: only matters for one very slow step); under systemd's TimeoutStopSec=60.
STOP_TIMEOUT_S = 30.0


class AgentDaemon:
    """Runs one device: ``run()`` blocks until ``stop()`` (the CLI's SIGTERM handler) is called."""

    def __init__(self, config: AgentConfig, transport: Transport, source, state_dir: Path,
                 clock: Callable[[], float] = time.monotonic,
                 notifier: Optional[SystemdNotifier] = None,
                 wall_clock: Callable[[], float] = time.time, outbox_writer=None,
                 dvfs: Optional[AgentDvfs] = None):
        self.config = config
        self.transport = transport
        self.source = source
        self._clock = clock
        self._wall_clock = wall_clock
        self.notifier = notifier or SystemdNotifier()
        self.state = StateDir(state_dir).prepare()
        #: The agent's newest log lines (``streamfl operator logs``), kept from ``start`` on.
        self.log_ring = LogRing(config.control.log_lines, config.control.log_line_chars)
        #: Fleet control's paused flag and live settings (``agent/fleet_control.py``): a setting
        #: an operator pushed overrides the YAML's, here before anything reads it.
        self.control = FleetControl(self.state.path, config, self.log_ring)
        config = self.config = self.control.config
        self.core = AgentCore(config, clock=wall_clock)
        #: Clocks and energy; shares ``clock`` with the daemon so round times and joules line up.
        self.dvfs = dvfs or AgentDvfs.disabled()
        self.core.dvfs_levels = self.dvfs.hello_levels()
        if self.dvfs.board:  # the profile it resolved ("auto", a profile file) names the board
            self.core.board = self.dvfs.board
        self.device_id = config.device_id
        self.topics = Topics(config.fleet)
        self.status_topic = self.topics.device(self.device_id, "status")
        self.update_topic = self.topics.device(self.device_id, "update")
        self.command_topic = self.topics.device(self.device_id, "command")
        self.telemetry_topic = self.topics.device(self.device_id, "telemetry")
        self.reply_topic = self.topics.device(self.device_id, "reply")
        self.decoder = Decoder({self.core.arch_id: tensor_spec(config.model)},
                               max_frame_bytes=config.max_frame_bytes + ENVELOPE_BYTES)
        #: Checks the coordinator's signature on models and commands (a null check without a key).
        self.verifier = make_verifier(config.coordinator_public_key)
        self.outbox = Outbox(self.state.outbox_path, config.outbox_max_items,
                             config.outbox_max_bytes, writer=outbox_writer)
        #: Predictions on live windows (a null object unless ``predict.enabled``): its own thread,
        #: fed without blocking from the sensor loop, given each accepted global model and each
        #: round's local model (docs/predictions.md).
        self.predictor = make_predictor(config, self.state.path, transport, source)
        #: Subscribes to the model topic only while a model is wanted: one per round started.
        self.feed = ModelFeed(transport, self.topics.model, config.model_fetch_timeout_s, clock)
        self._lock = threading.RLock()
        self._send_lock = threading.RLock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: Dict[str, threading.Thread] = {}
        self._started = False
        self._shut_down = False
        self._restored = False
        self._previous_on_message = None
        #: Another board with this device id: the broker's take-over cycle, and the back-off.
        self.takeover = TakeoverWatch(self.device_id, config.duplicate_id_short_connection_s,
                                      config.duplicate_id_connections, config.duplicate_id_window_s,
                                      config.duplicate_id_backoff_max_s)
        #: One WARNING while the coordinator is silent, one line when it is back.
        self.coordinator_watch = CoordinatorWatch(config.coordinator_silence_warn_s, config.fleet,
                                                  clock(), config.round_interval_s)
        #: Guards the two watches: fed from the transport's thread, checked from ``run``'s.
        self._watch_lock = threading.Lock()
        self._counts = {"rounds": 0, "updates_sent": 0, "updates_queued": 0, "round_errors": 0,
                        "diverged_rounds": 0,
                        "windows": 0, "models_received": 0, "commands_received": 0,
                        "unexpected_messages": 0, "telemetry_sent": 0, "checkpoints": 0,
                        "checkpoint_errors": 0, "connects": 0, "coordinator_silences": 0,
                        "control_commands": 0, "control_refused": 0, "control_reply_failures": 0,
                        UNSIGNED: 0, BAD_SIGNATURE: 0}

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Resume from the checkpoint, connect, and start the sensor and training threads."""
        if self._started:
            return
        self._started = True
        self.log_ring.install()
        self.predictor.start()  # first: a socket it cannot serve stops the start before anything runs
        self.dvfs.start()
        self._seed_clock_timings()
        self._resume()
        if self._restored and self.core.rounds > 0:  # this board's own model (predict.model: local)
            self.predictor.set_model(self.core.base_version, model_to_arrays(self.core.model),
                                     "local", self.core.rounds - 1)
        t = self.transport
        # Topics the daemon does not own (e.g. an MQTT sensor source's) go to the handler installed
        # before it.
        self._previous_on_message = t.on_message
        t.on_message = self._on_message
        t.on_connect = self._on_connect
        t.on_disconnect = self._on_disconnect
        t.set_will(self.status_topic, encode(Offline(self.device_id, reason="lost")), qos=1,
                   retain=True)
        # The transport re-establishes registered subscriptions on every (re)connect. The model
        # topic is held by the feed: subscribed now only if no model is held.
        t.subscribe(self.command_topic, qos=1)
        # The coordinator's retained status (readable by every device under the shipped ACL):
        # whether it is online, for the warning that it is silent (agent/coordinator_watch.py).
        t.subscribe(self.topics.coordinator_status, qos=1)
        # A persistent session may still hold the model topic from a run before this one (or
        # from an older agent that stayed subscribed): drop it unless a model is wanted now.
        t.unsubscribe(self.topics.model)
        with self._lock:
            wants = self.core.wants_model()
        self.feed.want(wants)
        t.connect()
        for name, target in (("sensor", self._sensor_loop), ("train", self._train_loop)):
            thread = threading.Thread(target=target, name="streamfl-%s" % name, daemon=True)
            self._threads[name] = thread
            thread.start()
        log.info("agent %s started (fleet %s, model %s, state %s)", self.device_id,
                 self.config.fleet, self.core.arch_id, self.state.path)
        self.notifier.ready("paused by the operator ('streamfl operator resume' resumes it)"
                            if self.control.paused else "waiting for data and a global model")

    def run(self) -> None:
        """Start, then ping the watchdog and send telemetry until ``stop()``; then shut down."""
        self.start()
        tick_s = 1.0
        if self.notifier.watchdog_interval_s:
            tick_s = min(tick_s, self.notifier.watchdog_interval_s)
        next_telemetry = next_report = self._clock()
        model_wait = ModelWait(self.config.model_wait_warn_s, self.topics.model, self.config.fleet,
                               next_telemetry)
        try:
            while not self._stop.is_set():
                now = self._clock()
                model_wait.check(self._counts["models_received"], now, waiting=self.feed.subscribed)
                self._check_watches(now)
                # A device told to skip still reports to a scheduler once per round interval.
                report_due = self.core.skipping and now >= next_report
                if (self.config.telemetry_interval_s > 0 and now >= next_telemetry) or report_due:
                    next_telemetry = now + self.config.telemetry_interval_s
                    next_report = now + self.config.round_interval_s
                    self.send_telemetry()
                if self._threads["train"].is_alive():
                    self.notifier.watchdog()
                self.outbox.reap()
                self._stop.wait(tick_s)
        finally:
            self.shutdown()

    def stop(self) -> None:
        """Ask every thread to finish; safe from a signal handler and from any thread."""
        self._stop.set()
        self._wake.set()
        try:
            self.source.close()
        except Exception as exc:  # a sensor that fails to close must not block shutdown
            log.warning("closing the sensor source failed: %s", exc)

    def shutdown(self) -> None:
        """Stop threads, announce the clean exit (retained Offline), close MQTT, final checkpoint."""
        if self._shut_down:
            return
        self._shut_down = True
        self.notifier.stopping()
        self.stop()
        train = self._threads.get("train")
        if train is not None:
            train.join(STOP_TIMEOUT_S)
        if not self.dvfs.close():       # clocks back first: nothing below may skip it
            log.error("clocks not fully restored; run 'streamfl-agent dvfs restore'")
        sensor = self._threads.get("sensor")
        if sensor is not None:
            sensor.join(5.0)
        self.predictor.stop()
        if self.transport.connected:
            self.transport.publish(self.status_topic,
                                   encode(Offline(self.device_id, reason="shutdown")),
                                   qos=1, retain=True)
        self.transport.close()           # waits a while for outstanding acknowledgements
        self.outbox.reap()               # frames still unacknowledged are sent again next start
        if train is not None and train.is_alive():
            log.error("a training round did not finish within %.0f s; no final checkpoint",
                      STOP_TIMEOUT_S)
        elif self.core.rounds > 0 or self._restored:
            self.checkpoint()
        log.info("agent %s stopped after %d round(s)", self.device_id, self.core.rounds)
        self.log_ring.remove()

    def _seed_clock_timings(self) -> None:
        """Hand the policy a probe profile's timings per level, so clp-aware judges its first steps
        on measurements rather than stepping up to take them."""
        timings = self.dvfs.probe_timings(self.core.arch_id, self.config.batch_size)
        for (domain, level), seconds in sorted(timings.items()):
            self.core.observe_clocks({domain: level}, seconds)
        if timings:
            log.info("clock policy seeded with %d probe timings", len(timings))

    def _resume(self) -> None:
        found = self.state.load_checkpoint(self.core.arch_id)
        if found is None:
            return
        arrays, meta = found
        if meta.get("device_id") not in (None, self.device_id):
            log.warning("checkpoint was written by device %s; continuing from it as %s",
                        meta.get("device_id"), self.device_id)
        try:
            self.core.restore(arrays, meta)
        except StreamflError as exc:
            log.warning("ignoring unusable checkpoint: %s", exc)
            return
        self._restored = True
        log.info("resumed from checkpoint: round %d, global model v%d", self.core.rounds,
                 self.core.base_version)

    # ---- threads ------------------------------------------------------------------------------

    def _sensor_loop(self) -> None:
        min_buffer = self.config.min_buffer
        try:
            for window in self.source.windows():
                with self._lock:
                    stored = self.core.add_window(window)
                    filled = len(self.core.buffer)
                self._counts["windows"] += 1
                self.predictor.offer(window)
                if stored and filled == min_buffer:
                    self._wake.set()
                if self._stop.is_set():
                    return
        except SensorError as exc:
            log.error("sensor source failed: %s; training continues on the buffered windows", exc)
            return
        except Exception:
            log.exception("sensor source crashed; training continues on the buffered windows")
            return
        if not self._stop.is_set():
            log.warning("sensor source ended after %d windows; training continues on the buffer",
                        self._counts["windows"])

    def _train_loop(self) -> None:
        next_start: Optional[float] = None
        while not self._stop.is_set():
            interval_s = self.config.round_interval_s  # ``streamfl operator set`` may change it
            now = self._clock()
            paused = self.control.paused
            if paused and self.dvfs.changed:  # between rounds: a paused board is not left throttled
                self.dvfs.relax()
            with self._lock:
                ready = not paused and self.core.ready(now)
                due = ready and (self.core.train_requested or next_start is None or now >= next_start)
                start = due and self.core.round_opportunity(now)  # the methods may decline it
                if start:
                    self.core.take_train_request()
                wants = self.core.wants_model()
            self.feed.want(wants)
            if start:
                next_start = now + interval_s
                self.feed.fetch(self._stop.is_set)  # the newest model, outside the core's lock
                self._round()
                continue
            # Not ready, or a method declined the round: ask again shortly.
            wait_s = 0.2 if not ready or due else min(0.2, max(0.0, next_start - now))
            self._wake.wait(wait_s)
            self._wake.clear()

    def _round(self) -> None:
        try:
            with self._lock:
                self.feed.round_began()
                plan = self.core.begin_round()
                clock_plan = self.core.frequency_plan(self.dvfs.views())
            levels = self.dvfs.apply(clock_plan)
            t0 = self._clock()
            self.dvfs.training = True
            try:
                update = self.core.finish_round(plan, lock=self._lock, should_stop=self._stop.is_set)
                seconds_per_sample = update.seconds_per_sample
                slowdown = self.dvfs.slowdown()       # > 1 only for emulated (demo) clocks
                if slowdown > 1.0:
                    self._stop.wait(seconds_per_sample * update.num_samples * (slowdown - 1))
                    seconds_per_sample *= slowdown
            finally:
                self.dvfs.training = False
            update = self.core.complete_round(update, RoundMeasurement(
                clock_levels=levels, seconds_per_sample=seconds_per_sample,
                energy_j=self.dvfs.joules(t0, self._clock())))
            frame = encode_update(update, self.config.update_encoding, plan.start_tensors,
                                  self.core.global_model)
        except RoundInterrupted as exc:
            log.info("round interrupted: %s", exc)
            return
        except DivergedError as exc:
            # The core logged it (once, with its cause) and holds the next round until a new
            # global model comes (agent/divergence.py); the service status shows it meanwhile.
            self._counts["diverged_rounds"] += 1
            log.debug("%s", exc)
            self.notifier.status("training diverges (%d rounds): %s" % (
                self.core.divergence.streak, exc))
            return
        except StreamflError as exc:
            self._counts["round_errors"] += 1
            log.error("training round failed: %s", exc)
            return
        except Exception:
            self._counts["round_errors"] += 1
            log.exception("training round failed")
            self._stop.wait(max(1.0, self.config.round_interval_s))
            return
        self._counts["rounds"] += 1
        self.predictor.set_model(update.base_version, update.tensors, "local", update.round_index)
        self.send_update(frame)
        every = self.config.checkpoint_every_rounds
        if every and self.core.rounds % every == 0:
            self.checkpoint()
        self.notifier.status("round %d from global v%d, buffer %d/%d, outbox %d" % (
            self.core.rounds, self.core.base_version, len(self.core.buffer),
            self.core.buffer.capacity, len(self.outbox)))

    # ---- sending ------------------------------------------------------------------------------

    def send_update(self, frame: bytes) -> None:
        """Publish an encoded Update (QoS 1), or queue it in the outbox while the broker is away.

        Frames go through the outbox whenever it is not empty, so updates leave in creation order.
        While the broker is up, an update goes straight to the transport and is not written to
        disk first: a crash before its PUBACK loses that one update, which the next round
        replaces, whereas writing every 0.3 to 2 MB update to an SD card each round wears it out.
        """
        with self._send_lock:
            if self.transport.connected and len(self.outbox) == 0:
                if self.transport.publish(self.update_topic, frame, qos=1):
                    self._counts["updates_sent"] += 1
                    return
            self.outbox.put(frame)
            self._counts["updates_queued"] += 1
            log.info("broker unreachable: update queued (%d in the outbox)", len(self.outbox))
            if self.transport.connected:
                self._flush_outbox()

    def _flush_outbox(self) -> None:
        with self._send_lock:
            if len(self.outbox) == 0:
                return
            sent = self.outbox.drain(
                lambda f: self.transport.publish_tracked(self.update_topic, f, qos=1))
            self._counts["updates_sent"] += sent

    def send_telemetry(self) -> bool:
        """Best-effort (QoS 0) health report, with the plug-ins' reports; skipped while offline."""
        if not self.transport.connected:
            return False
        board = self.dvfs.telemetry()
        disk = state_disk(self.state.path)
        with self._lock:
            tel = Telemetry(device_id=self.device_id, time_s=float(self._wall_clock()),
                            buffer_fill=len(self.core.buffer),
                            buffer_capacity=self.core.buffer.capacity, rounds=self.core.rounds,
                            extras=self.core.report_extras(self._clock()),
                            **self.core.divergence.status(), **board,
                            duplicate_id_takeovers=self.takeover.takeovers,
                            paused=self.control.paused,
                            **disk,
                            **self.predictor.telemetry(self._clock()))
        ok = self.transport.publish(self.telemetry_topic, encode(tel), qos=0)
        if ok:
            self._counts["telemetry_sent"] += 1
        return ok

    def checkpoint(self) -> bool:
        """Save the local model to the state directory; a failure is logged, never raised."""
        try:
            arrays, meta = self.core.checkpoint()
            self.state.save_checkpoint(arrays, meta)
        except StorageError as exc:
            self._counts["checkpoint_errors"] += 1
            log.error("checkpoint failed: %s", exc)
            return False
        self._counts["checkpoints"] += 1
        return True

    # ---- transport callbacks ------------------------------------------------------------------

    def _on_connect(self, session_present: bool) -> None:
        self._counts["connects"] += 1
        with self._watch_lock:
            self.takeover.connected(self._clock())
        with self._lock:
            hello = self.core.hello()
        self.transport.publish(self.status_topic, encode(hello), qos=1, retain=True)
        log.info("connected to the broker (session %s)", "resumed" if session_present else "new")
        self._flush_outbox()

    def _on_disconnect(self, reason: str) -> None:
        if self._stop.is_set():
            log.info("disconnected from the broker")
            return
        with self._watch_lock:
            delay_s = self.takeover.dropped(self._clock())
        # 0 puts the transport's own reconnect delays back; applies to the reconnect that follows.
        self.transport.delay_reconnect(delay_s)
        if delay_s > 0:
            self.notifier.status("another board seems to use device id %s: reconnecting in %.0f s "
                                 "(%d take-overs)" % (self.device_id, delay_s,
                                                      self.takeover.takeovers))
        log.warning("lost the broker connection (%s); updates go to the outbox", reason)

    def _on_message(self, topic: str, payload: bytes) -> None:
        if topic == self.topics.coordinator_status:
            self._on_coordinator_status(payload)
            return
        if topic != self.topics.model and topic != self.command_topic:
            if self._previous_on_message is not None:
                self._previous_on_message(topic, payload)
            else:
                self._counts["unexpected_messages"] += 1
            return
        try:
            frame = self.verifier.open(topic, payload)
        except ProtocolError as exc:  # unsigned or forged: never decoded, never obeyed
            self._counts[exc.reason] += 1
            if self._counts[exc.reason] & (self._counts[exc.reason] - 1) == 0:  # 1st, 2nd, 4th, ...
                log.warning("dropped a frame on %s: %s (%d so far)", topic, exc, self._counts[exc.reason])
            return
        msg = self.decoder.try_decode(frame, source=topic)
        if msg is None:
            return
        if topic == self.topics.model and isinstance(msg, GlobalModel):
            self._counts["models_received"] += 1
            with self._lock:
                accepted = self.core.on_global_model(msg)
                wants = self.core.wants_model()
            self.feed.arrived(wants)
            if accepted:
                self.predictor.set_model(msg.version, msg.tensors, "global", run_id=msg.run_id)
                with self._watch_lock:  # a model newer than the one held: the coordinator is up
                    self.coordinator_watch.heard(self._clock(), "global model v%d" % msg.version)
        elif topic == self.command_topic and isinstance(msg, Command):
            self._counts["commands_received"] += 1
            if msg.kind in FLEET_CONTROL_KINDS:
                accepted = self._control_command(msg)
            else:
                with self._lock:
                    accepted = self.core.on_command(msg)
            if accepted:
                with self._watch_lock:
                    self.coordinator_watch.heard(self._clock(), "a %r command" % msg.kind)
        else:
            self._counts["unexpected_messages"] += 1
            log.warning("ignoring %s on %s", type(msg).__name__, topic)
            return
        if accepted:
            self._wake.set()

    def _control_command(self, cmd: Command) -> bool:
        """A fleet-control command (``agent/fleet_control.py``), checked like every command (run,
        replay), done, and answered on the reply topic with the command's stamp (QoS 1)."""
        with self._lock:
            if not self.core.gate.command_ok(cmd):
                return False
        reply, changed = self.control.handle(cmd, self.device_id,
                                             encoded_size=lambda r: len(encode(r)))
        self._counts["control_commands"] += 1
        if not reply.ok:
            self._counts["control_refused"] += 1
        if changed:
            config = self.control.config
            with self._lock:
                self.config = self.core.config = config
                self.core.orders.round_interval_s = config.round_interval_s
        if cmd.kind in ("pause", "resume") and reply.ok:
            self.notifier.status("paused by the operator ('streamfl operator resume' resumes it)"
                                 if self.control.paused else "resumed by the operator")
        if not self.transport.publish(self.reply_topic, encode(reply), qos=1):
            self._counts["control_reply_failures"] += 1
            log.warning("could not answer the %s command (broker unreachable)", cmd.kind)
        return True

    def _on_coordinator_status(self, payload: bytes) -> None:
        """The coordinator's retained status: online or offline, for ``CoordinatorWatch`` only
        (unsigned and believed for nothing else: it changes what the agent logs, never what it
        does)."""
        msg = self.decoder.try_decode(payload, source=self.topics.coordinator_status)
        if not isinstance(msg, CoordinatorStatus):
            return
        with self._watch_lock:
            self.coordinator_watch.status(msg.online, msg.instance[:64], msg.run_id, self._clock())

    def _check_watches(self, now: float) -> None:
        """The coordinator's silence (one WARNING) and the end of a take-over back-off."""
        with self._watch_lock:
            if self.takeover.check(now):
                self.transport.delay_reconnect(0.0)
            due = self.coordinator_watch.check(now, self._doing)
        if due:
            self._counts["coordinator_silences"] += 1

    def _doing(self) -> str:
        """What the agent does while the coordinator is silent, for its warning."""
        gm = self.core.global_model
        if gm is None:
            trains = "waits for a first global model (it trains only from one)"
        else:
            trains = "keeps training from v%d of run %s" % (gm.version, gm.run_id or "(unnamed)")
        if self.transport.connected:
            where = "its updates wait in the broker for the coordinator"
        else:
            where = "its updates wait in its outbox (%d queued) while the broker is unreachable " \
                    "too" % len(self.outbox)
        return "%s; %s" % (trains, where)

    # ---- introspection ------------------------------------------------------------------------

    @property
    def counters(self) -> Dict[str, int]:
        """Rounds, updates sent/queued, outbox drops, rejected frames and the like."""
        return dict(self._counts, outbox_len=len(self.outbox), outbox_in_flight=self.outbox.in_flight,
                    outbox_dropped=self.outbox.counters["dropped"],
                    outbox_write_errors=self.outbox.counters["write_errors"],
                    rejected_frames=sum(self.decoder.rejected.values()),
                    run_resyncs=self.core.gate.resyncs,
                    rejected_commands=self.core.gate.rejected_commands,
                    unnamed_models=self.core.gate.unnamed_models,
                    run_alternations=self.core.gate.run_alternations,
                    buffer_fill=len(self.core.buffer), dvfs_errors=self.dvfs.errors,
                    duplicate_id_takeovers=self.takeover.takeovers,
                    **{"model_" + k: v for k, v in self.feed.counters.items()})
