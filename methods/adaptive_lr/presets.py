"""Adaptive-FedAvg's named run (a baseline of SFedPO)."""
from typing import List

from streamfl.methods.base import FEDAVG as _FEDAVG, Method
from streamfl.methods.sfedpo.presets import FIGURES as _FIGURES

#: The named simulator runs of this method (``streamfl sim --methods NAME``).
PRESETS: List[Method] = []

#: The settings of the run behind its figures (configs/scenarios/sfedpo-latent-states.yaml): t
#: counted in units of 10 aggregations and the rate floored at a tenth of lr0, our two guards
#: (methods/adaptive_lr/coordinator.py), carried by the name to a fleet.
MEASURED = {"plugins": {"adaptive_lr": {"decay_every": 10, "min_lr_ratio": 0.1}}}

# Adaptive-FedAvg (Canonaco et al., IJCNN 2021), SFedPO's concept-drift baseline (SFedPO paper, sec. 6:
# "adjusts local learning rates to improve model plasticity under concept drift"): FedAvg rounds,
# the coordinator's ``adaptive_lr`` plug-in setting each round's lr from the global model's drift.
PRESETS.append(Method("adapfedavg", "Adaptive-FedAvg: FedAvg whose devices' lr follows the global model's "
                                    "running variance ratio with a 1/t decay (Canonaco et al. 2021)",
                      coordinator=_FEDAVG, plugins={"adaptive_lr": {}}, measured=MEASURED,
                      when="a baseline, not for use: 11 to 22 points behind every other method on "
                           "SFedPO's shifting streams",
                      figures=_FIGURES))
