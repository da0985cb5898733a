"""Session initialization's named runs and the paper's baselines."""
from typing import List

from streamfl.methods.base import FEDASYNC as _FEDASYNC, FEDAVG as _FEDAVG, Figures, Method
from streamfl.methods.clp.presets import CLP_SETTING_KEYS as _CLP_KEYS, CLP_SETTING_WHY as _CLP_WHY

#: The named simulator runs of this method (``streamfl sim --methods NAME``).
PRESETS: List[Method] = []

#: Where the sessions methods' figures come from: the churn scenario on MNIST-5k (``make
#: eval-sessions``: overlap and Dirichlet alpha varied, the shipped 0.2 and 0.3 here; the
#: Continuous baseline at overlap 0 in eval-sessions-more, the beside variant at 0.8 in
#: eval-sessions-beside), the AdaCLP composition at the baselines' rate 0.1.
_SCENARIO = "configs/scenarios/session-churn.yaml"
_SETTING_KEYS = ("plugins.sessions.settle_s", "plugins.sessions.min_session_s",
                 "agent.plugins.sessions.forget_on_new_session")
_SETTING_WHY = ("settle_s and min_session_s are scaled to the run's 100 s sessions (a fleet's "
                "defaults, 5 s and 60 s, are for shift changes), and forget_on_new_session is on "
                "because the run's boards see new labels with each session, a fact of that fleet")


def _figures(overlap: float = 0.2, table: str = "Every setting: boundaries with a saved session to start from",
             lr_for: str = "") -> Figures:
    sets = ("stream.params.label_overlap=%s" % overlap, "stream.params.dirichlet_alpha=0.3")
    keys, why = _SETTING_KEYS, _SETTING_WHY
    if lr_for:
        sets += ("method_lr.%s=0.1" % lr_for,)
        keys, why = keys + _CLP_KEYS, "%s; %s" % (why, _CLP_WHY)
    return Figures(_SCENARIO, sets=sets, table=table, setting_keys=keys, why=why)

# "Session initialization for dynamic devices" (the session-init paper) and its baselines
# (sec. VI): FedAvg rounds as in the paper, the ``sessions`` plug-in ending a session whenever the
# online devices change, and each session starting from the model its ``init`` builds. A
# scenario's ``plugins.sessions`` settings (the trigger, similarity_sharpness) apply to each.
PRESETS.append(Method("previous", "sessions that keep training the last session's model (the session "
                                  "paper's Previous baseline): FedAvg with sessions tracked",
                      coordinator=_FEDAVG, plugins={"sessions": {"init": "previous"}},
                      when="boards come and go but most labels stay (overlap 0.8): the best session "
                           "accuracy there; the reference for the sessions methods",
                      figures=_figures()))
PRESETS.append(Method("continuous", "sessions that keep training the last session's model while "
                                    "every round distills toward it (the session paper's Continuous "
                                    "baseline; its relation distillation read as knowledge distillation)",
                      coordinator=_FEDAVG, plugins={"sessions": {"init": "previous"}},
                      agent={"plugins": {"sessions": {"distill_weight": 1.0}}},
                      when="earlier label sets come back and holding on to them matters more than "
                           "learning new ones: the best session accuracy from session 2 on at "
                           "overlap 0 on digits, but poor on a session of new labels",
                      figures=_figures(0, "The paper's Continuous baseline, and a setting where relearning "
                                          "is costly")))
PRESETS.append(Method("average", "each session starts from the mean of the saved session models (the "
                                 "session paper's Average baseline)",
                      coordinator=_FEDAVG, plugins={"sessions": {"init": "average"}},
                      when="boards come and go and each session mixes labels anew (overlap 0.2): "
                           "2-3 points more session accuracy than session-init on digits and "
                           "MNIST-5k",
                      figures=_figures()))
PRESETS.append(Method("session-init", "each session starts from the saved models weighted by how close "
                                      "their gradient from the pilot model is to the new session's, after "
                                      "one auxiliary round (the session paper's Algorithm 1)",
                      coordinator=_FEDAVG, plugins={"sessions": {"init": "session-init"}},
                      when="boards come and go and earlier label sets come back whole: 95% of its "
                           "peak within 2 rounds at 73-80% of the boundaries (previous: 7-20%); "
                           "worse than previous where most labels stay",
                      figures=_figures()))
PRESETS.append(Method("session-init-beside", "session-init with its auxiliary round run beside the "
                                             "global model (ours): the fleet keeps training its model "
                                             "while each board trains one round from the pilot, where "
                                             "the paper serves the pilot as the global model",
                      coordinator=_FEDAVG, plugins={"sessions": {"init": "session-init", "aux_model": "beside"}},
                      when="boards come and go but most labels stay (overlap 0.8): level with "
                           "previous, where session-init loses 1-4 points, at session-init's "
                           "seconds to the target; behind session-init wherever labels come back",
                      figures=_figures(0.8, "The auxiliary round beside the global model (ours)")))
PRESETS.append(Method("session-init+adaclp", "session-init's starting models composed with AdaCLP "
                                             "(FedAsync, CLP probe, CLP hyper-parameters and clocks)",
                      coordinator=_FEDASYNC, plugins={"clp": {}, "sessions": {"init": "session-init"}},
                      dvfs_policy="clp-aware",
                      when="not recommended: later to the target than session-init under FedAvg "
                           "(39-44 against 33-34 s) for 4-7% less energy",
                      figures=_figures(lr_for="session-init+adaclp")))
