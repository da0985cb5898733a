"""Which operator commands the coordinator obeys: signed by a pinned operator key, fresh, newer than
the last one obeyed, and no more than a few a minute.

An operator's ``Command`` arrives on ``streamfl/v1/{fleet}/coordinator/command`` (``streamfl
operator KIND``). Anyone who can write that topic could otherwise end sessions at will: one
``new-session`` frame replayed once a second kept every honest update of a fleet withheld. So, in
this order, a command is dropped (counted by reason, warned about at most every
``WARN_INTERVAL_S`` per reason) when:

- ``unsigned`` / ``bad_signature``: ``operator.public_keys`` is set and the payload is not signed
  (``protocol/signing.py``'s envelope, over the topic and the frame) by one of those keys. Without
  keys nothing is authenticated: the broker's ACL alone says who may write the topic, and the
  server logs a WARNING at start;
- ``unstamped`` / ``replayed`` / ``stale`` / ``future``: the command's ``seq`` is its stamp, the
  sender's wall clock in microseconds (``streamfl operator`` sets it; the signature covers it). A
  stamp not newer than the last command obeyed (a replay, or an older command overtaken), or
  further than ``max_age_s`` from this coordinator's clock either way, is refused. The last stamp
  obeyed is saved (``operator.json`` in the state folder, before the command is handed on), so a
  restart does not reopen replays; an unreadable file puts the floor at the start time instead
  (only commands sent while the coordinator was down are lost). Without keys this stops replays of
  a captured frame, not a sender that stamps anew;
- ``rate_limited``: more than ``max_per_minute`` commands were obeyed in the last 60 s.

Bounding the harm of the commands that pass is the plug-ins' part (the ``sessions`` plug-in's
``min_session_s``).
"""
import json
import logging
import math
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Deque, Dict, Optional, Tuple

from streamfl.config import bounded
from streamfl.errors import ConfigError, ProtocolError
from streamfl.fileio import atomic_write
from streamfl.logs import RateLimitedLog
from streamfl.protocol.messages import Command
from streamfl.protocol.signing import (
    BAD_SIGNATURE, UNSIGNED, FrameVerifier, NullVerifier, make_multi_verifier, parse_public_key,
)

log = logging.getLogger(__name__)

#: The state folder's file with the last stamp obeyed.
STAMP_FILE = "operator.json"
#: A drop reason is warned about at most this often; the repeats go to DEBUG and are counted.
WARN_INTERVAL_S = 10.0
#: Why a command was dropped, each counted as ``operator_<reason>`` in the server's counters.
DROP_REASONS = (UNSIGNED, BAD_SIGNATURE, "unstamped", "replayed", "stale", "future", "rate_limited")


@dataclass(frozen=True)
class OperatorConfig:
    """Who may command the coordinator on its command topic, how fresh and how often.

    public_keys: the operators' Ed25519 public keys (``ed25519:<base64>``, the ``.pub`` file of
      ``streamfl-coordinator keygen --name operator``); with any set, only commands signed by one
      of them (``streamfl operator --signing-key-file``) are obeyed. Empty: the broker's ACL alone
      protects the topic (the shipped one lets only the ``operator`` and ``coordinator`` accounts
      write it), and the coordinator says so at start.
    max_per_minute: commands obeyed per 60 s; the excess is dropped and counted. 6: an operator
      types a command every ten seconds at most, and a script or an attacker looping is cut to that.
    max_age_s: how far a command's stamp may be from the coordinator's clock, either way. 300 s:
      room for clocks a little apart and for a command the broker kept while the coordinator
      restarted, short enough that a captured command is worthless after five minutes.
    """

    public_keys: Tuple[str, ...] = ()
    max_per_minute: int = bounded(6, 1, 3600)
    max_age_s: float = bounded(300.0, 1.0, 86400.0)

    def __post_init__(self) -> None:
        for i, key in enumerate(self.public_keys):
            try:
                parse_public_key(key, what="operator.public_keys[%d]" % i)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        if not 1 <= self.max_per_minute <= 3600:
            raise ValueError("operator.max_per_minute must be in 1..3600, got %r" % (self.max_per_minute,))
        if not 1.0 <= self.max_age_s <= 86400.0:  # NaN too
            raise ValueError("operator.max_age_s must be in [1, 86400], got %r" % (self.max_age_s,))

    @property
    def authenticated(self) -> bool:
        return bool(self.public_keys)


