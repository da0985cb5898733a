"""The importance-sampling baseline on the device: measures importance, lends its policy.

Dormant until a global model carries ``ImportanceTerms``. Then the buffer is lent a policy with
the terms' budget and eviction sample:

- by class (the default): an ``ImportancePolicy`` (``streamfl.methods.importance.buffer_policy``);
  after each round the plug-in measures each class's mean logit-gradient norm
  ||softmax(z) - onehot(y)|| on ``sample_windows`` (256) buffered windows at the trained model:
  one batched forward pass, charged to the round as batched statistics work;
- per window (``per_window``, the paper's IS): a ``WindowImportancePolicy``
  (``streamfl.methods.importance.window_policy``) that scores each window offered, and each
  eviction's candidate slots, with a copy of the model trained in the last round (a copy, so that
  a board's sensor thread scores with whole weights while the next round trains). The forward
  passes since the last round are charged to the round as batched work (a single-window pass
  costs a board more than its share of a batch: the simulator's energy is a lower bound here).

It sends nothing.
"""
import copy
import logging
from dataclasses import dataclass
from typing import Dict, List, Optional, Union

import numpy as np
import torch

from streamfl.methods.importance.buffer_policy import ImportancePolicy
from streamfl.agent.plugins.base import AgentPlugin, ModelDecision, RoundContext, Statistic
from streamfl.config import bounded
from streamfl.protocol.messages import GlobalModel
from streamfl.methods.importance.payloads import ImportanceTerms
from streamfl.methods.importance.window_policy import Scorer, WindowImportancePolicy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImportanceAgentConfig:
    """sample_windows: buffered windows scored after each round (one batched forward pass)."""

    sample_windows: int = bounded(256, 1, 65536)

    def __post_init__(self) -> None:
        if not 1 <= self.sample_windows <= 65536:
            raise ValueError("sample_windows must be in [1, 65536], got %r" % (self.sample_windows,))


class ImportanceAgentPlugin(AgentPlugin):
    """Lends the buffer an importance policy and keeps its class importance current."""

    name = "importance"
    Config = ImportanceAgentConfig
    activated_by = (ImportanceTerms.KIND,)

    def __init__(self, config: ImportanceAgentConfig):
        super().__init__(config)
        self.terms: Optional[ImportanceTerms] = None
        self.policy: Optional[Union[ImportancePolicy, WindowImportancePolicy]] = None
        self._seed = 0
        #: ``WindowImportancePolicy.scored`` when the last round was charged.
        self._scored_charged = 0

    def bind(self, seed: int, num_classes: int) -> None:
        self._seed = int(seed)

    def on_model_received(self, gm: GlobalModel, hparams: Dict[str, float]) -> ModelDecision:
        """Lends the buffer the importance policy, at the terms' budget and eviction sample."""
        self.terms = gm.extras[ImportanceTerms.KIND]
        kind = WindowImportancePolicy if self.terms.per_window else ImportancePolicy
        if type(self.policy) is not kind:
            self.policy = kind(self._seed, self.terms.budget, self.terms.candidates)
            self._scored_charged = 0
        self.policy.budget, self.policy.candidates = self.terms.budget, self.terms.candidates
        return ModelDecision(hparams, buffer_policy=self.policy)

    def after_round(self, ctx: RoundContext) -> List[Statistic]:
        if isinstance(self.policy, WindowImportancePolicy):
            if self.policy.scorer is None:
                log.info("importance sampling per window: scoring each window offered with the model "
                         "of round %d on", ctx.round_index)
            self.policy.scorer = gradient_norm_scorer(copy.deepcopy(ctx.model))
            scored, self._scored_charged = self.policy.scored - self._scored_charged, self.policy.scored
            return [Statistic(None, batched_windows=scored)] if scored else []
        if ctx.buffer_len == 0:
            return []
        X, y = ctx.sample(min(self.config.sample_windows, ctx.buffer_len))
        was_training = ctx.model.training
        ctx.model.eval()
        try:
            norms = logit_gradient_norms(ctx.model, X, y)
        finally:
            ctx.model.train(was_training)
        self.policy.importance = {int(c): float(norms[y == c].mean()) for c in np.unique(y)}
        return [Statistic(None, batched_windows=len(y))]


def logit_gradient_norms(model: torch.nn.Module, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """||softmax(model(X)) - onehot(y)|| per window: the loss gradient's norm at the logits."""
    with torch.no_grad():
        probs = torch.softmax(model(torch.as_tensor(X)), dim=1).numpy()
    probs[np.arange(len(y)), y] -= 1.0
    return np.linalg.norm(probs, axis=1)


def gradient_norm_scorer(model: torch.nn.Module) -> Scorer:
    """A ``Scorer`` over ``model`` (put in eval mode; the caller hands over its own copy)."""
    model.eval()
    return lambda X, y: logit_gradient_norms(model, X, y)
