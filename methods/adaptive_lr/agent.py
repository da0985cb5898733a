"""Adaptive-FedAvg on the device (Canonaco et al., IJCNN 2021): train with the coordinator's rate.

The coordinator's ``adaptive_lr`` plug-in (``methods/adaptive_lr/coordinator.py``) tracks how much
the global model moves and puts ``lr_t = lr0 min(1, r^_t / t)`` into every global model as an
``AdaptiveLr`` extra: the factor ``scale`` and, where the coordinator names it, ``lr0`` (else the
global model's own ``hparams.lr``). The device sets its round's ``lr`` to it; the core then clamps
it to the board's ``hparam_limits`` like any other rate. Dormant while the global model carries no
``adaptive_lr`` extra: the broadcast hyper-parameters pass unchanged.
"""
import logging
import math
from dataclasses import dataclass
from typing import Dict, Optional

from streamfl.agent.plugins.base import AgentPlugin, ModelDecision
from streamfl.methods.adaptive_lr.payloads import AdaptiveLr
from streamfl.protocol.messages import GlobalModel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdaptiveLrAgentConfig:
    """Nothing to set: the rate and its bounds come with the global model (and the board's
    ``hparam_limits``)."""


class AdaptiveLrAgentPlugin(AgentPlugin):
    """Keeps the newest ``AdaptiveLr`` extra and applies it to the round's ``lr``."""

    name = "adaptive_lr"
    Config = AdaptiveLrAgentConfig
    activated_by = (AdaptiveLr.KIND,)

    def __init__(self, config: AdaptiveLrAgentConfig):
        super().__init__(config)
        #: The newest global model's extra (None: no global model has activated it yet).
        self.terms: Optional[AdaptiveLr] = None

    def on_model_received(self, gm: GlobalModel, hparams: Dict[str, float]) -> ModelDecision:
        self.terms = gm.extras[AdaptiveLr.KIND]
        base = hparams.get("lr")
        if self.terms.lr0 is None and (isinstance(base, bool) or not isinstance(base, (int, float))
                                       or not math.isfinite(base) or base <= 0):
            log.warning("adaptive_lr: the global model's lr %r is no rate to scale; kept", base)
            return ModelDecision(hparams)
        out = dict(hparams)
        out["lr"] = self.terms.lr_for(base)
        log.debug("adaptive_lr: lr %.4g (scale %.4g of %s)", out["lr"], self.terms.scale,
                  "lr0 %g" % self.terms.lr0 if self.terms.lr0 is not None else "the broadcast lr")
        return ModelDecision(out)
