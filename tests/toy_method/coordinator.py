"""The toy method's coordinator side: publishes its terms, logs each update's window count."""
from dataclasses import dataclass
from typing import List

from streamfl.config import bounded
from streamfl.coordinator.plugins.base import CoordinatorPlugin, Verdict
from streamfl.protocol.extras import Extra
from streamfl.protocol.messages import Update

from .payloads import ToyReport, ToyTerms


@dataclass(frozen=True)
class ToyConfig:
    """Settings of the toy method."""

    #: Factor on the devices' learning rate while the method runs.
    lr_scale: float = bounded(0.5, 1e-3, 1.0)


class ToyPlugin(CoordinatorPlugin):
    """Publishes ``ToyTerms``; an update's ``ToyReport`` goes into its metrics record."""

    name = "toy"
    Config = ToyConfig

    def on_update_admitted(self, update: Update, now: float) -> Verdict:
        report = update.extras.get(ToyReport.KIND)
        return Verdict(fields={"toy_windows": report.windows}) if isinstance(report, ToyReport) else Verdict()

    def before_publish(self) -> List[Extra]:
        return [ToyTerms(self.config.lr_scale)]
