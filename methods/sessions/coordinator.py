"""Sessions of a dynamic device set on the coordinator (session-init paper).

A session runs while the set of online devices stays about the same (``methods/sessions/initializers/
membership.py``); when it changes by more than ``change_fraction``, or an operator sends
``new-session``, the session ends: its final model is saved (``SessionLibrary``; after the first
``pilot_sessions`` their mean is the pilot model) and the next one starts from the model the
``init`` construction builds (``methods/sessions/initializers/``):

- ``previous``: nothing is built; the fleet keeps training the model it has;
- ``average``: the mean of the saved session models;
- ``session-init`` (Algorithm 1): devices train ``aux_rounds`` auxiliary rounds from the pilot
  (the strategy sees none of their updates: the plug-in merges each round itself), which give the
  session's gradient ``g_s = w_aux - w_pilot``; the session then starts from the saved models
  weighted by ``softmax(-kappa ||g_i - g_s||)`` (or, with none saved yet, from where it was).

Where the auxiliary model goes (``aux_model``): ``global`` serves it as the global model, as the
paper's Algorithm 1 does before a session trains, so the fleet's model waits for the auxiliary
rounds; ``beside`` leaves the global model the fleet's own and sends the auxiliary model with it
(``SessionTerms.aux``; a version of the fleet's own model, nothing merged and nothing fenced off,
announces it at once): each board trains one round from it, marks that update (``SessionAux``),
and goes back to the global model, so the fleet keeps training while the gradient is measured.
Admission measures a marked update against the auxiliary model it trained from
(``before_admission``), and only the marked ones of the running round are merged; the rest of
the fleet's updates reach the strategy as at any time. With nothing saved to build from, the
fleet then simply keeps the model it trained meanwhile.

A switch is a new global version with nothing merged; updates trained from a model before it are
withheld from the strategy (under FedAsync they would mix the old session back in; FedAvg drops
them as stale anyway). So every boundary withholds updates for a while (the auxiliary rounds, then
the updates still trained from the old model), and no boundary, an operator's or the membership's,
comes before the session trained its own model for ``min_session_s``: an operator's ``new-session``
inside that time is deferred to its end (logged; several make one), so no stream of commands nor
of devices coming and going withholds more than about ``W / (W + min_session_s)`` of the updates,
``W`` being a boundary's withholding time. Every global model carries the session
(``SessionTerms``), every update record its ``session``, and each boundary and switch is a
``session`` metrics event (a deferred ``new-session`` too).
"""
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar, Deque, Dict, List, Mapping, Optional, Tuple

import numpy as np

from streamfl.config import bounded
from streamfl.coordinator.plugins.base import NOTHING, Aggregation, CoordinatorPlugin, Effects, FleetView, \
    MethodState, Verdict
from streamfl.methods.sessions.initializers import INITS, make_init
from streamfl.methods.sessions.initializers.aux import AuxRound
from streamfl.methods.sessions.initializers.library import SessionLibrary, difference, prefixed, unprefixed
from streamfl.methods.sessions.initializers.membership import Membership
from streamfl.methods.sessions.initializers.weighted import DISTANCES
from streamfl.protocol.extras import Extra
from streamfl.protocol.messages import Command, Tensors, Update
from streamfl.methods.sessions.payloads import MAX_AUX_ROUNDS, SessionAux, SessionTerms

log = logging.getLogger(__name__)

#: The operator command kind that starts a new session at once.
NEW_SESSION = "new-session"

#: Where the auxiliary model goes (``SessionsConfig.aux_model``).
AUX_MODELS = ("global", "beside")

#: Phase changes (``(first version, session, aux_round)``) kept to tell which session an update's
#: base model belonged to: a device more than this many phases behind shows none.
PHASES_KEPT = 16


