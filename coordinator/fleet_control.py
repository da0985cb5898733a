"""Fleet control on the coordinator: an operator's ``pause``, ``resume``, ``logs`` or ``set``
relayed to boards, their answers collected, one ``CommandReply`` back (sans-I/O: the server sends
and receives, this decides).

An operator command of one of these kinds has passed the ``OperatorGate`` (signature, stamp, rate)
before it gets here. Its targets are the boards named in ``devices`` (a list, or names separated
by commas) or, without it, every board the registry knows. A board the registry says is offline,
or has never seen, is not sent anything and is reported ``offline``; every other target gets one
``Command`` of the same kind on its command topic, signed and stamped like every command the
coordinator sends (its run, a growing ``seq``), and answers with a ``DeviceReply`` on its ``reply``
topic. The operator's answer lists each target as ``answered`` (with the board's answer),
``refused`` (with its reason), ``timed_out`` (no answer within ``wait_s``) or ``offline``, and is
``ok`` only when every target answered.

A board's answer is hostile until bounded: one that is larger than
``protocol.control.MAX_REPLY_BYTES``, not a ``DeviceReply``, from another device than its topic
names, for a command this coordinator did not send that board (``unsolicited``), for one whose
wait is over (``late``), or whose answer does not have its kind's shape (``protocol.control``) is
dropped and counted (``control_reply_<reason>`` in the server's counters). All but the last check
run on the network thread (``expects``), so a board flooding answers nobody asked for never
fills the worker's queue.
"""
import logging
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from streamfl.config import bounded
from streamfl.errors import ProtocolError
from streamfl.logs import RateLimitedLog
from streamfl.protocol.control import check_error, check_result
from streamfl.protocol.messages import FLEET_CONTROL_KINDS, Command, CommandReply, DeviceReply
from streamfl.protocol.topics import NAME_RE

log = logging.getLogger(__name__)

#: Why a board's answer was dropped, each counted as ``control_reply_<reason>``.
DROP_REASONS = ("oversized", "malformed", "wrong_kind", "wrong_device", "unsolicited", "late",
                "duplicate")
#: The states of a target in the operator's answer.
ANSWERED, REFUSED, TIMED_OUT, OFFLINE = "answered", "refused", "timed_out", "offline"
#: Commands whose wait is over, remembered so that their answers are told apart from unsolicited
#: ones (counted ``late`` or ``duplicate``).
CLOSED_MEMORY = 4096
#: A drop reason is warned about at most this often.
WARN_INTERVAL_S = 10.0
#: The parameters each kind hands on to the boards (the rest, ``devices`` and ``wait_s``, are the
#: coordinator's).
BOARD_PARAMS = {"pause": (), "resume": (), "logs": ("lines",), "set": ("name", "value")}


@dataclass(frozen=True)
class FleetControlConfig:
    """How long the coordinator waits for boards' answers, and how many boards one ``logs`` asks.

    wait_s: how long the boards have to answer when the operator's command does not say
      (``streamfl operator`` says: its ``--timeout`` less a margin). 8 s: a board on a slow link
      answers within a second or two; a board that does not answer in 8 s is not listening.
    max_wait_s: the longest wait an operator may ask for (``wait_s`` in the command). 120 s.
    max_log_boards: the most boards one ``logs`` command may ask, so that their answers (each at
      most 64 KiB) fit the operator's answer (1 MiB of header): 12.
    """

    wait_s: float = bounded(8.0, 0.5, 600.0)
    max_wait_s: float = bounded(120.0, 1.0, 600.0)
    max_log_boards: int = bounded(12, 1, 14)


@dataclass
class Operation:
    """One operator command being relayed: its targets and what became of each."""

    command: Command
    deadline: float
    wait_s: float
    #: What each board is sent (``BOARD_PARAMS`` of the kind).
    params: Dict[str, Any] = field(default_factory=dict)
    #: Target -> {"state": ..., "answer"/"reason": ...}; a target without a state is waiting.
    targets: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    #: (device, device command seq) -> device, for the commands sent and not answered yet.
    waiting: Dict[Tuple[str, int], str] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return not self.waiting


