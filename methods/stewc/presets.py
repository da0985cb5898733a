"""ST-EWC's named runs and TimeEWC."""
from typing import List

from streamfl.methods.base import FEDASYNC as _FEDASYNC, FEDAVG as _FEDAVG, Method

#: The named simulator runs of this method (``streamfl sim --methods NAME``).
PRESETS: List[Method] = []

# ST-EWC (the ST-EWC paper) and its baselines (sec. 5.1): FedAvg (lambda1 = lambda2 = 0) and FedCurv
# (lambda1 = 0) are registered above; TimeEWC is the temporal term alone (lambda2 = 0), ST-EWC both
# (FedCurv's plug-in is the spatial half). Synchronous as in the paper; -async under FedAsync;
# +adaclp composed with the CLP regulator. A scenario's ``plugins.stewc`` settings (the period
# boundary: its schedule, or drift) apply to each.
PRESETS.append(Method("timeewc", "TimeEWC: FedAvg whose devices train with the temporal EWC term "
                                 "lambda1 (P theta - Q) over past periods' T-FDMs (Hashash et al. 2022)",
                      coordinator=_FEDAVG, plugins={"stewc": {}},
                      when="the input domain changes by period and the first must stay usable: "
                           "3.2-5.9 points more of period 1 than FedAvg, 1.3-1.4 points less of the "
                           "average over periods"))
PRESETS.append(Method("stewc", "ST-EWC: FedAvg with the temporal term of past periods' T-FDMs and "
                               "FedCurv's spatial term of the peers' S-FDMs (eq. 12)",
                      coordinator=_FEDAVG, plugins={"fedcurv": {}, "stewc": {}},
                      when="as timeewc, forgetting least on rotated sensors (+6.8 points of period "
                           "1) but 2.2-3.0 points below FedAvg's average; lambda1 was chosen on "
                           "digits"))
PRESETS.append(Method("stewc-async", "ST-EWC's two terms under FedAsync aggregation",
                      coordinator=_FEDASYNC, plugins={"fedcurv": {}, "stewc": {}},
                      when="ST-EWC in an asynchronous fleet: +1.5 to +5.0 points of period 1, 2.7-2.9 "
                           "below FedAvg's average"))
PRESETS.append(Method("stewc+adaclp", "ST-EWC's two terms composed with AdaCLP (FedAsync, CLP probe, "
                                      "CLP hyper-parameters and clocks)",
                      coordinator=_FEDASYNC, plugins={"clp": {}, "fedcurv": {}, "stewc": {}},
                      dvfs_policy="clp-aware",
                      when="not recommended: 9.0 points of the average below AdaCLP alone on "
                           "MNIST-5k, 1.5 on the smartwatch data"))
