"""ST-EWC's named runs and TimeEWC."""
from typing import List

from streamfl.methods.base import FEDASYNC as _FEDASYNC, FEDAVG as _FEDAVG, Figures, Method
from streamfl.methods.clp.presets import CLP_SETTING_KEYS as _CLP_KEYS, CLP_SETTING_WHY as _CLP_WHY

#: The named simulator runs of this method (``streamfl sim --methods NAME``).
PRESETS: List[Method] = []

#: Where ST-EWC's figures come from: the domain-incremental scenario on MNIST-5k (``make
#: eval-stewc``'s stewc-mnist; the smartwatch table adds --set data.dataset=watch), and the
#: composition with AdaCLP at the baselines' rate 0.1 (stewc-mnist-adaclp).
_SCENARIO = "configs/scenarios/stewc-domain-incremental.yaml"
_SETTING_KEYS = ("plugins.stewc.boundary", "plugins.stewc.period_s")
_SETTING_WHY = ("the run's period boundaries are the scenario's own schedule (every 100 s), known to "
                "the simulator; a fleet finds its periods from the boards' drift reports (the "
                "default, measured in 'Periods found from the devices' drift reports') or states "
                "its own schedule")
_FIGURES = Figures(_SCENARIO, table="MNIST-5k (PermutedMNIST)", setting_keys=_SETTING_KEYS, why=_SETTING_WHY)

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
                           "average over periods",
                      figures=_FIGURES))
PRESETS.append(Method("stewc", "ST-EWC: FedAvg with the temporal term of past periods' T-FDMs and "
                               "FedCurv's spatial term of the peers' S-FDMs (eq. 12)",
                      coordinator=_FEDAVG, plugins={"fedcurv": {}, "stewc": {}},
                      when="as timeewc, forgetting least on rotated sensors (+6.8 points of period "
                           "1) but 2.2-3.0 points below FedAvg's average; lambda1 was chosen on "
                           "digits",
                      figures=_FIGURES))
PRESETS.append(Method("stewc-async", "ST-EWC's two terms under FedAsync aggregation",
                      coordinator=_FEDASYNC, plugins={"fedcurv": {}, "stewc": {}},
                      when="ST-EWC in an asynchronous fleet: +1.5 to +5.0 points of period 1, 2.7-2.9 "
                           "below FedAvg's average",
                      figures=_FIGURES))
PRESETS.append(Method("stewc+adaclp", "ST-EWC's two terms composed with AdaCLP (FedAsync, CLP probe, "
                                      "CLP hyper-parameters and clocks)",
                      coordinator=_FEDASYNC, plugins={"clp": {}, "fedcurv": {}, "stewc": {}},
                      dvfs_policy="clp-aware",
                      when="not recommended: 9.0 points of the average below AdaCLP alone on "
                           "MNIST-5k, 1.5 on the smartwatch data",
                      figures=Figures(_SCENARIO, sets=("method_lr.stewc+adaclp=0.1",),
                                      table="Composed with AdaCLP (FedAsync)",
                                      setting_keys=_SETTING_KEYS + _CLP_KEYS,
                                      why="%s; %s" % (_SETTING_WHY, _CLP_WHY))))
