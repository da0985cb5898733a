"""The agent's one warning that the coordinator has gone silent, and one line when it is back.

While the coordinator is down a board keeps training from the model it holds, and its updates
wait (in the broker's session of the coordinator, or in the agent's outbox while the broker is
away too): nothing is lost, but nothing it sends is used yet, and without a word the operator
looking at a board cannot tell. So the agent counts the seconds since it last *heard* the
coordinator: a new global model accepted, a command, or the coordinator's retained status
(``coordinator/status``, which every device may read under the shipped ACL) turning online. A
retained model or status the broker replays on a subscribe is not hearing it: those stay in the
broker when the coordinator is gone. After ``warn_after_s`` of silence it logs one WARNING that
says what it knows (the status offline since when, the broker connection) and what it does
meanwhile; once the coordinator is heard again, one INFO line. Sans-I/O: the daemon calls it with
its clock.
"""
import logging
from typing import Callable, Optional, Tuple, Union

log = logging.getLogger(__name__)

#: The silence counted never starts before this many round intervals: a board that fetches a
#: model once per round hears the coordinator at most that often.
ROUNDS_OF_SILENCE = 3


class CoordinatorWatch:
    """Seconds since the coordinator was last heard; one WARNING past ``warn_after_s``."""

    def __init__(self, warn_after_s: float, fleet: str, now: float, round_interval_s: float = 0.0):
        #: 0 = never warn; never below ``ROUNDS_OF_SILENCE`` round intervals.
        self.warn_after_s = float(warn_after_s) and max(float(warn_after_s),
                                                        ROUNDS_OF_SILENCE * float(round_interval_s))
        self.fleet = fleet
        #: Warnings logged (one per silence).
        self.warnings = 0
        #: True between the warning and the coordinator's next sign of life.
        self.silent = False
        self._heard_s = now
        self._heard_what = "nothing yet (since the agent started)"
        #: The retained status last seen: (online, coordinator instance, run), and since when.
        self._status: Optional[Tuple[bool, str, str]] = None
        self._status_s: Optional[float] = None
        self._status_reason = ""

    def heard(self, now: float, what: str) -> bool:
        """The coordinator spoke (``what``: "global model v12", "a command"); True when this ends
        a silence that was warned about (and logged so)."""
        silence_s = now - self._heard_s
        self._heard_s, self._heard_what = now, what
        if not self.silent:
            return False
        self.silent = False
        log.info("the coordinator of fleet %r is heard again (%s) after %.0f s of silence",
                 self.fleet, what, silence_s)
        return True

    def status(self, online: bool, instance: str, run_id: str, now: float) -> bool:
        """The coordinator's retained status arrived; a change to online counts as hearing it.
        True when this ended a warned silence."""
        key = (bool(online), instance, run_id)
        changed, self._status = key != self._status, key
        if changed:
            self._status_s = now
        if online and changed:
            return self.heard(now, "its status says online, run %s" % (run_id or "(unnamed)"))
        return False

    def check(self, now: float, doing: Union[str, Callable[[], str]]) -> bool:
        """True when this call logged the warning; ``doing`` says what the agent does meanwhile
        ("keeps training from v12 of run R; its updates wait in the broker"), or is a function
        that says it (called only for the warning)."""
        if self.warn_after_s <= 0 or self.silent or now - self._heard_s < self.warn_after_s:
            return False
        if callable(doing):
            doing = doing()
        self.silent = True
        self.warnings += 1
        if self._status is not None and not self._status[0]:
            said = "its retained status says offline (for %.0f s)" % (now - self._status_s)
        elif self._status is None:
            said = "no coordinator status on the broker either"
        else:
            said = "its retained status still says online (a coordinator killed with its " \
                   "connection open, or one that stopped answering)"
        log.warning("nothing heard from the coordinator of fleet %r for %.0f s (last: %s); %s. "
                    "Meanwhile this agent %s. One line follows when it is heard again",
                    self.fleet, now - self._heard_s, self._heard_what, said, doing)
        return True