@dataclass(frozen=True)
class SessionsConfig:
    """Session boundaries and the starting model of each session.

    init: "previous", "average" or "session-init" (the paper's Algorithm 1).
    pilot_sessions: P, sessions whose final models' mean is the pilot (the paper's experiments: 1).
    aux_rounds: V, auxiliary rounds from the pilot per session (the paper: 1).
    max_saved: H, session models kept (oldest dropped first); bounds the state folder's use.
    similarity_sharpness, distance: how sharply the starting model favours the saved sessions
      nearest the new one (kappa of ``softmax(-kappa ||g_i - g_s||)``, eqs. 18-19; 0: their plain
      mean) and whether distances are relative to ||g_s||
      (``methods/sessions/initializers/weighted.py`` says why relative is the default).
    change_fraction: a session ends when the devices gone plus the devices new exceed this share
      of the session's devices. The paper leaves the trigger open; 0.3 ignores one board in ten
      coming and going, and catches a shift change.
    min_session_s: no boundary, an operator's or the membership's, before the session has trained
      its own model (its auxiliary rounds done) for this long; a ``new-session`` before then is
      deferred to it. 60 s: a boundary withholds updates for its auxiliary rounds and about one
      round more, seconds in a fleet of rounds of seconds, so a flood of commands or a flapping
      board can withhold a small share of them at most (a real shift change is not an urgent
      minute), while a fleet that truly changed waits a minute at most.
    settle_s: a change must last this long to count, and devices arriving this soon after a
      session starts join it (boards of a shift leave and arrive over a few seconds).
    silence_s: a device online but unheard for this long counts as gone (0: only Hello and last
      will count). 60 s is twelve of the agent's 5 s telemetry intervals.
    aux_quorum, aux_wait_s: an auxiliary round closes when this share of the devices online at
      its start answered, or after this wait with at least one answer.
    aux_model: "global" serves the auxiliary model as the global model during the auxiliary rounds
      (the paper's Algorithm 1: the fleet's model waits); "beside" sends it beside the fleet's
      global model, which keeps training (each model published during the round then carries the
      auxiliary model too: twice the bytes for that time). The paper runs its auxiliary round
      before the session trains, so it has no fleet model to keep; "global" stays the default so
      that the paper's procedure is what runs unless asked.
    """

    #: Old key names (the paper's symbols) that files may still use.
    RENAMED: ClassVar[Dict[str, str]] = {"kappa": "similarity_sharpness"}

    init: str = "session-init"
    pilot_sessions: int = bounded(1, 1, 1000)
    aux_rounds: int = bounded(1, 1, MAX_AUX_ROUNDS)
    max_saved: int = bounded(8, 1, 1000)
    #: Sharpness of the similarity weights over saved sessions (the paper's kappa, eqs. 18-19).
    similarity_sharpness: float = bounded(10.0, 0.0, 1e4)
    distance: str = "relative"
    change_fraction: float = bounded(0.3, 0.0, 2.0, hi_open=True)
    min_session_s: float = bounded(60.0, 0.0, 1e8)
    settle_s: float = bounded(5.0, 0.0, 86400.0)
    silence_s: float = bounded(60.0, 0.0, 86400.0)
    aux_quorum: float = bounded(1.0, 0.0, 1.0, lo_open=True)
    aux_wait_s: float = bounded(30.0, 0.0, 86400.0)
    aux_model: str = "global"

    def __post_init__(self) -> None:
        if self.init not in INITS:
            raise ValueError("init must be one of %s, got %r" % (", ".join(INITS), self.init))
        if self.aux_model not in AUX_MODELS:
            raise ValueError("aux_model must be one of %s, got %r" % (", ".join(AUX_MODELS), self.aux_model))
        if self.distance not in DISTANCES:
            raise ValueError("distance must be one of %s, got %r" % (", ".join(DISTANCES), self.distance))
        if self.pilot_sessions < 1 or self.max_saved < 1 or not 1 <= self.aux_rounds <= MAX_AUX_ROUNDS:
            raise ValueError("pilot_sessions and max_saved must be >= 1, aux_rounds in 1..%d"
                             % MAX_AUX_ROUNDS)
        if not (self.similarity_sharpness >= 0 and np.isfinite(self.similarity_sharpness)):
            raise ValueError("similarity_sharpness must be finite and >= 0, got %r"
                             % (self.similarity_sharpness,))
        if not 0 <= self.change_fraction < 2:
            raise ValueError("change_fraction must be in [0, 2), got %r" % (self.change_fraction,))
        if not (self.min_session_s >= 0 and self.settle_s >= 0 and self.silence_s >= 0):
            raise ValueError("min_session_s, settle_s and silence_s must be >= 0")
        if not (0 < self.aux_quorum <= 1 and self.aux_wait_s >= 0):
            raise ValueError("aux_quorum must be in (0, 1] and aux_wait_s >= 0")


