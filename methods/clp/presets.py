"""AdaCLP's named runs and its ablations (Table 4), and streamfl's own CLP regulator."""
import dataclasses
from typing import Dict, List, Tuple

from streamfl.methods.base import FEDASYNC as _FEDASYNC, Figures, Method

#: The named simulator runs of this method (``streamfl sim --methods NAME``).
PRESETS: List[Method] = []

#: The CLP probe of the runs behind the CLP methods' figures in AdaCLP's tables
#: (configs/scenarios/adaclp-paper-*.yaml, docs/results.md): eq. 2's window m = 50 and eq. 3's
#: sigma = 0.002, widened from the defaults (m = 10, sigma = 0.01) because per-update traces vary
#: 2-3x and with the defaults the CLP flag flipped on noise (663 segments in 2,741 versions in a
#: trial run of adaclp-extreme; on a fleet, 40 flips in 2.7 minutes). Every method whose figures
#: come from those runs carries it (``Method.measured``), so ``--method NAME`` runs the probe that
#: was measured.
PAPER_PROBE: Dict[str, object] = {"trace_window": 50, "growth_threshold": 0.002}
MEASURED_PROBE = {"plugins": {"clp": PAPER_PROBE}}
#: What AdaCLP's runs set for their own setting, not for the method: a fleet keeps its own.
CLP_SETTING_KEYS: Tuple[str, ...] = (
    "plugins.clp.last_regulated_version", "agent.plugins.clp.initial_lr", "agent.plugins.clp.lr_max",
    "agent.plugins.clp.lr_min", "agent.plugins.clp.initial_batch", "agent.plugins.clp.batch_max")
CLP_SETTING_WHY = ("R_end (last_regulated_version) is scaled to the run's length (3,000 of a 30 s run's "
                   "~5,000 versions; a fleet keeps the paper's 30,000 or sets its own), and eta0, B0 and "
                   "their clamps are the run's hparams (eta0 = lr_max = lr, B0 = batch_max = batch_size, "
                   "as for every method of the table): set them to your coordinator's hparams in the "
                   "boards' agent.plugins.clp")
#: The paper regime's extreme setting, the scenario of AdaCLP's tables.
PAPER_EXTREME = "configs/scenarios/adaclp-paper-extreme.yaml"
MAIN_TABLE = "Extreme setting, smartwatch data"


def paper_figures(name: str, lr: float, table: str = MAIN_TABLE, sets: Tuple[str, ...] = (),
                  setting_keys: Tuple[str, ...] = CLP_SETTING_KEYS, why: str = CLP_SETTING_WHY) -> Figures:
    """The figures of ``name`` from a run of AdaCLP's paper-regime extreme setting at rate ``lr``
    (``make eval-adaclp``: each method at its tuned rate, ``--set method_lr.NAME=LR``)."""
    return Figures(PAPER_EXTREME, sets=("method_lr.%s=%s" % (name, lr),) + tuple(sets), table=table,
                   setting_keys=setting_keys, why=why)


# AdaCLP (AdaCLP paper) and its Table 4 ablations: FedAsync with the federated CLP probe, the devices'
# CLP hyper-parameters, and clocks as the method says. In the simulator a scenario's ``plugins.clp``
# settings (trace_window, growth_threshold, last_regulated_version scaled to the run) apply to each
# of them; on a fleet the name brings the probe of its figures' run (PAPER_PROBE).
PRESETS.append(Method("adaclp", "AdaCLP: FedAsync with the staleness-decayed CLP probe (eq. 2-3), CLP "
                                "hyper-parameters on the devices (eq. 4-6) and CLP-aware DVFS (sec. 4.2)",
                      coordinator=_FEDASYNC, plugins={"clp": {}}, dvfs_policy="clp-aware",
                      when="only where energy matters far more than accuracy: its lowest-level CLP "
                           "clocks cost 19.1 points of mean accuracy for 47% less energy than "
                           "FedAsync (extreme setting, 3 seeds)",
                      measured=MEASURED_PROBE,
                      figures=dataclasses.replace(paper_figures("adaclp", 0.4), elsewhere=(
                          "beside the FedTeddi and ST-EWC compositions with AdaCLP ('FedTeddi composed "
                          "with AdaCLP (FedAsync)', ST-EWC's 'Composed with AdaCLP (FedAsync)') it ran "
                          "with those scenarios' probe, the defaults (trace_window 10, growth_threshold "
                          "0.01), at eta0 0.1; the name carries the main table's"))))
PRESETS.append(Method("adaclp-no-dvfs", "AdaCLP without DVFS: clocks left where they are (Table 4)",
                      coordinator=_FEDASYNC, plugins={"clp": {}}, dvfs_policy="none",
                      when="an ablation: within the spread of FedAsync (-1.0 points) at the same "
                           "energy, so it buys nothing measured",
                      measured=MEASURED_PROBE, figures=paper_figures("adaclp-no-dvfs", 0.4)))
PRESETS.append(Method("adaclp-fixed-low", "AdaCLP at the lowest clock level throughout (Table 4)",
                      coordinator=_FEDASYNC, plugins={"clp": {}}, dvfs_policy="powersave",
                      when="an ablation, not for use: 21.1 points below FedAsync at 40% of its "
                           "energy",
                      measured=MEASURED_PROBE, figures=paper_figures("adaclp-fixed-low", 0.4)))


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
                           "mixes), -1.6 at 55% (synthetic)",
                      measured=MEASURED_PROBE, figures=paper_figures("streamclp", 0.4)))
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
                           "73% of its energy (extreme setting, 3 seeds)",
                      measured=MEASURED_PROBE, figures=paper_figures("streamclp-dvfs", 0.4)))
PRESETS.append(Method("adaclp-efficient-dvfs", "AdaCLP with the same energy-efficient CLP-aware clocks",
                      coordinator=_FEDASYNC, plugins={"clp": {}}, agent=_EFFICIENT_CLOCKS,
                      dvfs_policy="clp-aware",
                      when="AdaCLP with clocks that do not starve it: 2.3 points below FedAsync at "
                           "87% of its energy (extreme setting, 3 seeds)",
                      measured=MEASURED_PROBE, figures=paper_figures("adaclp-efficient-dvfs", 0.4)))
