"""The coordinator daemon runtime: MQTT in, one worker feeding the core, durable coalesced publishing.

Threads: the transport's network thread only decodes and validates frames (a bad frame is counted
and logged and never reaches the core) and queues them, devices' messages and an operator's
``Command`` on the coordinator's own command topic (for the plug-ins' ``on_operator``) alike; ONE
worker thread feeds ``CoordinatorCore`` and does evaluation and metrics; the publisher thread (``publisher.py``) saves the newest version
durably, signs it and publishes it retained. When aggregations outpace save + send, intermediate
versions are skipped (coalesced): devices always fetch the newest model anyway.

MQTT acknowledges a message once ``on_message`` returns, long before the next save, so the
network thread first writes each valid update's frame (and each device's Hello or Offline, which
admission reads) into the intake journal (``intake.py``: write, fsync, rename); the snapshots name the newest entry the core handled (``intake_seq``), a
durable save drops the entries it covers, and a start hands the core the rest before anything
new: a kill -9 loses no acknowledged update.

The worker also keeps the live fleet table (``fleet.py``): it sees every hello, last will,
telemetry and update fate, asks the methods what to show about once a second, and serves it to
the monitor (``monitor/``: dashboard, ``/metrics``), to ``streamfl operator status`` (answered on
the reply topic, like every operator command) and, at stop, to the run's ``summary.json``.

The state folder's run identity (``run_id``) is made on first use and saved before anything is
published; every global model and command names it, and every command gets a growing ``seq``.

Operator commands pass the ``OperatorGate`` (``operator_gate.py``: pinned operator keys, stamps
newer than the last one obeyed and fresh, a rate) on the network thread before they are queued.
The retained status names this process (run, client id, host, pid, start, a random ``instance``);
the server also reads that topic and steps down when another coordinator of the fleet takes over
(``liveness.py``): it stops without saying offline over the other's status, and
``taken_over_by`` says by whom.
"""
import logging
import os
import queue
import socket
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Callable, Dict, Optional

from streamfl import __version__
from streamfl.coordinator.core import CoordinatorCore, Step
from streamfl.coordinator.evaluation import Evaluator, make_evaluator
from streamfl.coordinator.fleet import FleetTable, method_name, status_result
from streamfl.coordinator.metrics import MetricsWriter
from streamfl.coordinator.admission import admission_counters
from streamfl.coordinator.liveness import (ConnectGate, GatedTransport, beats, describe, new_instance,
                                           yields_on_connect)
from streamfl.coordinator.operator_gate import STAMP_FILE, OperatorGate
from streamfl.coordinator.fleet_control import FleetRelay
from streamfl.coordinator.intake import IntakeJournal
from streamfl.coordinator.persistence import INTAKE_SEQ, Persister, StateStore
from streamfl.coordinator.publisher import DurablePublisher
from streamfl.coordinator.run_record import open_run, run_counters
from streamfl.coordinator.run_summary import run_summary, summary_lines, write_summary
from streamfl.models import tensor_spec
from streamfl.errors import ProtocolError
from streamfl.protocol.codec import REASONS, Decoder, encode
from streamfl.protocol.control import MAX_REPLY_BYTES
from streamfl.protocol.messages import (FLEET_CONTROL_KINDS, Command, CommandReply, CoordinatorStatus,
                                       DeviceReply, Hello, Offline, Telemetry, Update)
from streamfl.protocol.signing import make_signer
from streamfl.protocol.topics import Topics
from streamfl.protocol.transport.base import Transport

log = logging.getLogger(__name__)

#: FedAvg deadlines and deferred persistence are checked this often.
TICK_S = 0.5
#: Decoded messages waiting for the worker; a full queue blocks the network thread (back-pressure).
QUEUE_MAX = 256
#: Which message types may arrive on which device topic kind.
KIND_TYPES = {"status": (Hello, Offline), "update": (Update,), "telemetry": (Telemetry,)}

#: Operator command kinds the coordinator answers itself, before any plug-in.
OWN_COMMANDS = ("status",)

#: What the intake journal holds (``intake.py``): updates, and the device status an update needs
#: to count (a Hello the last save did not hold would leave its updates "unknown device").
JOURNALLED = (Update, Hello, Offline)

_STOP = object()


class _Journalled:
    """A queued message the intake journal holds as entry ``seq`` (``intake.py``)."""

    __slots__ = ("msg", "seq")

    def __init__(self, msg, seq: int):
        self.msg, self.seq = msg, seq

#: Queued by the publisher when it took a snapshot: the worker may offer the next version.
_WAKE = object()


