"""Which global models and commands an agent follows: versions are compared within one coordinator run.

A bare version number means nothing across runs: a coordinator restarted on an empty state folder
counts from 0 again, and a forged model with version 10^12 would otherwise shut out every real one
for good. So every ``GlobalModel`` names its run (``run_id``, made with the coordinator's state
folder) and the gate follows:

- a newer version of the run it follows;
- any version of another run (the coordinator was reset or replaced): a *resync*, after which the
  next round starts from that model (the buffer is kept). With a pinned coordinator key only a
  signed model gets here, so only the real coordinator can move a fleet to a new run;
- with ``run_id == ""`` (the simulator, older coordinators) plain version order, as before.

Commands carry ``(run_id, seq)``: one of another run than the followed one, or with a ``seq`` not
above the last accepted, is a replay or a leftover and is dropped. Unstamped commands (``run_id
== ""``) pass, for the simulator and older coordinators; a coordinator with a signing key always
stamps them, and an attacker cannot sign.
"""
import logging
from typing import Any, Dict, Optional

from streamfl.protocol.messages import Command, GlobalModel

log = logging.getLogger(__name__)

#: Outcomes of ``ModelGate.judge``.
NEWER = "newer"
RESYNC = "resync"
STALE = "stale"


class ModelGate:
    """The run and version an agent follows, and the newest command sequence number it accepted."""

    def __init__(self) -> None:
        #: The run followed (None: nothing yet; "" an unnamed run).
        self.run_id: Optional[str] = None
        self.version: Optional[int] = None
        self.command_seq = 0
        self.resyncs = 0
        self.stale_models = 0
        self.rejected_commands = 0

    def judge(self, gm: GlobalModel) -> str:
        """``NEWER``, ``RESYNC`` or ``STALE`` (ignored) for a global model of our architecture."""
        if self.run_id and gm.run_id and gm.run_id != self.run_id:
            return RESYNC
        if self.version is None or gm.version > self.version:
            return NEWER
        return STALE

    def follow(self, gm: GlobalModel, verdict: str) -> None:
        """Record that ``gm`` is now followed."""
        if verdict == RESYNC:
            self.resyncs += 1
            log.warning("the coordinator's run changed (%s -> %s): following its model v%d and "
                        "starting the next round from it (buffer kept)", self.run_id, gm.run_id,
                        gm.version)
            self.command_seq = 0
        self.run_id, self.version = gm.run_id, gm.version

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
