"""Which global models and commands an agent follows: versions are compared within one coordinator run.

A bare version number means nothing across runs: a coordinator restarted on an empty state folder
counts from 0 again, and a forged model with version 10^12 would otherwise shut out every real one
for good. So every ``GlobalModel`` names its run (``run_id``, made with the coordinator's state
folder; ``streamfl-coordinator`` always stamps one) and the gate follows:

- a newer version of the run it follows;
- any version of another named run (the coordinator was reset or replaced): a *resync*, after which
  the next round starts from that model (the buffer is kept) and a round still training from the
  previous run's model is dropped (``AgentCore.finish_round``). With a pinned coordinator key only
  a signed model gets here, so only the real coordinator can move a fleet to a new run; without
  keys anyone may, but the real coordinator's next model moves it back the same way, whatever
  version the other run claimed;
- a model of a named run after an unnamed one (``run_id == ""``): a resync too, so a forged
  unnamed model with a huge version holds an agent only until the real coordinator's next model;
- an unnamed model after a named one: *refused* (``UNNAMED``, logged once, counted
  ``unnamed_models``), since no coordinator of this project sends one; ``accept_unnamed_runs``
  (for a coordinator that stamps none) makes it a resync instead;
- within an unnamed run (the simulator, which never names one) plain version order, as before.

Two live coordinators on one fleet (another state folder, same broker) make every agent resync back
and forth. Coming back to a run left less than ``alternation_window_s`` ago is taken for that: one
WARNING names the runs, and the flips between them are then only counted (``run_alternations``)
until none has come for a window. A coordinator moved back after a reset shows the same pattern
once; the message says so.

What the gate cannot tell without keys: a forged model that copies the followed run's identity with
a higher version is "newer" and is followed until that run's versions pass it or the coordinator
starts a new run; only a checkpoint of it is undone at the agent's restart (``AgentCore`` starts
from the real model when its base is ahead of what it follows).

Commands carry ``(run_id, seq)``: one of another run than the followed one, or with a ``seq`` not
above the last accepted, is a replay or a leftover and is dropped. Unstamped commands (``run_id
== ""``) pass, for the simulator and older coordinators; a coordinator with a signing key always
stamps them, and an attacker cannot sign.
"""
import logging
import time
from typing import Any, Callable, Dict, List, Optional

from streamfl.protocol.messages import Command, GlobalModel

log = logging.getLogger(__name__)

#: Outcomes of ``ModelGate.judge``.
NEWER = "newer"
RESYNC = "resync"
STALE = "stale"
UNNAMED = "unnamed"