class CoordinatorServer:
    """Runs a ``CoordinatorCore`` behind a ``Transport``; ``run()`` blocks until ``stop()``."""

    def __init__(self, config, transport: Transport, state_dir: Path, run_dir: Optional[Path],
                 clock: Callable[[], float] = time.monotonic, evaluator: Optional[Evaluator] = None):
        self.config = config
        self.transport = transport
        self.clock = clock
        self.topics = Topics(config.fleet)
        #: The run's folder: ``run_dir``, else the one the state folder remembers (``run_record.py``),
        #: set once the state is loaded.
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.store = StateStore(Path(state_dir))
        self.persister = Persister(self.store)
        self.signer = make_signer(config.signing_key_file)
        self.operator_gate = OperatorGate(config.operator, Path(state_dir) / STAMP_FILE)
        #: Fleet control (``fleet_control.py``): operator commands relayed to boards, their answers.
        self.fleet_control = FleetRelay(config.fleet_control, clock)
        #: Boards' answers are decoded apart, against their own bound (``MAX_REPLY_BYTES``).
        self._reply_decoder = Decoder({}, max_frame_bytes=MAX_REPLY_BYTES)
        #: This process among the fleet's coordinators (its status names it).
        self.instance = new_instance()
        self.started_s = time.time()
        #: Closed on each connection until the retained status was read there (``liveness.py``):
        #: the publisher, commands and replies see the transport through it.
        self._gate = ConnectGate(self.topics, self.instance)
        self._gated = GatedTransport(transport, self._gate)
        #: The instance of the coordinator this one took over at start ("" for none; the CLI sets it).
        self.took_over = ""
        #: The status of the coordinator that took the fleet over from this one (it then stops).
        self.taken_over_by: Optional[CoordinatorStatus] = None
        self.evaluator = evaluator if evaluator is not None else make_evaluator(config)
        self.method = method_name(config)
        self.fleet = FleetTable(config.fleet_view, config.fleet, self.method, config.strategy,
                                list(config.plugins))
        # Admission's pass over an update checks it for NaN/Inf beside its delta's norm.
        self.decoder = Decoder({config.model.arch_id: tensor_spec(config.model)},
                               max_frame_bytes=config.max_frame_bytes, receiver_checks_finite=(Update,))
        now = clock()
        self._t0 = now
        loaded = self.store.load(config.model)
        if loaded is None:
            self.core = CoordinatorCore(config, now=now, run_id=uuid.uuid4().hex)
            self.store.save(self.core.model, self.core.state())  # the run exists before it is named
            log.info("starting fresh at version 0 (model %s, run %s)", config.model.arch_id, self.core.run_id)
        else:
            tensors, state = loaded
            self.core = CoordinatorCore(config, now=now, tensors=tensors)
            self.core.restore(tensors, state, now, saved_ago_s=self._saved_ago_s())
            covered = state.get(INTAKE_SEQ)
            self.persister.saved_intake_seq = max(0, covered) if isinstance(covered, int) else 0
            if not self.core.run_id:
                self.core.run_id = uuid.uuid4().hex
                self.store.save(self.core.model, dict(self.core.state(),
                                                      **{INTAKE_SEQ: self.persister.saved_intake_seq}))
                log.info("state in %s had no run identity: it is now run %s", self.store.state_dir,
                         self.core.run_id)
            log.info("continuing from %s at version %d (run %s)", self.store.state_dir,
                     self.core.version, self.core.run_id)
        self.persister.saved_version = self.core.version
        # The update journal (intake.py): opened by start(), after the one-coordinator probe; the
        # entries a durable save covers are dropped from the publisher thread.
        self.intake = IntakeJournal(Path(state_dir), config.intake)
        self.persister.on_saved = self.intake.drop_through
        #: The newest journal entry the core handled, and the newest a snapshot offered carried.
        self._handled_seq = self._offered_seq = self.persister.saved_intake_seq
        self._replay: list = []
        self.fleet.run_id = self.core.run_id
        # The run's record spans its processes: its folder and time axis, then its earlier lines
        # fed to the fleet table, so the live view and the summary count the whole run.
        self.record = open_run(Path(state_dir), self.core.run_id, run_dir, fresh=loaded is None,
                               wall_now=self.started_s, on_update=self.fleet.on_record,
                               on_eval=self._replay_eval)
        self.run_dir = self.record.run_dir
        self._run_offset_s = self.record.offset_s
        self._resumed_version, self._fresh_run = self.core.version, loaded is None
        self.metrics = MetricsWriter.in_run_dir(self.run_dir, tags={"method": self.method, "seed": config.seed})
        self._implausible_at_start = dict(self.fleet.figures().get("implausible") or {})
        if self.record.earlier:
            log.info("run %s continues in %s: %d earlier process(es), %d of their lines counted, "
                     "times from %.1f s", self.core.run_id, self.run_dir, len(self.record.earlier), self.record.fed,
                     self._run_offset_s)
        self.fleet.served_by(str(self.run_dir.resolve()))
        self.monitor = None
        if config.monitor.enabled:
            from streamfl.coordinator.monitor.http import MonitorServer
            self.monitor = MonitorServer(config.monitor, snapshot=self.fleet.snapshot,
                                         series=self.fleet.series, run_dir=self.run_dir)
            # Its port now, before the broker is touched: a taken one is said, or with
            # monitor.if_port_taken: exit refused (StartupError, exit 2), before any publish.
            self.monitor.bind()
        self._counts: Dict[str, int] = {k: 0 for k in (
            "frames", "bad_topic", "wrong_kind", "topic_mismatch", "publishes", "coalesced",
            "publish_failures", "publish_offline", "publish_not_durable", "evaluations",
            "worker_errors", "commands_sent", "command_failures", "intake_replayed", "intake_duplicates")}
        self._count_lock = threading.Lock()
        self._queue: "queue.Queue" = queue.Queue(maxsize=QUEUE_MAX)
        self.publisher = DurablePublisher(
            self._gated, self.topics.model, self.persister, self.signer, self._count,
            model_encoding=config.model_encoding,
            min_interval_s=max(config.persist_interval_s, config.publish_min_interval_s),
            on_idle=self._wake_worker)
        #: The newest version not yet handed to the publisher.
        self._dirty = True
        self._command_seq = 0
        self._last_eval_version: Optional[int] = None
        self._progress = (time.monotonic(), self.core.version)
        self._accepting = True
        self._started = False
        self._stopped = False
        self._stop_lock = threading.Lock()
        self._stop_requested = threading.Event()
        self._worker = threading.Thread(target=self._work_loop, name="coordinator-worker", daemon=True)

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Register will and subscriptions, start the threads, connect (returns at once)."""
        if self._started:
            return
        self._started = True
        self.transport.on_message = self.on_message
        self.transport.on_connect = self._on_connect
        self.transport.on_disconnect = self._on_disconnect
        self.transport.set_will(self.topics.coordinator_status, self._status(online=False),
                                qos=1, retain=True)
        for kind in ("status", "update", "telemetry", "reply"):
            self.transport.subscribe(self.topics.all_devices(kind), qos=1)
        self.transport.subscribe(self.topics.coordinator_command, qos=1)
        self.transport.subscribe(self.topics.coordinator_status, qos=1)
        self.transport.subscribe(self._gate.echo_topic, qos=1)
        if not self.config.operator.authenticated:
            log.warning("operator commands are not authenticated (no operator.public_keys): whoever "
                        "the broker's ACL lets write %s can send them; they are still stamped against "
                        "replays and limited to %d a minute", self.topics.coordinator_command,
                        self.config.operator.max_per_minute)
        else:
            log.info("operator commands must be signed by one of %d pinned operator key(s)",
                     len(self.config.operator.public_keys))
        # What the last saved state does not cover yet goes to the core before anything new (the
        # worker replays it first): the updates a kill -9 took after their PUBACK.
        self._replay = self.intake.open(self._handled_seq, fresh=self._fresh_run)
        self._offer_snapshot()
        self._refresh_fleet(self.clock())
        if self.monitor is not None:
            try:
                url = self.monitor.start()
            except OSError as exc:  # e.g. an unreadable asset: the fleet comes first
                log.error("the fleet dashboard could not start (%s); the coordinator runs without it", exc)
                url = None
            if url:
                log.info("fleet dashboard at %s (Prometheus metrics at %smetrics)", url, url)
        self._worker.start()
        self.publisher.start()
        self.transport.connect()

    def run(self) -> None:
        """Start, block until ``request_stop()`` or ``stop()``, then shut down cleanly."""
        self.start()
        self._stop_requested.wait()
        self.stop()

    def request_stop(self) -> None:
        """Ask ``run()`` to return (safe from signal handlers and other threads)."""
        self._stop_requested.set()

    def stop(self) -> None:
        """Say offline, disconnect, then handle every message already taken and save the newest state.

        The order loses nothing: MQTT acknowledges a message as soon as it is handed to us, so the
        network keeps feeding the queue until the connection is closed, and the worker drains the
        queue after that; what arrives later waits in the broker for this persistent session. The
        versions made while draining are saved and published by the next start; that save covers
        every update handled, so the intake journal is empty after it.
        """
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
        self._stop_requested.set()
        if self._started and self._gated.connected and self.taken_over_by is None:
            self.transport.publish(self.topics.coordinator_status, self._status(online=False),
                                   qos=1, retain=True)
        self.transport.close()
        self._accepting = False
        if self._started:
            self._queue.put(_STOP)
            self._worker.join()
            self.publisher.stop()
        self.persister.save(self.core.model, self._state(), force=True)  # drops the journal's entries
        self.intake.close()
        if self.monitor is not None:
            self.monitor.stop()
        if self._started:
            self._write_event(self._stop_line(), self.clock())
        self._write_summary()
        self.metrics.close()

    # ---- the run's record (run_record.py) -----------------------------------------------------
    def _replay_eval(self, rec: Dict, t_s: float) -> None:
        """An earlier process's evaluation, for the fleet table's accuracy figures."""
        acc, loss, version = rec.get("accuracy"), rec.get("loss"), rec.get("version")
        if isinstance(acc, (int, float)) and isinstance(version, int) and not isinstance(acc, bool):
            self.fleet.on_eval(version, float(acc), float(loss) if isinstance(loss, (int, float)) else 0.0,
                               t_s)

    def _saved_ago_s(self) -> float:
        """How long ago the state folder was last saved (state.json's modification time; 0 if
        unknown or in the future: a clock set back gives no credit)."""
        try:
            return max(0.0, time.time() - self.store.state_path.stat().st_mtime)
        except OSError:
            return 0.0

    def _ended(self) -> str:
        """How this process ends, in words (its stop line and the summary's ``processes``)."""
        if self.taken_over_by is not None:
            return "stepped down: %s keeps the fleet" % describe(self.taken_over_by)
        return "stopped"

    def _start_line(self) -> Dict:
        line = self.record.start_line(instance=self.instance, software=__version__,
                                      resumed_version=self._resumed_version,
                                      fresh=self._fresh_run)
        line["took_over"] = self.took_over
        return line

    def _own_implausible(self) -> Dict[str, int]:
        """This process's implausible telemetry counts (the update-energy ones, ``energy_j``, come
        back from the update lines the next process replays)."""
        now = self.fleet.figures().get("implausible") or {}
        return {k: n - self._implausible_at_start.get(k, 0) for k, n in now.items()
                if k != "energy_j" and n - self._implausible_at_start.get(k, 0) > 0}

    def _stop_line(self) -> Dict:
        carried = set(self.core.counters) | {"version"}
        return {"event": "process_stop", "run_id": self.core.run_id, "instance": self.instance,
                "pid": os.getpid(), "ended": self._ended(), "version": self.core.version,
                "counters": {k: v for k, v in self.counters().items() if k not in carried},
                "implausible_telemetry": self._own_implausible()}

    def _write_summary(self) -> None:
        """``summary.json`` of the whole run and its readable lines in the log (at stop)."""
        now = self.clock()
        self._refresh_fleet(now)
        t_s = now - self._t0 + self._run_offset_s
        earlier = self.record.earlier
        figures = self.fleet.figures()
        implausible = dict(figures.get("implausible") or {})
        for proc in earlier:  # this process's are in the table already
            for key, n in (proc.get("implausible_telemetry") or {}).items():
                implausible[key] = implausible.get(key, 0) + int(n)
        figures["implausible"] = dict(sorted(implausible.items()))
        procs = list(earlier)
        if self._started:
            start = self._start_line()
            procs.append({"started_t_s": round(self._run_offset_s, 3), "last_t_s": round(t_s, 3),
                          "stopped_t_s": round(t_s, 3), "ended": self._ended(),
                          "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.started_s)),
                          "lines": self.metrics.lines, "counters": self._stop_line()["counters"],
                          **{k: start[k] for k in ("instance", "pid", "host", "software",
                                                   "resumed_version", "previous_ended")}})
        counters = run_counters(self.counters(), earlier, carried=set(self.core.counters))
        summary = run_summary(figures, counters, fleet=self.config.fleet,
                              run_id=self.core.run_id, method=self.method, seed=self.config.seed,
                              started_wall_s=self.record.started_wall_s, duration_s=t_s,
                              processes=procs)
        log.info("coordinator stopped at version %d\n  %s", self.core.version,
                 "\n  ".join(summary_lines(summary)))
        try:
            path = write_summary(self.run_dir, summary)
            log.info("run summary written to %s", path)
        except OSError as exc:
            log.error("cannot write the run summary into %s: %s", self.run_dir, exc)

    def healthy(self) -> bool:
        """True while the worker and publisher threads run (for the systemd watchdog)."""
        return self._worker.is_alive() and self.publisher.alive()

    @property
    def published_version(self) -> Optional[int]:
        return self.publisher.published_version

    def counters(self) -> Dict[str, int]:
        """Core, decoder, server, persistence and metrics counters in one flat dict."""
        with self._count_lock:
            out = dict(self._counts)
        out.update(self.core.counters)
        out["version"] = self.core.version
        out["frames_accepted"] = self.decoder.accepted
        out["frames_rejected"] = sum(self.decoder.rejected.values())
        rejected = dict(self.decoder.rejected)
        for reason in set(REASONS) | set(rejected):
            out["rejected_" + reason] = rejected.get(reason, 0)
        out.update(admission_counters(self.core.admission))
        out["persist_saves"] = self.persister.saves
        out["persist_errors"] = self.persister.errors
        out["metrics_errors"] = self.metrics.errors
        out["queue_depth"] = self._queue.qsize()
        out.update(self.intake.counters())
        out.update(self.operator_gate.counters())
        out.update(self.fleet_control.counters())
        return out

    # ---- network thread -----------------------------------------------------------------------
    def _count(self, key: str, n: int = 1) -> None:
        with self._count_lock:
            self._counts[key] += n

    def on_message(self, topic: str, payload: bytes) -> None:
        """Decode and validate a frame (network thread); queue it for the worker if it is good."""
        if not self._accepting:
            return
        self._count("frames")
        if topic == self.topics.coordinator_command:
            self._on_operator_frame(topic, payload)
            return
        if topic == self.topics.coordinator_status:
            self._on_status_frame(topic, payload)
            return
        if topic == self._gate.echo_topic:
            if self._gate.echo(payload):
                self._go_online("read the retained coordinator status")
            return
        parsed = self.topics.parse_device_topic(topic)
        if parsed is not None and parsed[1] == "reply":
            self._on_device_reply(parsed[0], payload)
            return
        msg = self._device_message(topic, payload)
        if msg is None:
            return
        if isinstance(msg, JOURNALLED):  # journalled before paho acknowledges it (when we return)
            seq = self.intake.append(topic, payload)
            if seq is not None:
                self._queue.put(_Journalled(msg, seq))
                return
        self._queue.put(msg)

    def _device_message(self, topic: str, payload: bytes):
        """A device's frame decoded and checked against its topic (kind, device id), or None
        (counted and logged): the network thread's check, and the journal's replay's."""
        parsed = self.topics.parse_device_topic(topic)
        if parsed is None or parsed[1] not in KIND_TYPES:
            self._count("bad_topic")
            log.warning("ignoring message on unexpected topic %r", topic)
            return None
        device_id, kind = parsed
        msg = self.decoder.try_decode(payload, source=topic)
        if msg is None:
            return None
        if not isinstance(msg, KIND_TYPES[kind]):
            self._count("wrong_kind")
            log.warning("%s message on %s topic %s dropped", type(msg).__name__, kind, topic)
            return None
        if msg.device_id != device_id:
            self._count("topic_mismatch")
            log.warning("message from %r on the topic of device %r dropped", msg.device_id, device_id)
            return None
        return msg

    def _on_device_reply(self, device_id: str, payload: bytes) -> None:
        """A board's answer to a fleet-control command: bounded, decoded and checked against its
        topic here (network thread); matched to the command it answers by the worker."""
        drop = self.fleet_control.drop
        if len(payload) > MAX_REPLY_BYTES:
            drop("oversized", "answer on the reply topic of %s dropped: %d bytes, at most %d"
                 % (device_id, len(payload), MAX_REPLY_BYTES))
            return
        try:
            msg = self._reply_decoder.decode(payload)
        except ProtocolError as exc:
            drop("malformed", "answer on the reply topic of %s dropped: %s" % (device_id, exc))
            return
        if not isinstance(msg, DeviceReply):
            drop("wrong_kind", "%s on the reply topic of %s dropped" % (type(msg).__name__, device_id))
            return
        if msg.device_id != device_id:
            drop("wrong_device", "answer from %r on the reply topic of %r dropped"
                 % (msg.device_id, device_id))
            return
        if self.fleet_control.expects(msg):  # else dropped and counted: a flood never queues
            self._queue.put(msg)

    def _on_operator_frame(self, topic: str, payload: bytes) -> None:
        """An operator's command to the coordinator: queued for ``CoordinatorCore.on_operator`` if
        the ``OperatorGate`` lets it through (signature, stamp, rate)."""
        frame = self.operator_gate.open(topic, payload)
        if frame is None:
            return
        msg = self.decoder.try_decode(frame, source=topic)
        if msg is None:
            return
        if not isinstance(msg, Command):
            self._count("wrong_kind")
            log.warning("%s message on the operator command topic %s dropped", type(msg).__name__, topic)
            return
        if not self.operator_gate.admit(msg):
            return
        log.info("operator command %r received", msg.kind)
        self._queue.put(msg)

    def _on_status_frame(self, topic: str, payload: bytes) -> None:
        """A coordinator status of this fleet (our own echo, or another coordinator's): step down
        if another one took the fleet over (``liveness.beats``), or, read on a connection before
        this one said anything there, if it must yield to it (``liveness.yields_on_connect``)."""
        msg = self.decoder.try_decode(payload, source=topic)
        if not isinstance(msg, CoordinatorStatus) or self.taken_over_by is not None:
            return
        mine = self.status_message(online=True)
        if beats(msg, mine) or (not self._gate.is_open
                                and yields_on_connect(msg, mine, self._gate.reconnect)):
            self._gate.hold()
            self.taken_over_by = msg
            log.error("another coordinator of fleet %s keeps the fleet (%s): this one (run %s) steps "
                      "down", self.config.fleet, describe(msg), self.core.run_id)
            self.request_stop()

    def status_message(self, online: bool) -> CoordinatorStatus:
        """This coordinator's status: online or not, the durable version, and who it is."""
        version = self.persister.saved_version  # durable, so it may be named
        settings = getattr(self.transport, "settings", None)
        return CoordinatorStatus(online=online, version=version if version is not None else 0,
                                 run_id=self.core.run_id,
                                 client_id=str(getattr(settings, "client_id", "") or ""),
                                 host=socket.gethostname(), pid=os.getpid(),
                                 started_s=round(self.started_s, 3), instance=self.instance,
                                 took_over=self.took_over)

    def _status(self, online: bool) -> bytes:
        return encode(self.status_message(online))

    def _on_connect(self, session_present: bool) -> None:
        self.fleet.on_broker(True)  # the fleet view says the coordinator has the broker again
        log.info("connected to the broker (session present: %s)", session_present)
        echo = self._gate.connected()
        if self.taken_over_by is not None:  # stepping down: say nothing over the new coordinator
            self._gate.hold()
            return
        # Nothing is published here until the retained status was read (liveness.py): the echo
        # comes back after it, since the transport subscribed before this callback.
        self.transport.publish(self._gate.echo_topic, echo, qos=1)

    def _go_online(self, why: str) -> None:
        """The gate opened on this connection: say online and (re)publish the newest model."""
        if self.taken_over_by is not None:
            return
        log.info("no other coordinator holds fleet %s (%s): publishing", self.config.fleet, why)
        self.transport.publish(self.topics.coordinator_status, self._status(online=True), qos=1,
                               retain=True)
        self.publisher.republish()  # the broker may have lost the retained model

    def _on_disconnect(self, reason: str) -> None:
        self.fleet.on_broker(False, reason)  # the fleet view says so, rather than a dead fleet
        log.warning("disconnected from the broker: %s", reason)
        self._gate.disconnected()

    # ---- worker thread ------------------------------------------------------------------------
    def _work_loop(self) -> None:
        start = self._start_line()
        self._write_event(start, self.clock())  # the record marks each process's start
        if start.get("rolled_back_updates"):
            log.warning("the last process of run %s ended (%s) after handling %d update(s) into "
                        "versions up to %s that it never saved; this one resumes at version %d "
                        "and applies again what the intake journal holds of them (the record's "
                        "process_start line counts them as rolled_back_updates, counters say "
                        "intake_replayed)",
                        self.core.run_id, start.get("previous_ended"), start["rolled_back_updates"],
                        self.record.record_version, self._resumed_version)
        try:
            self._evaluate(self.clock())
        except Exception:
            self._count("worker_errors")
            log.exception("evaluating the starting model failed")
        self._replay_intake()
        next_tick = time.monotonic() + TICK_S
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, next_tick - time.monotonic()))
            except queue.Empty:
                item = None
            if item is _STOP:
                break
            try:
                now = self.clock()
                if isinstance(item, _Journalled):
                    try:
                        self._handle(item.msg, now)
                    finally:  # handled, whatever came of it: the next save covers its entry
                        self._handled_seq = item.seq
                elif item is not None and item is not _WAKE:
                    self._handle(item, now)
                self._offer_snapshot()
                if time.monotonic() >= next_tick:
                    next_tick = time.monotonic() + TICK_S
                    self._tick(now)
            except Exception:  # a bug must not silently kill the only worker
                self._count("worker_errors")
                log.exception("coordinator worker failed on %s", type(item).__name__)

    def _replay_intake(self) -> None:
        """Hand the core the journalled updates no saved state covers (``start`` found them), in
        journal order, before anything from the broker; counted and said in one line."""
        seqs, self._replay = self._replay, []
        covered = self.intake.covered_at_open
        replayed = statuses = duplicates = skipped = 0
        for seq in seqs:
            entry = self.intake.read(seq)  # None: unreadable, counted and logged there
            msg = self._device_message(*entry) if entry is not None else None
            if not isinstance(msg, JOURNALLED):
                skipped += 1
            else:
                before = self.core.counters["duplicates"]
                try:
                    self._handle(msg, self.clock())
                    self._offer_snapshot()
                except Exception:
                    self._count("worker_errors")
                    log.exception("coordinator worker failed on a journalled %s", type(msg).__name__)
                replayed += isinstance(msg, Update)
                statuses += not isinstance(msg, Update)
                duplicates += self.core.counters["duplicates"] - before
            self._handled_seq = seq
        self._count("intake_replayed", replayed)
        self._count("intake_duplicates", duplicates + covered)
        if seqs or covered:
            log.info("intake journal: %d acknowledged update(s) the saved state did not hold handed to "
                     "the core again (%d of them duplicates), and %d device status message(s); %d "
                     "entr%s skipped as unreadable, %d already in the saved state",
                     replayed, duplicates, statuses, skipped,
                     "y" if skipped == 1 else "ies", covered)

    def _handle(self, msg, now: float) -> None:
        if isinstance(msg, Command):  # only the operator's topic queues one
            self._on_operator(msg, now)
            return
        if isinstance(msg, DeviceReply):  # a board's answer to fleet control
            self.fleet_control.on_reply(msg)
            self._close_control(now)
            return
        if isinstance(msg, (Hello, Offline)) or (isinstance(msg, Telemetry)
                                                 and self.core.registry.greeted(msg.device_id)):
            for event in self.fleet.on_message(msg, now - self._t0):
                self._write_event(event, now)
        self._apply(self.core.on_message(msg, now), now)

    def _on_operator(self, command: Command, now: float) -> None:
        """An operator's command: the coordinator's own kinds (``status``) or the plug-ins'; the
        operator gets a ``CommandReply`` either way, an error for a kind nobody handles."""
        if command.kind in FLEET_CONTROL_KINDS:
            self._relay(command, now)
            return
        if command.kind in OWN_COMMANDS:
            self._refresh_fleet(now)
            rows = command.params.get("rows", 50)
            rows = rows if isinstance(rows, int) and not isinstance(rows, bool) and rows >= 0 else 50
            self._reply(CommandReply(kind=command.kind, seq=command.seq, ok=True, handled_by=["coordinator"],
                                     result=status_result(self.fleet.snapshot(), rows)))
            return
        step = self.core.on_operator(command, now)
        self._apply(step, now)
        handled = list(step.handled_by or ())
        self._reply(CommandReply(
            kind=command.kind, seq=command.seq, ok=bool(handled), handled_by=handled,
            error="" if handled else "no running plug-in handles %r (running: %s)" % (
                command.kind, ", ".join(p.name for p in self.core.plugins) or "none")))

    def _relay(self, command: Command, now: float) -> None:
        """A fleet-control command: one command to each online target (``fleet_control.py``);
        the operator's answer goes once every target answered or the wait is over."""
        op, sends, error = self.fleet_control.begin(command, self.core.devices(), now)
        if op is None:
            self._reply(CommandReply(kind=command.kind, seq=command.seq, ok=False,
                                     handled_by=["coordinator"], error=error))
            return
        for device_id, device_command in sends:
            stamped = []

            def expect(seq: int, device_id: str = device_id) -> None:
                stamped.append(seq)
                self.fleet_control.expect(op, device_id, seq)
            if self._send_command(device_id, device_command, on_stamp=expect) is None:
                self.fleet_control.not_sent(op, device_id, stamped[0] if stamped else None)
        log.info("operator's %s command relayed to %d board(s) (%d not online)", command.kind,
                 len(sends), len(op.targets) - len(sends))
        self._close_control(now)

    def _close_control(self, now: float) -> None:
        """Answer the operator for each fleet-control command now complete or past its wait; the
        run's record keeps what became of each (a ``fleet_control`` line: who was paused when)."""
        for reply in self.fleet_control.finished(now):
            self._reply(reply)
            devices = reply.result.get("devices", {})
            self._write_event({"event": "fleet_control", "kind": reply.kind, "seq": reply.seq,
                               "ok": reply.ok, "params": reply.result.get("params", {}),
                               "devices": {d: t.get("state") for d, t in devices.items()}}, now)

    def _reply(self, reply: CommandReply) -> None:
        """Answer an operator on the reply topic (QoS 1, not retained, signed like commands)."""
        topic = self.topics.coordinator_reply
        frame = self.signer.sign(topic, encode(replace(reply, run_id=self.core.run_id)))
        if not (self._gated.connected and self.transport.publish(topic, frame, qos=1)):
            log.warning("could not answer the operator's %s command (broker unreachable)", reply.kind)

    def _tick(self, now: float) -> None:
        if self.transport.connected and self._gate.overdue(self.config.exclusive.probe_wait_s):
            log.warning("the echo on %s did not come back within %g s (exclusive.probe_wait_s): "
                        "publishing without having read the retained coordinator status (the "
                        "broker's ACL must let this account read and write it)",
                        self._gate.echo_topic, self.config.exclusive.probe_wait_s)
            self._go_online("echo overdue")
        self._apply(self.core.tick(now), now)
        self._close_control(now)
        self._refresh_fleet(now)
        self._log_progress()

    def _refresh_fleet(self, now: float) -> None:
        """Rebuild the fleet view's snapshot, with what each method shows now (worker thread)."""
        states = {}
        for plugin in self.core.plugins:
            try:
                states[plugin.name] = plugin.describe(now)
            except Exception:  # a method's display must never stop the coordinator
                self._count("worker_errors")
                log.exception("%s: describe() failed; its state is not shown", plugin.name)
        self.fleet.refresh(now, now - self._t0, self.core.version, self.core.devices(), states)

    def _write_event(self, event, now: float) -> None:
        event["time_s"] = round(now - self._t0 + self._run_offset_s, 6)  # seconds since the run started
        event["wall_s"] = round(time.time(), 3)
        self.metrics.write(event)

    def _wake_worker(self) -> None:
        try:
            self._queue.put_nowait(_WAKE)
        except queue.Full:  # the worker is busy and offers the next snapshot on its next message
            pass

    def _offer_snapshot(self) -> None:
        """Hand the newest version to the publisher once it took the previous one (worker thread),
        or the same version once journalled updates moved only the state (rejected, buffered: the
        publisher saves it without publishing, and the journal drops their entries)."""
        if (self._dirty or self._handled_seq > self._offered_seq) and self.publisher.wants_snapshot():
            self._dirty = False
            self._offered_seq = self._handled_seq
            self.publisher.offer(self.core.global_model(), self._state())

    def _state(self) -> Dict:
        """The core's state and the newest journal entry it covers (``intake_seq``)."""
        state = self.core.state()
        state[INTAKE_SEQ] = self._handled_seq
        return state

    def _log_progress(self) -> None:
        """Without held-out data nothing else shows a running fleet: versions/s and devices online."""
        started_s, version = self._progress
        elapsed_s = time.monotonic() - started_s
        if self.evaluator is not None or elapsed_s < self.config.progress_interval_s:
            return
        self._progress = (time.monotonic(), self.core.version)
        c = self.core.counters
        log.info("version %d (%.2f versions/s), %d device(s) online, %d updates received, %d rejected",
                 self.core.version, (self.core.version - version) / elapsed_s, len(self.core.online()),
                 c["updates_received"], c["rejected"])

    def _apply(self, step: Step, now: float) -> None:
        """Do the I/O a core step asks for: log its records, publish a new version, send commands."""
        for event in step.records():
            self.fleet.on_record(event, now - self._t0)
            self._write_event(event, now)
        if step.new_version is not None:
            self._after_aggregation(now)
        for addressed in step.commands:
            self._send_command(addressed.device_id, addressed.command)

    def _send_command(self, device_id: str, command: Command,
                      on_stamp: Optional[Callable[[int], None]] = None) -> Optional[int]:
        """Publish a plug-in's (or fleet control's) command on the device's command topic: QoS 1
        (the broker keeps it for a device with a persistent session that is away), never retained
        (a command is for now, not for whoever subscribes next). Its stamp, None if not sent;
        ``on_stamp(seq)`` is called before it is published."""
        topic = self.topics.device(device_id, "command")
        self._command_seq = max(self._command_seq + 1, int(time.time() * 1e6))
        command = replace(command, run_id=self.core.run_id, seq=self._command_seq)
        frame = self.signer.sign(topic, encode(command))
        if on_stamp is not None:
            on_stamp(command.seq)
        if self._gated.connected and self.transport.publish(topic, frame, qos=1):
            self._count("commands_sent")
            log.debug("sent %s command to %s", command.kind, device_id)
            return command.seq
        self._count("command_failures")
        log.warning("could not send the %s command to %s (broker unreachable)", command.kind, device_id)
        return None

    def _after_aggregation(self, now: float) -> None:
        self._dirty = True
        if (self._last_eval_version is None
                or self.core.version - self._last_eval_version >= self.config.eval_every_versions):
            self._evaluate(now)

    def _evaluate(self, now: float) -> None:
        self._last_eval_version = self.core.version
        if self.evaluator is None:
            return
        accuracy, loss = self.evaluator.evaluate(self.core.model)
        self._count("evaluations")
        self.fleet.on_eval(self.core.version, accuracy, loss, now - self._t0)
        log.info("version %d: accuracy %.4f, loss %.4f", self.core.version, accuracy, loss)
        self._write_event({"event": "eval", "version": self.core.version, "accuracy": accuracy,
                           "loss": loss, "updates": self.core.counters["updates_received"],
                           "devices_online": len(self.core.online()),
                           "energy_j": round(self.fleet.energy_j(), 3)}, now)

