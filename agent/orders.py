"""What the coordinator's ``skip`` and ``train`` commands ask of this device: the state that decides
whether a round may start, kept apart from the learner so the rules read in one place.

- ``skip`` n rounds: no round for n round intervals, counted from the first time it is consulted
  (a board that was busy when the command came still skips the whole span); n is bounded by the
  board's ``max_skip_rounds``.
- ``train``: cancel any skip and start a round now; with ``rounds`` (a scheduler's "this round
  only") train that many, then skip ``then_skip`` round intervals; with ``version`` hold the round
  until that global model has arrived (a command can overtake the model it was sent after).
"""
import logging
from typing import Any, Mapping, Optional, Tuple

log = logging.getLogger(__name__)


class Orders:
    """The skip and train orders in force on one device."""

    def __init__(self, max_skip_rounds: int, round_interval_s: float):
        self.max_skip_rounds = int(max_skip_rounds)
        self.round_interval_s = float(round_interval_s)
        #: Round intervals still to skip, and when the skip ends (None: not consulted yet).
        self.skip_rounds = 0
        self.skip_until_s: Optional[float] = None
        self._train_requested = False
        #: A "train" command's global version: no round starts from an older model.
        self.train_from_version: Optional[int] = None
        #: Rounds a "train" command still allows before its skip (None: no bound).
        self.train_rounds_left: Optional[int] = None
        self.then_skip = 0

    def skip(self, params: Mapping[str, Any]) -> bool:
        """A ``skip`` command; False (logged) when its ``rounds`` is malformed."""
        try:
            n = int(params.get("rounds", 1))
        except (TypeError, ValueError):
            log.warning("ignoring skip command with bad rounds %r", params.get("rounds"))
            return False
        self.skip_rounds = max(0, min(n, self.max_skip_rounds))
        if n > self.max_skip_rounds:
            log.warning("skip of %d rounds bounded to max_skip_rounds=%d", n, self.skip_rounds)
        self.skip_until_s = None
        log.info("coordinator asks to skip %d round(s)", self.skip_rounds)
        return True

    def train(self, params: Mapping[str, Any]) -> None:
        """A ``train`` command."""
        self.skip_rounds, self.skip_until_s = 0, None
        self._train_requested = True
        self.train_rounds_left, self.then_skip = self._budget(params)
        version = params.get("version")
        self.train_from_version = version if type(version) is int and version >= 0 else None
        log.info("coordinator asks to train now")

    def _budget(self, params: Mapping[str, Any]) -> Tuple[Optional[int], int]:
        """``rounds`` and ``then_skip``; (None, 0) when absent or malformed."""
        rounds, then_skip = params.get("rounds"), params.get("then_skip", 0)
        ok = all(type(v) is int for v in (rounds, then_skip)) and rounds >= 1 and then_skip >= 0
        if rounds is not None and not ok:
            log.warning("train command with bad rounds/then_skip %r/%r: training unbounded",
                        rounds, then_skip)
        return (rounds, min(then_skip, self.max_skip_rounds)) if ok else (None, 0)

    def allow(self, now: float, model_version: Optional[int]) -> bool:
        """True when no skip is in force at ``now`` and the commanded model (if any) has arrived;
        ``model_version``: the newest global model's version (None: none yet)."""
        if self.skip_rounds > 0:
            if self.skip_until_s is None:
                self.skip_until_s = now + self.skip_rounds * self.round_interval_s
            if now < self.skip_until_s:
                return False
            self.skip_rounds, self.skip_until_s = 0, None
        if self.train_from_version is not None and model_version is not None \
                and model_version >= self.train_from_version:
            self.train_from_version = None
        return self.train_from_version is None

    def round_started(self) -> None:
        """Count a round against the train command's budget; once spent, its skip begins."""
        if self.train_rounds_left is not None:
            self.train_rounds_left -= 1
            if self.train_rounds_left <= 0:  # the commanded rounds are spent: hold till told
                self.train_rounds_left = None
                self.skip_rounds, self.skip_until_s = self.then_skip, None

    @property
    def skipping(self) -> bool:
        """True while a skip command is in force."""
        return self.skip_rounds > 0

    @property
    def train_requested(self) -> bool:
        """True while a "train" command waits to start a round."""
        return self._train_requested

    def take_train_request(self) -> bool:
        """True once after a "train" command: the runtime may start a round without pacing."""
        requested, self._train_requested = self._train_requested, False
        return requested
