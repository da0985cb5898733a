"""The toy method's device side: scales the learning rate, counts windows, reports the count."""
from dataclasses import dataclass
from typing import Dict, List

from streamfl.agent.plugins.base import AgentPlugin, ModelDecision, RoundContext, Statistic
from streamfl.protocol.messages import GlobalModel
from streamfl.sensors.window import Window

from .payloads import ToyReport, ToyTerms


@dataclass(frozen=True)
class ToyAgentConfig:
    """The toy method needs no device setting."""


class ToyAgentPlugin(AgentPlugin):
    """Active while global models carry ``ToyTerms``."""

    name = "toy"
    Config = ToyAgentConfig
    activated_by = (ToyTerms.KIND,)

    def __init__(self, config: ToyAgentConfig):
        super().__init__(config)
        self.windows = 0

    def on_window_arrived(self, window: Window) -> None:
        self.windows += 1

    def on_model_received(self, gm: GlobalModel, hparams: Dict[str, float]) -> ModelDecision:
        terms = gm.extras[ToyTerms.KIND]
        return ModelDecision(hparams=dict(hparams, lr=float(hparams["lr"]) * terms.lr_scale))

    def after_round(self, ctx: RoundContext) -> List[Statistic]:
        return [Statistic(ToyReport(self.windows))]
