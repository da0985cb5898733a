"""AdaCLP on the device: Fisher trace per round (eq. 1), CLP hyper-parameters (eq. 4-6), CLP flag.

Dormant until a global model carries the coordinator probe's ``ClpState``. Then every round's
update carries the Fisher trace at the trained model, estimated on ``fisher_samples`` buffer
windows with one batched backward pass; while the state says ``regulating``, the round's lr, batch
size and dropout come from eq. 4-6 (``streamfl.agent.clp_hparams``); ``in_clp`` is the critical
period the ``clp-aware`` clock policy follows.
"""
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch

from streamfl.agent.clp_hparams import ClpHparamsConfig, refine
from streamfl.agent.plugins.base import AgentPlugin, RoundContext, Statistic
from streamfl.models.fisher import fisher_trace
from streamfl.protocol.messages import GlobalModel
from streamfl.protocol.payloads import ClpState, FisherTrace


@dataclass(frozen=True)
class ClpAgentConfig(ClpHparamsConfig):
    """eq. 4-6 constants (``ClpHparamsConfig``) and the Fisher trace's sample size.

    fisher_samples: buffer windows the per-round trace (eq. 1) is estimated on; 0 = never send
      one. 20, not the paper's batch of 50: one backward over 50 windows costs ~17% of an lstm
      round of 5 steps (bench/bench_fisher.py), 20 about 7%, under the 10% goal; the estimate is
      noisy either way and the coordinator's eq. 2 averages it over a window of versions.
    """

    fisher_samples: int = 20

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.fisher_samples, bool) or not isinstance(self.fisher_samples, int) \
                or self.fisher_samples < 0:
            raise ValueError("fisher_samples must be an integer >= 0 (0 = no Fisher trace), got %r"
                             % (self.fisher_samples,))


class ClpAgentPlugin(AgentPlugin):
    """Follows the newest global model's CLP state."""

    name = "clp"
    Config = ClpAgentConfig

    def __init__(self, config: ClpAgentConfig):
        super().__init__(config)
        #: The newest global model's CLP state; None while the coordinator runs no probe.
        self.current: Optional[ClpState] = None

    def on_global_model(self, gm: GlobalModel) -> None:
        state = gm.extras.get(ClpState.KIND)
        self.current = state if isinstance(state, ClpState) else None

    def refine_hparams(self, hparams: Dict[str, float]) -> Dict[str, float]:
        return refine(self.current, hparams, self.config)

    def critical_period(self) -> bool:
        return bool(self.current is not None and self.current.in_clp)

    def statistics(self, ctx: RoundContext) -> List[Statistic]:
        """The trace at the trained model; none when the coordinator runs no probe (a plain
        FedAsync fleet does not pay for a backward pass nobody reads)."""
        n = min(int(self.config.fisher_samples), ctx.buffer_len)
        if n < 1 or self.current is None:
            return []
        X, _ = ctx.sample(n)
        gen = torch.Generator().manual_seed((ctx.seed * 7919 + ctx.round_index) & 0x7FFFFFFFFFFFFFFF)
        value = fisher_trace(ctx.model, X, generator=gen)
        extra = FisherTrace(float(value)) if np.isfinite(value) else None
        return [Statistic(extra, batched_windows=n)]