class OperatorGate:
    """Verifies, de-duplicates and rate-limits operator commands (called on one thread at a time)."""

    def __init__(self, config: OperatorConfig, stamp_path: Optional[Path],
                 wall_clock: Callable[[], float] = time.time,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.stamp_path = None if stamp_path is None else Path(stamp_path)
        self.wall_clock = wall_clock
        self.clock = clock
        self.verifier: FrameVerifier = (make_multi_verifier(config.public_keys) if config.public_keys
                                        else NullVerifier())
        self.dropped: Counter = Counter()
        self.accepted = 0
        self.last_seq = self._load_stamp()
        self._obeyed_at: Deque[float] = deque()
        self._warnings = RateLimitedLog(log, WARN_INTERVAL_S, self.clock,
                                        "(%d more dropped as %s since the last warning)")
        self._lock = threading.Lock()

    # ---- the two steps the server calls -------------------------------------------------------
    def open(self, topic: str, payload: bytes) -> Optional[bytes]:
        """The frame inside ``payload``, or None (counted, logged) if its signature is refused."""
        try:
            return self.verifier.open(topic, payload)
        except ProtocolError as exc:
            self._drop(exc.reason, "operator command on %s dropped: %s" % (topic, exc.detail or exc.reason))
            return None

    def admit(self, command: Command) -> bool:
        """True if ``command`` is fresh, newer than the last one obeyed and within the rate; the
        stamp is saved before this returns True. Otherwise counted, logged and False."""
        kind, seq = command.kind, command.seq
        if seq <= 0:
            return self._drop("unstamped", "operator command %r dropped: it carries no stamp (send it "
                                           "with 'streamfl operator')" % kind)
        if seq <= self.last_seq:
            return self._drop("replayed", "operator command %r dropped: its stamp %d is not newer than "
                                          "the last command obeyed (%d): a replay" % (kind, seq, self.last_seq))
        age_s = self.wall_clock() - seq / 1e6
        if age_s > self.config.max_age_s:
            return self._drop("stale", "operator command %r dropped: stamped %.0f s ago (at most "
                                       "%g s)" % (kind, age_s, self.config.max_age_s))
        if -age_s > self.config.max_age_s:
            return self._drop("future", "operator command %r dropped: stamped %.0f s in the future "
                                        "(check the clocks)" % (kind, -age_s))
        now = self.clock()
        while self._obeyed_at and now - self._obeyed_at[0] >= 60.0:
            self._obeyed_at.popleft()
        if len(self._obeyed_at) >= self.config.max_per_minute:
            return self._drop("rate_limited", "operator command %r dropped: more than %d a minute"
                                              % (kind, self.config.max_per_minute))
        self._obeyed_at.append(now)
        self.last_seq = seq
        self._save_stamp()
        with self._lock:
            self.accepted += 1
        return True

    def counters(self) -> Dict[str, int]:
        with self._lock:
            out = {"operator_" + reason: self.dropped.get(reason, 0) for reason in DROP_REASONS}
            out["operator_accepted"] = self.accepted
        return out

    # ---- internals ----------------------------------------------------------------------------
    def _drop(self, reason: str, message: str) -> bool:
        with self._lock:
            self.dropped[reason] += 1
        self._warnings.event(reason, logging.WARNING, "%s", message)
        return False

    def _load_stamp(self) -> int:
        if self.stamp_path is None:
            return 0
        try:
            raw = self.stamp_path.read_bytes()
        except FileNotFoundError:
            return 0
        except OSError as exc:
            return self._stamp_floor("cannot read %s: %s" % (self.stamp_path, exc.strerror or exc))
        try:
            seq = json.loads(raw.decode("utf-8"))["last_seq"]
            if type(seq) is not int or seq < 0:
                raise ValueError("last_seq is not a non-negative integer")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            return self._stamp_floor("%s is not an operator stamp file (%s)" % (self.stamp_path, exc))
        return seq

    def _stamp_floor(self, why: str) -> int:
        """No saved stamp to trust: obey only commands stamped from now on (none is replayed; only
        those sent while the coordinator was down are lost)."""
        floor = int(math.floor(self.wall_clock() * 1e6))
        log.warning("%s: operator commands stamped before now are refused", why)
        return floor

    def _save_stamp(self) -> None:
        if self.stamp_path is None:
            return
        try:
            atomic_write(self.stamp_path, json.dumps({"last_seq": self.last_seq}).encode("utf-8"))
        except OSError as exc:  # the command is still obeyed: a full disk must not lock operators out
            log.error("cannot save the operator stamp in %s: %s (a restart could obey a replay of "
                      "this command)", self.stamp_path, exc.strerror or exc)

