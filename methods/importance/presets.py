"""Importance sampling's named run (a baseline of SFedPO)."""
from typing import List

from streamfl.methods.base import FEDAVG as _FEDAVG, Method
from streamfl.methods.sfedpo.presets import FIGURES as _FIGURES

#: The named simulator runs of this method (``streamfl sim --methods NAME``).
PRESETS: List[Method] = []

PRESETS.append(Method("is", "importance sampling: windows of the classes with the largest logit-gradient "
                            "norm admitted more and evicted last, at SFedPO's budget (streamfl's class-level "
                            "variant of Li et al. 2021)",
                      coordinator=_FEDAVG, plugins={"importance": {}},
                      when="boards move between states whose class mixes differ and the buffer "
                           "cannot hold everything: ahead of sfedpo in all four settings of SFedPO's "
                           "comparison (0.1-4.6 points), level with is-window, at 8% more energy "
                           "than FedAvg",
                      figures=_FIGURES))
PRESETS.append(Method("is-window", "importance sampling per window, as Li et al. 2021 and SFedPO's IS "
                                   "baseline: each window offered, and each eviction's candidates, "
                                   "scored by its own logit-gradient norm, at SFedPO's budget",
                      coordinator=_FEDAVG, plugins={"importance": {"per_window": True}},
                      when="to run the paper's IS baseline: 0.8-4.8 points ahead of sfedpo, level "
                           "with is (by class), which costs less (36% more energy than FedAvg here "
                           "against 8%: a forward pass for every window offered)",
                      figures=_FIGURES))
