"""The importance-sampling baseline on the device: measures class importance, lends its policy.

Dormant until a global model carries ``ImportanceTerms``. Then the buffer is lent an
``ImportancePolicy`` (``streamfl.methods.importance.buffer_policy``) with the terms' budget and
eviction sample, and after each round the plug-in measures each class's mean logit-gradient norm
||softmax(z) - onehot(y)|| on ``sample_windows`` (256) buffered windows at the trained model: one
batched forward pass, charged to the round as batched statistics work. It sends nothing.
"""
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch

from streamfl.methods.importance.buffer_policy import ImportancePolicy
from streamfl.agent.plugins.base import AgentPlugin, ModelDecision, RoundContext, Statistic
from streamfl.config import bounded
from streamfl.protocol.messages import GlobalModel
from streamfl.methods.importance.payloads import ImportanceTerms


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
        self.policy: Optional[ImportancePolicy] = None
        self._seed = 0

    def bind(self, seed: int, num_classes: int) -> None:
        self._seed = int(seed)

    def on_model_received(self, gm: GlobalModel, hparams: Dict[str, float]) -> ModelDecision:
        """Lends the buffer the importance policy, at the terms' budget and eviction sample."""
        self.terms = gm.extras[ImportanceTerms.KIND]
        if self.policy is None:
            self.policy = ImportancePolicy(self._seed, self.terms.budget, self.terms.candidates)
        self.policy.budget, self.policy.candidates = self.terms.budget, self.terms.candidates
        return ModelDecision(hparams, buffer_policy=self.policy)

    def after_round(self, ctx: RoundContext) -> List[Statistic]:
        if ctx.buffer_len == 0:
            return []
        X, y = ctx.sample(min(self.config.sample_windows, ctx.buffer_len))
        was_training = ctx.model.training
        ctx.model.eval()
        try:
            with torch.no_grad():
                probs = torch.softmax(ctx.model(torch.as_tensor(X)), dim=1).numpy()
        finally:
            ctx.model.train(was_training)
        probs[np.arange(len(y)), y] -= 1.0
        norms = np.linalg.norm(probs, axis=1)
        self.policy.importance = {int(c): float(norms[y == c].mean()) for c in np.unique(y)}
        return [Statistic(None, batched_windows=len(y))]