def targets_of(params: Mapping[str, Any]) -> Optional[List[str]]:
    """The boards ``devices`` names (None: every known board); ``ValueError`` if it is not a list
    of device names or a comma-separated string of them."""
    raw = params.get("devices")
    if raw is None:
        return None
    if isinstance(raw, str):
        raw = [part.strip() for part in raw.split(",") if part.strip()]
    if not isinstance(raw, list) or not raw or len(raw) > 100000:
        raise ValueError("devices must name at least one board (a list, or names separated by commas)")
    names = []
    for name in raw:
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise ValueError("devices: %r is not a device id" % (name,))
        if name not in names:
            names.append(name)
    return names


class FleetRelay:
    """The fleet-control operations in flight (worker thread) and the answers dropped (any thread
    reads ``counters``)."""

    def __init__(self, config: FleetControlConfig, clock):
        self.config = config
        self.clock = clock
        self.operations: List[Operation] = []
        #: (device, seq) of commands whose wait is over -> "late", or answered -> "duplicate".
        self._closed: "OrderedDict[Tuple[str, int], str]" = OrderedDict()
        self.dropped: Counter = Counter()
        self.accepted = 0
        self._lock = threading.Lock()
        #: (device, seq) of every command waiting for its answer, for ``expects`` (any thread).
        self._expected: set = set()
        self._warnings = RateLimitedLog(log, WARN_INTERVAL_S, clock,
                                        "(%d more board answers dropped as %s since the last warning)")

    # ---- the operator's side ------------------------------------------------------------------
    def begin(self, command: Command, devices: Mapping[str, Any], now: float
              ) -> Tuple[Optional[Operation], List[Tuple[str, Command]], str]:
        """``(operation, [(device, command to send)], error)``: the commands to send each online
        target, or an error (then no operation) for parameters that make no sense."""
        params = command.params
        try:
            named = targets_of(params)
            board_params = self._board_params(command.kind, params)
            wait_s = params.get("wait_s", self.config.wait_s)
            if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or not wait_s > 0:
                raise ValueError("wait_s must be a number of seconds > 0, got %r" % (wait_s,))
        except ValueError as exc:
            return None, [], str(exc)
        wait_s = min(max(float(wait_s), 0.5), self.config.max_wait_s)
        targets = sorted(devices) if named is None else named
        if command.kind == "logs" and len(targets) > self.config.max_log_boards:
            return None, [], ("logs asks at most %d boards at a time (fleet_control.max_log_boards), "
                              "not %d: name them with --devices" % (self.config.max_log_boards,
                                                                    len(targets)))
        op = Operation(command=command, deadline=now + wait_s, wait_s=wait_s, params=board_params)
        sends = []
        for device_id in targets:
            info = devices.get(device_id)
            if info is None:
                op.targets[device_id] = {"state": OFFLINE, "reason": "never seen by this coordinator"}
            elif not getattr(info, "online", False):
                reason = getattr(info, "offline_reason", "") or "offline"
                op.targets[device_id] = {"state": OFFLINE, "reason": "offline (%s): not sent" % reason}
            else:
                op.targets[device_id] = {}
                sends.append((device_id, Command(kind=command.kind, params=dict(board_params))))
        self.operations.append(op)
        return op, sends, ""

    @staticmethod
    def _board_params(kind: str, params: Mapping[str, Any]) -> Dict[str, Any]:
        if kind not in FLEET_CONTROL_KINDS:
            raise ValueError("%r is not a fleet-control command" % kind)
        out = {key: params[key] for key in BOARD_PARAMS[kind] if key in params}
        if kind == "set" and not isinstance(out.get("name"), str):
            raise ValueError("set needs name (the setting) and value (a number, or null for the "
                             "board's configured value)")
        if kind == "set" and "value" not in out:
            raise ValueError("set needs value (a number, or null for the board's configured value)")
        return out

    def expect(self, op: Operation, device_id: str, seq: int) -> None:
        """The command to ``device_id`` is stamped ``seq`` and about to go out (its answer may
        come before the publish returns)."""
        op.waiting[(device_id, seq)] = device_id
        with self._lock:
            self._expected.add((device_id, seq))

    def not_sent(self, op: Operation, device_id: str, seq: Optional[int]) -> None:
        """The command to ``device_id`` could not be sent (the broker is unreachable)."""
        if seq is not None:
            op.waiting.pop((device_id, seq), None)
            with self._lock:
                self._expected.discard((device_id, seq))
        op.targets[device_id] = {"state": TIMED_OUT, "reason": "not sent: the broker is unreachable"}

    def expects(self, reply: DeviceReply) -> bool:
        """True if ``reply`` answers a command still waiting (network thread: what is not
        expected is dropped there and counted, and never queued for the worker)."""
        key = (reply.device_id, reply.seq)
        with self._lock:
            if key in self._expected:
                return True
            closed = self._closed.get(key)
        self.drop(closed or "unsolicited", "answer of %s to %s command %d dropped: %s" % (
            reply.device_id, reply.kind, reply.seq,
            {"late": "it came after the wait was over", "duplicate": "it was answered already"}
            .get(closed or "", "this coordinator sent it no such command")))
        return False

    # ---- the boards' side ---------------------------------------------------------------------
    def drop(self, reason: str, message: str) -> None:
        """Count (and warn about, rate-limited) a board's answer dropped as ``reason``."""
        with self._lock:
            self.dropped[reason] += 1
        self._warnings.event(reason, logging.WARNING, "%s", message)

    def on_reply(self, reply: DeviceReply) -> None:
        """A board's answer, already checked against its topic (worker thread)."""
        key = (reply.device_id, reply.seq)
        op = next((o for o in self.operations if key in o.waiting), None)
        if op is None:  # its wait ended, or it was answered, since ``expects`` said yes
            self.expects(reply)
            return
        if reply.kind != op.command.kind:
            self.drop("unsolicited", "answer of %s to command %d dropped: it names %s, the command "
                                     "was %s" % (reply.device_id, reply.seq, reply.kind, op.command.kind))
            return
        try:
            answer = check_result(reply.kind, reply.result)
            error = check_error(reply.error)
        except ProtocolError as exc:
            self.drop("malformed", "answer of %s to %s dropped: %s" % (reply.device_id, reply.kind,
                                                                       exc.detail or exc.reason))
            return
        del op.waiting[key]
        self._close(key, "duplicate")
        with self._lock:
            self.accepted += 1
        if reply.ok:
            op.targets[reply.device_id] = {"state": ANSWERED, "answer": answer}
        else:
            op.targets[reply.device_id] = {"state": REFUSED, "reason": error or "refused"}

    # ---- closing ------------------------------------------------------------------------------
    def finished(self, now: float) -> List[CommandReply]:
        """The operator's answers to every operation now complete or past its wait (removed)."""
        out, keep = [], []
        for op in self.operations:
            if not op.done and now < op.deadline:
                keep.append(op)
                continue
            for key, device_id in op.waiting.items():
                op.targets[device_id] = {"state": TIMED_OUT,
                                         "reason": "no answer within %g s" % op.wait_s}
                self._close(key, "late")
            op.waiting.clear()
            out.append(self._answer(op))
        self.operations = keep
        return out

    def _close(self, key: Tuple[str, int], why: str) -> None:
        with self._lock:
            self._expected.discard(key)
            self._closed[key] = why
            while len(self._closed) > CLOSED_MEMORY:
                self._closed.popitem(last=False)

    @staticmethod
    def _answer(op: Operation) -> CommandReply:
        states = Counter(t["state"] for t in op.targets.values())
        failed = sorted(d for d, t in op.targets.items() if t["state"] != ANSWERED)
        error = ""
        if not op.targets:
            error = "no board to send it to (the registry knows none; name them with --devices)"
        elif failed:
            error = "%d of %d board(s) did not answer: %s" % (
                len(failed), len(op.targets), ", ".join(
                    "%s %s" % (d, op.targets[d]["state"].replace("_", " ")) for d in failed[:10])
                + (", ..." if len(failed) > 10 else ""))
        return CommandReply(kind=op.command.kind, seq=op.command.seq, ok=not error,
                            handled_by=["coordinator"], error=error,
                            result={"devices": dict(sorted(op.targets.items())), "wait_s": op.wait_s,
                                    "states": dict(sorted(states.items())), "params": dict(op.params)})

    def counters(self) -> Dict[str, int]:
        with self._lock:
            out = {"control_reply_" + r: self.dropped.get(r, 0) for r in DROP_REASONS}
            out["control_replies_accepted"] = self.accepted
        return out