class ModelGate:
    """The run and version an agent follows, and the newest command sequence number it accepted.

    ``accept_unnamed_runs`` lets an unnamed model replace a named run's; ``alternation_window_s``
    (0 = off) is how recently a run must have been left for a return to it to count as two
    coordinators alternating; ``clock`` dates the run changes (the core's clock).
    """

    def __init__(self, accept_unnamed_runs: bool = False, alternation_window_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.accept_unnamed_runs = accept_unnamed_runs
        self.alternation_window_s = float(alternation_window_s)
        self._clock = clock
        #: The run followed (None: nothing yet; "" an unnamed run).
        self.run_id: Optional[str] = None
        self.version: Optional[int] = None
        self.command_seq = 0
        self.resyncs = 0
        self.rejected_commands = 0
        #: Unnamed models refused while a named run was followed.
        self.unnamed_models = 0
        #: Run changes between runs already known to alternate (reported once, then counted).
        self.run_alternations = 0
        #: When each run was last left (runs left within the alternation window).
        self._left_s: Dict[str, float] = {}
        #: The runs seen alternating in the current episode (empty: none), and its last flip.
        self._alternating: List[str] = []
        self._last_change_s: Optional[float] = None

    def judge(self, gm: GlobalModel) -> str:
        """``NEWER``, ``RESYNC``, ``STALE`` or ``UNNAMED`` (both ignored) for a global model of our
        architecture."""
        if self.run_id is None or gm.run_id == self.run_id:
            return NEWER if self.version is None or gm.version > self.version else STALE
        if not gm.run_id and not self.accept_unnamed_runs:
            return UNNAMED
        return RESYNC

    def refuse_unnamed(self, gm: GlobalModel) -> None:
        """Count an ``UNNAMED`` verdict; the first one is a WARNING, the rest debug lines."""
        self.unnamed_models += 1
        if self.unnamed_models == 1:
            log.warning("ignoring global model v%d without a run identity while following run %s: "
                        "every streamfl-coordinator names its run, so it is forged or a leftover "
                        "(accept_unnamed_runs: true follows such models); further ones are only "
                        "counted (unnamed_models)", gm.version, self.run_id)
        else:
            log.debug("ignoring unnamed global model v%d (%d so far)", gm.version, self.unnamed_models)

    def follow(self, gm: GlobalModel, verdict: str) -> None:
        """Record that ``gm`` is now followed."""
        if verdict == RESYNC:
            self.resyncs += 1
            self._run_changed(self.run_id or "", gm)
            self.command_seq = 0
        self.run_id, self.version = gm.run_id, gm.version

    def _run_changed(self, old: str, gm: GlobalModel) -> None:
        """Log a run change: each one, until a return to a recently left run shows two
        coordinators alternating, which is said once and then counted."""
        now = float(self._clock())
        window = self.alternation_window_s
        if self._last_change_s is not None and now - self._last_change_s > window:
            self._alternating = []  # quiet for a window: the episode is over
        self._last_change_s = now
        self._left_s = {run: t for run, t in self._left_s.items() if now - t <= window}
        left_s = self._left_s.get(gm.run_id) if window > 0 else None
        self._left_s[old] = now
        if self._alternating and old in self._alternating and gm.run_id in self._alternating:
            self.run_alternations += 1
            log.debug("run %s -> %s again (%d alternations)", _name(old), _name(gm.run_id),
                      self.run_alternations)
            return
        if left_s is not None:
            self.run_alternations += 1
            for run in (old, gm.run_id):
                if run not in self._alternating:
                    self._alternating.append(run)
            log.warning("two coordinators seem to publish on this fleet: runs %s alternate (back to "
                        "run %s, left %.0f s ago; or a coordinator was moved back after a reset). "
                        "This agent follows whichever published last: stop one of them (or pin "
                        "coordinator_public_key). Further changes between them are only counted "
                        "(run_alternations)", ", ".join(_name(r) for r in self._alternating),
                        _name(gm.run_id), now - left_s)
            return
        log.warning("the coordinator's run changed (%s -> %s): following its model v%d and "
                    "starting the next round from it (buffer kept)", _name(old), _name(gm.run_id),
                    gm.version)

    def command_ok(self, cmd: Command) -> bool:
        """True if ``cmd`` may be obeyed; a replayed or foreign-run command is counted and dropped."""
        if not cmd.run_id:
            return True
        if self.run_id is not None and self.run_id and cmd.run_id != self.run_id:
            self.rejected_commands += 1
            log.warning("ignoring %s command of coordinator run %s (following run %s)", cmd.kind,
                        cmd.run_id, self.run_id)
            return False
        if cmd.seq <= self.command_seq:
            self.rejected_commands += 1
            log.warning("ignoring replayed %s command (seq %d, already at %d)", cmd.kind, cmd.seq,
                        self.command_seq)
            return False
        self.command_seq = cmd.seq
        return True

    def state(self) -> Dict[str, Any]:
        """What a checkpoint keeps so a restarted agent neither follows an older run's model nor
        obeys a replayed command."""
        return {"run_id": self.run_id, "command_seq": self.command_seq}

    def load_state(self, meta: Dict[str, Any]) -> None:
        """Continue from a checkpoint's ``state()``: its run (a model of another run is then a
        resync) and command sequence; the version comes from the first model received."""
        run_id = meta.get("run_id")
        if isinstance(run_id, str):
            self.run_id = run_id
        seq = meta.get("command_seq")
        if isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0:
            self.command_seq = seq


def _name(run_id: str) -> str:
    """A run id for a log line (the unnamed run shows as such)."""
    return run_id if run_id else "(unnamed)"
