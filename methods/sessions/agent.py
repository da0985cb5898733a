"""Sessions on the device: log the fleet's session and train each auxiliary model once.

The coordinator's ``sessions`` plug-in (``methods/sessions/coordinator.py``) announces the session
in every global model (``SessionTerms``). A device logs each new session and each auxiliary round,
and, during an auxiliary round, trains the auxiliary model once and then waits for the next model:
the coordinator takes only the first update each device trained from it (one local round from the
pilot is what measures the session's gradient), so a second round would be energy spent for
nothing. Dormant while the global model carries no ``session`` extra.

Where the auxiliary model rides beside the global one (``SessionTerms.aux``), the board trains its
next round from it (``round_start_weights``), marks that update (``SessionAux``) and trains from
the global model again after it; one round per auxiliary model, as above, and no rest: the global
model is still the fleet's to train.

With ``distill_weight`` above 0 (the session paper's Continuous baseline, ``continuous``), each
round also distills toward the session's starting model: the first model of the session's own
(not an auxiliary one) that the board received after the session changed, kept as a teacher
(``agent/distillation.py``). Under ``init: previous`` that model is the last session's final
model, which is what the paper's baseline anchors to. A board that joins in the middle of a
session did not see its start and distills from the next session on.
"""
import logging
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
from torch import nn

from streamfl.agent.distillation import Distillation
from streamfl.agent.plugins.base import AgentPlugin, ModelDecision, Penalty, RoundContext, Statistic
from streamfl.config import bounded
from streamfl.protocol.messages import GlobalModel
from streamfl.methods.sessions.payloads import SessionAux, SessionTerms

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SessionsAgentConfig:
    """once_per_aux_model: after one round from an auxiliary model served as the global model, skip
    rounds until a newer model arrives (true: the coordinator uses no later round from it); one
    sent beside the global model is trained once either way, and needs no rest.
    forget_on_new_session: empty the window buffer when a new session is announced. Off by
    default: where sessions change because boards come and go (the paper's setting), a board that
    stays keeps data that is still its own. On where the boards' own world changes with the
    session (a shift's tasks, a room's use): old windows would drag the new session's model back.
    distill_weight, distill_temperature: the Continuous baseline's distillation toward the
    session's starting model (weight 0: off). The session paper gives neither value (its baseline
    cites class-semantic relation distillation); 1.0 weighs the teacher's soft predictions as
    much as the labels, and T = 2 is the usual temperature of knowledge distillation, soft enough
    that the teacher's second choices (the class relations) count.
    """

    once_per_aux_model: bool = True
    forget_on_new_session: bool = False
    distill_weight: float = bounded(0.0, 0.0, 100.0)
    distill_temperature: float = bounded(2.0, 0.1, 100.0)


class SessionsAgentPlugin(AgentPlugin):
    """Follows the session in the global model; rests after its auxiliary round."""

    name = "sessions"
    Config = SessionsAgentConfig
    activated_by = (SessionTerms.KIND,)

    def __init__(self, config: SessionsAgentConfig):
        super().__init__(config)
        self.terms: Optional[SessionTerms] = None
        #: The version of the auxiliary model in force (None when the model is the session's).
        self.aux_version: Optional[int] = None
        self.aux_trained = False
        #: The session's starting model, distilled toward (None: not known, or distillation off).
        self.teacher: Optional[Dict[str, np.ndarray]] = None
        #: A new session began and its own starting model has not arrived yet.
        self._awaiting_start = False
        #: The auxiliary model sent beside the global one, while this board has not trained it:
        #: ``((session, aux_round), tensors)``; and the auxiliary rounds it trained.
        self._aux_pending: Optional[tuple] = None
        self._aux_training: Optional[tuple] = None
        self._aux_done: Optional[tuple] = None

    def on_model_received(self, gm: GlobalModel, hparams: Dict[str, float]) -> ModelDecision:
        """Follows the session; forgets the windows at a new one when told to."""
        terms = gm.extras[SessionTerms.KIND]
        old = self.terms
        forget = bool(old is not None and terms.session > old.session and self.config.forget_on_new_session)
        if old is None or (terms.session, terms.aux_round) != (old.session, old.aux_round):
            if terms.auxiliary:
                log.info("session %d: auxiliary round %d/%d (model version %d)", terms.session,
                         terms.aux_round, terms.aux_rounds, gm.version)
            else:
                log.info("session %d: training the session's model (version %d)", terms.session, gm.version)
        self.terms = terms
        self.aux_version = gm.version if terms.aux_served else None
        self.aux_trained = False
        key = (terms.session, terms.aux_round)
        self._aux_pending = (key, terms.aux) if terms.aux is not None and key != self._aux_done else None
        if self.config.distill_weight > 0.0:
            self._follow_teacher(old, terms, gm)
        return ModelDecision(hparams, forget_windows=forget)

    def _follow_teacher(self, old: Optional[SessionTerms], terms: SessionTerms, gm: GlobalModel) -> None:
        """Keep the first own model of each session this board saw begin as its teacher."""
        if old is not None and terms.session != old.session:
            self.teacher, self._awaiting_start = None, True
        if self._awaiting_start and not terms.auxiliary:
            self.teacher = {name: np.array(t, dtype=np.float32, copy=True) for name, t in gm.tensors.items()}
            self._awaiting_start = False
            log.info("session %d: distilling toward its starting model (version %d)", terms.session,
                     gm.version)

    def round_start_weights(self) -> Optional[Dict[str, np.ndarray]]:
        """The auxiliary model sent beside the global one, until this board trained a round from it."""
        if self._aux_pending is None:
            self._aux_training = None
            return None
        self._aux_training = self._aux_pending[0]
        return self._aux_pending[1]

    def before_round(self, model: nn.Module) -> Optional[Penalty]:
        """The distillation term toward the session's starting model, once it is known."""
        if self.teacher is None or self.config.distill_weight <= 0.0:
            return None
        return Distillation(self.teacher, self.config.distill_weight, self.config.distill_temperature)

    @property
    def session(self) -> Optional[int]:
        """The fleet's session as the newest global model said, None if it says none."""
        return None if self.terms is None else self.terms.session

    def after_round(self, ctx: RoundContext) -> List[Statistic]:
        if self.aux_version is not None and ctx.base_version == self.aux_version:
            self.aux_trained = True
        if self._aux_training is not None:  # this round trained the auxiliary model: mark it
            session, aux_round = self._aux_training
            self._aux_done, self._aux_training, self._aux_pending = self._aux_training, None, None
            log.info("session %d: trained auxiliary round %d beside the global model", session, aux_round)
            return [Statistic(SessionAux(session, aux_round))]
        return []

    def on_round_opportunity(self, now: float) -> bool:
        return not self.waits_for_newer_model()

    def waits_for_newer_model(self) -> bool:
        """After its round from the auxiliary model, only the next model lets a round start."""
        return self.config.once_per_aux_model and self.aux_trained
