"""SFedPO's named runs, its ablations and the online-FL baseline FedOGD."""
from typing import List

from streamfl.methods.base import FEDASYNC as _FEDASYNC, FEDAVG as _FEDAVG, Figures, Method
from streamfl.methods.clp.presets import CLP_SETTING_KEYS as _CLP_KEYS, CLP_SETTING_WHY as _CLP_WHY

#: The named simulator runs of this method (``streamfl sim --methods NAME``).
PRESETS: List[Method] = []

#: Where SFedPO's and its baselines' figures come from: the latent-state scenario on MNIST-5k in
#: full access, as shipped (``make eval-sfedpo``'s sfedpo-mnist-full; the other three settings vary
#: the dataset and the access).
FIGURES = Figures("configs/scenarios/sfedpo-latent-states.yaml", table="Every setting")

# SFedPO (SFedPO paper) and its baselines (sec. 6): FedAvg rounds as in the paper. ``sfedpo`` is DDS
# admission on the devices' buffers and SAW weights on the coordinator; ``dds-only`` and
# ``saw-only`` are the paper's ablations (SAW off: uniform aggregation; DDS off: every state
# admitted at the budget alpha_n). FedAvg and FedCurv (registered above) keep FIFO buffers.
# ``fedogd``: online FL (Kwon et al. 2023): each round's steps on the newest windows only, here a
# 32-window FIFO buffer (the paper's baselines replace their data with the current state's).
# ``is``: importance sampling (Li et al. 2021) at the same budget. ``adapfedavg`` (Canonaco et al.
# 2021) is the drift baseline. A scenario's ``plugins.sfedpo`` settings apply to each SFedPO method.
PRESETS.append(Method("sfedpo", "SFedPO: distribution-guided admission of each latent state's windows "
                                "(DDS, eq. 10-11, Algorithm 2) and shift-aware aggregation weights (SAW, "
                                "eq. 14) under FedAvg",
                      coordinator=_FEDAVG, plugins={"sfedpo": {}},
                      when="boards move between latent states: 0.7-1.5 points over FedAvg in partial "
                           "access, but 0.3-4.6 behind importance sampling (is); with the agents' "
                           "victim: balanced level with it",
                      figures=FIGURES))
PRESETS.append(Method("dds-only", "SFedPO's DDS admission with uniform FedAvg aggregation (SAW off)",
                      coordinator=_FEDAVG, plugins={"sfedpo": {"saw": False}},
                      when="an ablation: DDS admission alone, within half a point of sfedpo",
                      figures=FIGURES))
PRESETS.append(Method("saw-only", "SFedPO's SAW weights with every state admitted at the budget (DDS off)",
                      coordinator=_FEDAVG, plugins={"sfedpo": {"dds": False}},
                      when="an ablation: SAW weights alone, 0.0-0.8 points over FedAvg",
                      figures=FIGURES))
PRESETS.append(Method("fedogd", "FedOGD: online FL, FedAvg rounds on the newest windows only (a "
                                "32-window buffer; Kwon et al. 2023)",
                      coordinator=_FEDAVG, agent={"buffer_capacity": 32, "min_buffer": 16},
                      when="a baseline: 0.7-1.7 points below FedAvg in SFedPO's runs; its 32-window "
                           "buffer is each board's own setting",
                      figures=FIGURES))
PRESETS.append(Method("sfedpo+adaclp", "SFedPO's DDS and SAW composed with AdaCLP (FedAsync with SAW "
                                       "scaling the mixing weight, CLP probe, CLP hyper-parameters and clocks)",
                      coordinator=_FEDASYNC, plugins={"clp": {}, "sfedpo": {}}, dvfs_policy="clp-aware",
                      when="not recommended: 2.5 to 8.4 points behind sfedpo for 7% less energy",
                      figures=Figures(FIGURES.scenario, table=FIGURES.table, setting_keys=_CLP_KEYS,
                                      why=_CLP_WHY)))