class SessionsPlugin(CoordinatorPlugin):
    """Ends sessions, runs the auxiliary rounds and switches the fleet to each session's model."""

    name = "sessions"
    Config = SessionsConfig

    def __init__(self, config: SessionsConfig, fleet: FleetView, peers: Mapping[str, CoordinatorPlugin]):
        super().__init__(config, fleet, peers)
        self.init = make_init(config.init, config.similarity_sharpness, config.distance)
        self.library = SessionLibrary(config.pilot_sessions, config.max_saved)
        self.membership = Membership(config.change_fraction, config.min_session_s, config.settle_s)
        #: The running session (-1 until the first device is online).
        self.session = -1
        #: The auxiliary round in progress (1..V), 0 while the session trains its own model.
        self.aux_round = 0
        self.aux: Optional[AuxRound] = None
        #: ``aux_model: beside``: the auxiliary round's model, sent beside the global one.
        self.beside = config.aux_model == "beside"
        self.aux_model: Optional[Tensors] = None
        #: This session's gradient from the pilot, once its auxiliary rounds are done.
        self.gradient: Optional[Tensors] = None
        #: The model the last session ended with (the start when nothing better is built).
        self._previous: Optional[Tensors] = None
        #: Updates trained from versions before this one are withheld (0: none).
        self.fence_version = 0
        #: Since when the running session trains its own model (None: not yet, or not since a restart).
        self._own_since: Optional[float] = None
        #: An operator's new-session waits for the session to be ``min_session_s`` old.
        self._operator_pending = False
        #: A switch decided and not yet made a version (this input's updates are withheld).
        self._switch_pending = False
        #: What the hook being run decided: events, and the model to switch to.
        self._events: List[Dict[str, Any]] = []
        self._switch: Optional[Tensors] = None
        #: What ``load_state`` read, for ``load_state_tensors`` (which comes after it).
        self._loaded: Dict[str, Any] = {}
        #: The first version of each recent phase ``(version, session, aux_round)``, oldest first:
        #: version 0 is session 0's own model (what the first model carries).
        self._phases: Deque[Tuple[int, int, int]] = deque([(0, 0, 0)], maxlen=PHASES_KEPT)
        #: Each device's last update: the session and phase of the model it was trained from
        #: (None: older than the phases kept), and whether it was withheld (not saved).
        self.last_updates: Dict[str, Tuple[Optional[int], bool, bool]] = {}

    # ---- inputs -------------------------------------------------------------------------------
    def on_tick(self, now: float) -> Effects:
        self._tick(now)
        return self._decided()

    def _tick(self, now: float) -> None:
        present = self._present(now)
        if self.session < 0:
            if present:
                self.session = 0
                self._own_since = now
                self.membership.start(now, present)
                self._event("start", devices=len(present))
            return
        if self.membership.started_s is None:  # restarted: the session's clock starts again
            self.membership.started_s = now
        if self._own_since is None and self.aux_round == 0:
            self._own_since = now
        if self.aux is not None and self.aux.done(now):
            self._close_aux_round(now)
        due = self.membership.due(now, present)  # always asked: it keeps the reference set
        if self._operator_pending and self._old_enough(now):
            log.info("sessions: the operator's deferred new session begins")
            self._boundary(now, present, reason="operator")
        elif due and self._old_enough(now):
            self._boundary(now, present)

    def on_operator_command(self, command: Command, now: float) -> Optional[Effects]:
        if command.kind != NEW_SESSION:
            return None
        if self.session < 0:
            log.warning("sessions: new-session ignored: no device is online yet")
        elif self._old_enough(now):
            log.info("sessions: an operator asked for a new session")
            self._boundary(now, self._present(now), reason="operator")
        elif self._operator_pending:
            log.info("sessions: new-session: one is already deferred until session %d has trained "
                     "its own model for min_session_s (%g s)", self.session, self.config.min_session_s)
        else:
            self._operator_pending = True
            log.warning("sessions: new-session deferred: session %d %s; it begins once the session "
                        "has trained its own model for min_session_s (%g s)", self.session,
                        self._age_text(now), self.config.min_session_s)
            self._event("deferred", reason="operator")
        return self._decided()

    def before_admission(self, update: Update) -> Optional[Tensors]:
        """The auxiliary model of the running round for an update marked as trained from it."""
        return self.aux_model if self._of_running_aux(update) else None

    def _of_running_aux(self, update: Update) -> bool:
        """True if ``update`` is marked as trained from the auxiliary model sent beside now."""
        mark = update.extras.get(SessionAux.KIND)
        return (isinstance(mark, SessionAux) and self.aux_model is not None
                and (mark.session, mark.aux_round) == (self.session, self.aux_round))

    def on_update_admitted(self, update: Update, now: float) -> Verdict:
        marked = SessionAux.KIND in update.extras
        if self.beside:
            # Only marked updates answer the round; none of them is the fleet's model.
            offered = self._of_running_aux(update) and not self._switch_pending
            served = False
        else:
            offered = self.aux is not None and not self._switch_pending
            served = self.aux_round > 0
        if offered and self.aux.offer(update) and self.aux.done(now):
            self._close_aux_round(now)
        # A switch pending (this very update closed the aux round) replaces the model it trained from.
        withhold = marked or served or self._switch_pending or update.base_version < self.fence_version
        session, auxiliary = self._phase_of(update.base_version)
        auxiliary = auxiliary or marked
        self.last_updates[update.device_id] = (session, auxiliary, withhold)
        decided = self._decided()
        fields = {"session": self.session}
        if marked:  # which auxiliary round the device says it answered
            fields["aux_round"] = update.extras[SessionAux.KIND].aux_round
        return Verdict(withhold=withhold, fields=fields, events=decided.events, switch_to=decided.switch_to)

    def on_model_made(self, aggregation: Aggregation) -> Effects:
        if self._switch_pending and aggregation.switched_by == self.name:  # our switch is this version
            self._switch_pending = False
            self.fence_version = aggregation.version
            if self.aux is not None:
                self.aux.version = aggregation.version
        # Beside, the versions of an auxiliary round are the fleet's own model, not auxiliary ones.
        phase = (max(0, self.session), 0 if self.beside else self.aux_round)
        if self._phases[-1][1:] != phase:  # what this version's model carries (``before_publish``)
            self._phases.append((aggregation.version,) + phase)
        return NOTHING

    def _phase_of(self, version: int) -> Tuple[Optional[int], bool]:
        """The session of the model of ``version`` and whether it was an auxiliary one; None if
        it is older than the phases kept."""
        for first, session, aux_round in reversed(self._phases):
            if version >= first:
                return session, aux_round > 0
        return None, False

    def describe(self, now: float) -> MethodState:
        """The session (-1: no device online yet), its phase (``auxiliary`` while devices train the
        pilot's auxiliary rounds, ``own`` once it trains its own model, ``waiting``), the
        auxiliary round, the session models saved and whether the pilot exists, whether an
        operator's new-session waits for ``min_session_s``; per device the session its last update
        was trained in (None: too many phases ago), whether that was an auxiliary model and
        whether the update was withheld from the strategy."""
        phase = "waiting" if self.session < 0 else "auxiliary" if self.aux_round > 0 else "own"
        if phase == "auxiliary" and self.beside:
            phase = "auxiliary-beside"
        return MethodState(
            fleet={"session": self.session, "phase": phase, "aux_round": self.aux_round,
                   "saved_sessions": len(self.library.saved), "pilot": self.library.pilot is not None,
                   "new_session_deferred": self._operator_pending,
                   "own_model_age_s": None if self._own_since is None
                   else round(max(0.0, now - self._own_since), 1)},
            devices={d: {"session": s, "auxiliary": aux, "withheld": w}
                     for d, (s, aux, w) in self.last_updates.items()})

    def before_publish(self) -> List[Extra]:
        aux = self.aux_model if self.aux_round > 0 else None
        return [SessionTerms(max(0, self.session), self.aux_round, self.config.aux_rounds, aux=aux)]

    def _decided(self) -> Effects:
        """What the hook just run decided: its events and the model to switch to."""
        events, switch = tuple(self._events), self._switch
        self._events, self._switch = [], None
        return Effects(events=events, switch_to=switch) if events or switch is not None else NOTHING

    # ---- the session's life -------------------------------------------------------------------
    def _old_enough(self, now: float) -> bool:
        """True once the session has trained its own model for ``min_session_s``: a boundary may
        come (the bound on the share of time boundaries withhold updates)."""
        return (self.aux_round == 0 and self._own_since is not None
                and now - self._own_since >= self.config.min_session_s)

    def _age_text(self, now: float) -> str:
        if self.aux_round > 0:
            return "is still in its auxiliary rounds"
        if self._own_since is None:
            return "has just been restored"
        return "has trained its own model for %.0f s" % (now - self._own_since)

    def _present(self, now: float) -> List[str]:
        online = list(self.fleet.online())
        seen = self.fleet.last_seen_s
        if self.config.silence_s <= 0 or seen is None:
            return online
        last = {d: seen(d) for d in online}  # an online device is in the registry: never None
        return [d for d in online if last[d] is None or now - last[d] <= self.config.silence_s]

    def _boundary(self, now: float, present: List[str], reason: str = "membership") -> None:
        change = self.membership.change(present)
        if self.aux_round > 0:  # the session ended before it had a model of its own: keep none
            log.info("sessions: session %d ended during its auxiliary round", self.session)
        else:
            final = self._current()
            self.library.end_session(self.session, final, self.gradient)
            self._previous = final
        self.session += 1
        self.membership.start(now, present)
        self.gradient, self.aux, self.aux_round, self.aux_model = None, None, 0, None
        self._operator_pending = False
        self._own_since = now  # unless an auxiliary round starts below
        log.info("sessions: session %d begins (%s; %.0f%% of the devices changed, %d online)",
                 self.session, reason, 100 * change, len(present))
        self._event("boundary", reason=reason, change=round(change, 4), devices=len(present))
        if self.init.needs_gradient and self.library.pilot is not None:
            self._start_aux_round(now, 1, self.library.pilot, present)
        elif not self.init.needs_gradient:
            self._switch_to(self.init.build(self.library.saved, None), now)

    def _start_aux_round(self, now: float, number: int, model: Tensors, present: List[str]) -> None:
        self.aux_round = number
        self._own_since = None
        if self.beside:  # the marks say which round an update answers: any base version will do
            self.aux = AuxRound(0, now, present, self.config.aux_quorum, self.config.aux_wait_s)
            self.aux_model = model
            # Announce it now: a version of the fleet's own model (nothing merged, nothing fenced
            # off) carries the auxiliary model to the boards, as the pilot's switch does when served.
            self._switch = self._current()
        else:
            self.aux = AuxRound(-1, now, present, self.config.aux_quorum, self.config.aux_wait_s)
            self._switch, self._switch_pending = model, True
        self._event("aux", aux_round=number)

    def _close_aux_round(self, now: float) -> None:
        merged = self.aux.merged()
        answers = len(self.aux.updates)
        if self.aux_round < self.config.aux_rounds:
            self._start_aux_round(now, self.aux_round + 1, merged, self._present(now))
            return
        self.gradient = difference(merged, self.library.pilot)
        self.aux, self.aux_round, self.aux_model = None, 0, None
        self._own_since = now
        built = self.init.build(self.library.saved, self.gradient)
        weights = self.init.last_weights
        log.info("sessions: session %d's gradient from %d device(s); starting from %s", self.session,
                 answers, "saved sessions %s" % weights if built is not None else
                 "the model the fleet trained meanwhile" if self.beside else "the previous model")
        if built is None and self.beside:  # the fleet's model never left: nothing to switch back to
            self._event("init", weights=weights, answers=answers)
            return
        self._switch_to(built if built is not None else self._previous, now, weights=weights,
                        answers=answers)

    def _switch_to(self, model: Optional[Tensors], now: float, **fields: Any) -> None:
        if model is None:
            return
        self._switch, self._switch_pending = model, True
        self._event("init", **fields)

    def _current(self) -> Tensors:
        return self.fleet.model() if self.fleet.model is not None else {}

    def _event(self, what: str, **fields: Any) -> None:
        event = {"event": "session", "session": self.session, "what": what, "init": self.config.init}
        event.update({k: {str(s): w for s, w in v.items()} if isinstance(v, dict) else v
                      for k, v in fields.items()})
        self._events.append(event)

    # ---- persistence --------------------------------------------------------------------------
    def state(self) -> Optional[Dict[str, Any]]:
        return {"session": self.session, "aux_round": self.aux_round,
                "aux_version": None if self.aux is None else self.aux.version,
                "fence_version": self.fence_version, "membership": self.membership.state(),
                "operator_pending": self._operator_pending,
                "library": self.library.state(), "gradient": self.gradient is not None,
                "previous": self._previous is not None, "aux_model": self.aux_model is not None,
                "phases": [list(p) for p in self._phases]}

    def load_state(self, state: Mapping[str, Any]) -> None:
        session, aux_round = state.get("session", -1), state.get("aux_round", 0)
        if type(session) is not int or type(aux_round) is not int or not 0 <= aux_round <= self.config.aux_rounds:
            raise ValueError("sessions: bad saved state")
        self.membership.load_state(dict(state.get("membership") or {}))
        self.session, self.aux_round = session, aux_round
        self.fence_version = int(state.get("fence_version") or 0)
        self._operator_pending = state.get("operator_pending") is True
        phases = state.get("phases")
        if phases is None:  # saved before phases were kept: the versions before the fence are unknown
            phases = [[self.fence_version, max(0, session), aux_round]]
        if not isinstance(phases, list) or not phases or not all(
                isinstance(p, list) and len(p) == 3 and all(type(v) is int and v >= 0 for v in p) for p in phases):
            raise ValueError("sessions: bad saved phases %r" % (phases,))
        self._phases = deque((tuple(p) for p in phases), maxlen=PHASES_KEPT)
        self._own_since = None  # the session's clock starts again at the first tick
        self._loaded = dict(state)
        if aux_round:  # the round starts over from the restored (auxiliary) model
            self.aux = AuxRound(0 if self.beside else int(state.get("aux_version") or 0), 0.0,
                                self.fleet.online(), self.config.aux_quorum, self.config.aux_wait_s)

    def state_tensors(self) -> Optional[Dict[str, np.ndarray]]:
        out = self.library.arrays()
        for key, tensors in (("gradient", self.gradient), ("previous", self._previous),
                             ("aux_model", self.aux_model)):
            if tensors is not None:
                out.update(prefixed(key, tensors))
        return out or None

    def load_state_tensors(self, tensors: Mapping[str, np.ndarray]) -> None:
        saved = self._loaded
        spec = {n: a.shape for n, a in self._current().items()}
        self.library.load(dict(saved.get("library") or {}), tensors, spec)
        self.gradient = unprefixed(tensors, "gradient", spec) if saved.get("gradient") else None
        self._previous = unprefixed(tensors, "previous", spec) if saved.get("previous") else None
        if self.beside and self.aux_round:  # the round starts over from its model, or from the pilot
            self.aux_model = (unprefixed(tensors, "aux_model", spec) if saved.get("aux_model")
                              else self.library.pilot)
            if self.aux_model is None:  # nothing to measure from: the session trains its own model
                self.aux, self.aux_round = None, 0
        log.info("sessions: session %d restored with %d saved session model(s)%s", self.session,
                 len(self.library.saved), "" if self.library.pilot is None else " and the pilot")

