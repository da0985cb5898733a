"""FedCurv's named runs: synchronous, under FedAsync, and composed with the CLP regulator."""
from typing import List

from streamfl.methods.base import FEDASYNC as _FEDASYNC, FEDAVG as _FEDAVG, Method
from streamfl.methods.base import Figures
from streamfl.methods.clp.presets import LEARNED as _LEARNED, MEASURED_PROBE as _PROBE, paper_figures

#: The named simulator runs of this method (``streamfl sim --methods NAME``).
PRESETS: List[Method] = []

#: Where AdaCLP's other baselines were measured: the paper regime's extreme setting, periods
#: counted in merged updates, each method at its tuned rate (docs/results.md).
_BASELINES = "The paper's other baselines (3 seeds, each at its best rate)"
_COUNT_UPDATES = ("stream.params.count=updates",)

# The AdaCLP paper's other baselines (AdaCLP paper, sec. 5.1): FedCurv (synchronous, the U/V sums of
# methods/fedcurv), AFedCurv (the same penalty under FedAsync), CriticalFL (synchronous; twice the
# clients per round inside the CLP, half outside) and FedCurv+CLP (FedCurv with the CLP regulator).
PRESETS.append(Method("fedcurv", "FedCurv: synchronous FedAvg whose devices train with the peers' Fisher-"
                                 "weighted penalty (Shoham et al. 2019)",
                      coordinator=_FEDAVG, plugins={"fedcurv": {}},
                      when="a baseline: 1.0-1.8 points of the average over periods below FedAvg in "
                           "ST-EWC's runs, for 31% more training energy",
                      figures=Figures("configs/scenarios/stewc-domain-incremental.yaml",
                                      table="MNIST-5k (PermutedMNIST)")))
PRESETS.append(Method("afedcurv", "AFedCurv: FedCurv's penalty under FedAsync aggregation",
                      coordinator=_FEDASYNC, plugins={"fedcurv": {}},
                      when="a baseline: 4.6 points below FedAsync in the AdaCLP regime (3 seeds, "
                           "each at its best rate)",
                      figures=paper_figures("afedcurv", 0.4, table=_BASELINES, sets=_COUNT_UPDATES,
                                            setting_keys=(), why="")))
PRESETS.append(Method("fedcurv+clp", "FedCurv with the CLP regulator: synchronous FedCurv, devices refine "
                                     "lr, batch size and dropout from the CLP state (eq. 4-6)",
                      coordinator=_FEDAVG, plugins={"fedcurv": {}, "clp": {}},
                      when="a baseline of AdaCLP's: 22.0 points below FedAsync in the 30 s "
                           "AdaCLP-regime run (3 seeds, each at its best rate; too few "
                           "synchronous rounds)",
                      measured=_PROBE,
                      figures=paper_figures("fedcurv+clp", 0.4, table=_BASELINES, sets=_COUNT_UPDATES)))


PRESETS.append(Method("streamclp+fedcurv", "streamclp composed with FedCurv's penalty (a regularizer "
                                           "and the CLP regulator in one fleet)",
                      coordinator=_FEDASYNC, plugins={"clp": {}, "fedcurv": {}}, agent=_LEARNED,
                      dvfs_policy="none",
                      when="not recommended: the penalty cost streamclp 3.6 points (0.445 against "
                           "0.481, one exploratory seed)",
                      measured=_PROBE,
                      figures=paper_figures("streamclp+fedcurv", 0.2, table="Why: what limits each method here")))
