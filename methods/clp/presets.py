"""AdaCLP's named runs and its ablations (Table 4), and streamfl's own CLP regulator."""
from typing import List

from streamfl.methods.base import FEDASYNC as _FEDASYNC, Method

#: The named simulator runs of this method (``streamfl sim --methods NAME``).
PRESETS: List[Method] = []

# AdaCLP (AdaCLP paper) and its Table 4 ablations: FedAsync with the federated CLP probe, the devices'
# CLP hyper-parameters, and clocks as the method says. A scenario's ``plugins.clp`` settings
# (trace_window, growth_threshold, last_regulated_version scaled to the run) apply to each of them.
PRESETS.append(Method("adaclp", "AdaCLP: FedAsync with the staleness-decayed CLP probe (eq. 2-3), CLP "
                                "hyper-parameters on the devices (eq. 4-6) and CLP-aware DVFS (sec. 4.2)",
                      coordinator=_FEDASYNC, plugins={"clp": {}}, dvfs_policy="clp-aware",
                      when="only where energy matters far more than accuracy: its lowest-level CLP "
                           "clocks cost 19.1 points of mean accuracy for 47% less energy than "
                           "FedAsync (extreme setting, 3 seeds)"))
PRESETS.append(Method("adaclp-no-dvfs", "AdaCLP without DVFS: clocks left where they are (Table 4)",
                      coordinator=_FEDASYNC, plugins={"clp": {}}, dvfs_policy="none",
                      when="an ablation: within the spread of FedAsync (-1.0 points) at the same "
                           "energy, so it buys nothing measured"))
PRESETS.append(Method("adaclp-fixed-low", "AdaCLP at the lowest clock level throughout (Table 4)",
                      coordinator=_FEDASYNC, plugins={"clp": {}}, dvfs_policy="powersave",
                      when="an ablation, not for use: 21.1 points below FedAsync at 40% of its "
                           "energy"))


# streamfl's own CLP regulator (methods/clp/learned.py), beside the paper's: the probe (eq. 2-3),
# R_end and eq. 5-6 as AdaCLP, but instead of eq. 4's lower rate while F_G is high (while a class
# is being learned) a device rests once its own data is learned (its last round's loss under
# rest_loss_frac * ln K) for rest_rounds round-lengths. Clocks are left alone (see docs/results.md).
#: The agent settings of streamfl's rule (other methods' presets compose it).
LEARNED = _LEARNED = {"plugins": {"clp": {"lr_rule": "learned"}}}
PRESETS.append(Method("streamclp", "streamfl's CLP regulator (ours): AdaCLP's probe, R_end and eq. 5-6, "
                                   "but devices rest once their own data is learned instead of eq. 4's "
                                   "lower rate while it is learned",
                      coordinator=_FEDASYNC, plugins={"clp": {}}, agent=_LEARNED, dvfs_policy="none",
                      when="to save energy near FedAsync's accuracy where boards' data gets learned: "
                           "-1.8 points at 85% of its energy (extreme), +1.1 at 96% (Dirichlet "
                           "mixes), -1.6 at 55% (synthetic)"))
# The clocks: AdaCLP's clp-aware policy, but the CLP at the board's most energy-efficient level
# and the climb after it capped at 10% over that level's joules per sample (the options
# bench/bench_dvfs_oracle.py finds within 10% of the best fixed level on every shipped board).
EFFICIENT_CLOCKS = _EFFICIENT_CLOCKS = {"dvfs": {"policy_options": {"clp_level": "efficient",
                                                 "climb_energy_ratio": 1.1}}}
PRESETS.append(Method("streamclp-dvfs", "streamclp with CLP-aware clocks at the board's energy-efficient "
                                        "level (clp_level efficient, climb capped at 1.10x its energy)",
                      coordinator=_FEDASYNC, plugins={"clp": {}},
                      agent=dict(_LEARNED, **_EFFICIENT_CLOCKS), dvfs_policy="clp-aware",
                      when="energy first, on boards with a profile: 4.4 points below FedAsync at "
                           "73% of its energy (extreme setting, 3 seeds)"))
PRESETS.append(Method("adaclp-efficient-dvfs", "AdaCLP with the same energy-efficient CLP-aware clocks",
                      coordinator=_FEDASYNC, plugins={"clp": {}}, agent=_EFFICIENT_CLOCKS,
                      dvfs_policy="clp-aware",
                      when="AdaCLP with clocks that do not starve it: 2.3 points below FedAsync at "
                           "87% of its energy (extreme setting, 3 seeds)"))
