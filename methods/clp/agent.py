"""AdaCLP on the device: Fisher trace per round (eq. 1), CLP hyper-parameters (eq. 4-6), CLP flag.

Dormant until a global model carries the coordinator probe's ``ClpState``. Then every round's
update carries the Fisher trace at the trained model, estimated on ``fisher_samples`` buffer
windows with one batched backward pass; while the state says ``regulating``, the round's lr, batch
size and dropout come from eq. 4-6 (``streamfl.methods.clp.hparams``); ``in_clp`` is the critical
period the ``clp-aware`` clock policy follows.
"""
import math
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch

from streamfl.methods.clp.hparams import ClpHparamsConfig, refine
from streamfl.methods.clp.learned import learned_lr, should_rest
from streamfl.agent.plugins.base import AgentPlugin, ModelDecision, RoundContext, Statistic
from streamfl.config import bounded
from streamfl.models.fisher import fisher_trace
from streamfl.protocol.messages import GlobalModel
from streamfl.methods.clp.payloads import ClpState, FisherTrace


LR_RULES = ("paper", "learned")


@dataclass(frozen=True)
class ClpAgentConfig(ClpHparamsConfig):
    """eq. 4-6 constants (``ClpHparamsConfig``) and the Fisher trace's sample size.

    fisher_samples: buffer windows the per-round trace (eq. 1) is estimated on; 0 = never send
      one. 20, not the paper's batch of 50: one backward over 50 windows costs ~17% of an lstm
      round of 5 steps (bench/bench_fisher.py), 20 about 7%, under the 10% goal; the estimate is
      noisy either way and the coordinator's eq. 2 averages it over a window of versions.
    """

    fisher_samples: int = bounded(20, 0, 65536)
    #: "paper": eq. 4's learning rate; "learned": streamfl's own rule (``streamfl.methods.clp.learned``:
    #: the rate falls, and the device rests, once its own data is learned). Eq. 5-6 apply to both.
    lr_rule: str = "paper"
    #: "learned": full rate above this fraction of ln K (chance-level loss), proportionally less
    #: below; 0 (default) keeps initial_lr and lets the rest alone regulate: on the paper-regime
    #: scenario (seed 0, docs/results.md) resting alone kept more accuracy (0.441 against 0.437
    #: mean) at less energy (66% against 84% of FedAsync's) than resting plus a falling rate.
    learned_loss_frac: float = bounded(0.0, 0.0, 10.0)
    #: "learned": rest when the last round's loss is below this fraction of ln K (0 = never rest).
    rest_loss_frac: float = bounded(0.05, 0.0, 10.0)
    #: "learned": a rest lasts this many round-lengths (the last round's own duration).
    rest_rounds: float = bounded(3.0, 0.0, 1e4)
    #: "learned": which loss says the data is learned: "start" (default), the first step's, i.e.
    #: the global model's own fit to this device's data before it trained; "mean", the round's
    #: mean, which also counts what the round itself just learned.
    learned_signal: str = "start"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lr_rule not in LR_RULES:
            raise ValueError("clp.lr_rule must be one of %s, got %r" % (", ".join(LR_RULES), self.lr_rule))
        if self.learned_signal not in ("start", "mean"):
            raise ValueError("clp.learned_signal must be 'start' or 'mean', got %r"
                             % (self.learned_signal,))
        for name in ("learned_loss_frac", "rest_loss_frac", "rest_rounds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise ValueError("clp.%s must be a finite number >= 0, got %r" % (name, value))
        if isinstance(self.fisher_samples, bool) or not isinstance(self.fisher_samples, int) \
                or self.fisher_samples < 0:
            raise ValueError("fisher_samples must be an integer >= 0 (0 = no Fisher trace), got %r"
                             % (self.fisher_samples,))


class ClpAgentPlugin(AgentPlugin):
    """Follows the newest global model's CLP state."""

    name = "clp"
    Config = ClpAgentConfig
    activated_by = (ClpState.KIND,)

    def __init__(self, config: ClpAgentConfig):
        super().__init__(config)
        #: The newest global model's CLP state (None until one activates the plug-in).
        self.current: Optional[ClpState] = None
        #: ``lr_rule: learned``: the last round's loss, the model's class count, when the last
        #: round started, and until when the device rests.
        self._last_loss: Optional[float] = None
        self._num_classes = 0
        self._started_s: Optional[float] = None
        self._rest_until_s: Optional[float] = None
        #: Rounds rested so far (``lr_rule: learned``), for logs and summaries.
        self.rests = 0

    def _learned(self) -> bool:
        """True while streamfl's rule is the one regulating."""
        return self.config.lr_rule == "learned" and self.current.regulating is True

    def on_model_received(self, gm: GlobalModel, hparams: Dict[str, float]) -> ModelDecision:
        """Eq. 4-6 (or the learned rate) from the model's CLP state; its ``in_clp`` flag."""
        self.current = gm.extras[ClpState.KIND]
        out = refine(self.current, hparams, self.config)
        if self._learned():
            out["lr"] = learned_lr(self._last_loss, self._num_classes, self.config.initial_lr,
                                   self.config.lr_min, self.config.learned_loss_frac)
        return ModelDecision(out, critical_period=bool(self.current.in_clp))

    def on_round_opportunity(self, now: float) -> bool:
        """``lr_rule: learned``: rest for ``rest_rounds`` round-lengths once the data is learned."""
        if self._started_s is not None and self._last_loss is not None:
            # First call after a round: it took about now - start (start to its end).
            round_s = max(0.0, now - self._started_s)
            self._started_s = None
            if self._learned() and should_rest(self._last_loss, self._num_classes,
                                               self.config.rest_loss_frac):
                self._rest_until_s = now + self.config.rest_rounds * round_s
                self.rests += 1
        if self._rest_until_s is not None:
            if now < self._rest_until_s:
                return False
            self._rest_until_s = None
            self._last_loss = None  # measure again before resting again
        self._started_s = now
        return True

    def after_round(self, ctx: RoundContext) -> List[Statistic]:
        """The trace at the trained model (only while the coordinator runs the probe: a plain
        FedAsync fleet, leaving the plug-in dormant, does not pay for a backward pass nobody reads)."""
        self._last_loss = ctx.loss if self.config.learned_signal == "mean" else ctx.start_loss
        self._num_classes = ctx.num_classes
        n = min(int(self.config.fisher_samples), ctx.buffer_len)
        if n < 1:
            return []
        X, _ = ctx.sample(n)
        gen = torch.Generator().manual_seed((ctx.seed * 7919 + ctx.round_index) & 0x7FFFFFFFFFFFFFFF)
        value = fisher_trace(ctx.model, X, generator=gen)
        extra = FisherTrace(float(value)) if np.isfinite(value) else None
        return [Statistic(extra, batched_windows=n)]
