"""Adaptive-FedAvg's named run (a baseline of SFedPO)."""
from typing import List

from streamfl.methods.base import FEDAVG as _FEDAVG, Method

#: The named simulator runs of this method (``streamfl sim --methods NAME``).
PRESETS: List[Method] = []

# Adaptive-FedAvg (Canonaco et al., IJCNN 2021), SFedPO's concept-drift baseline (SFedPO paper, sec. 6:
# "adjusts local learning rates to improve model plasticity under concept drift"): FedAvg rounds,
# the coordinator's ``adaptive_lr`` plug-in setting each round's lr from the global model's drift.
PRESETS.append(Method("adapfedavg", "Adaptive-FedAvg: FedAvg whose devices' lr follows the global model's "
                                    "running variance ratio with a 1/t decay (Canonaco et al. 2021)",
                      coordinator=_FEDAVG, plugins={"adaptive_lr": {}},
                      when="a baseline, not for use: 11 to 22 points behind every other method on "
                           "SFedPO's shifting streams"))
