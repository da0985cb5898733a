"""Session initialization's named runs and the paper's baselines."""
from typing import List

from streamfl.methods.base import FEDASYNC as _FEDASYNC, FEDAVG as _FEDAVG, Method

#: The named simulator runs of this method (``streamfl sim --methods NAME``).
PRESETS: List[Method] = []

# "Session initialization for dynamic devices" (the session-init paper) and its baselines
# (sec. VI): FedAvg rounds as in the paper, the ``sessions`` plug-in ending a session whenever the
# online devices change, and each session starting from the model its ``init`` builds. A
# scenario's ``plugins.sessions`` settings (the trigger, similarity_sharpness) apply to each.
PRESETS.append(Method("previous", "sessions that keep training the last session's model (the session "
                                  "paper's Previous baseline): FedAvg with sessions tracked",
                      coordinator=_FEDAVG, plugins={"sessions": {"init": "previous"}},
                      when="boards come and go but most labels stay (overlap 0.8): the best session "
                           "accuracy there; the reference for the sessions methods"))
PRESETS.append(Method("continuous", "sessions that keep training the last session's model while "
                                    "every round distills toward it (the session paper's Continuous "
                                    "baseline; its relation distillation read as knowledge distillation)",
                      coordinator=_FEDAVG, plugins={"sessions": {"init": "previous"}},
                      agent={"plugins": {"sessions": {"distill_weight": 1.0}}},
                      when="earlier label sets come back and holding on to them matters more than "
                           "learning new ones: the best session accuracy from session 2 on at "
                           "overlap 0 on digits, but poor on a session of new labels"))
PRESETS.append(Method("average", "each session starts from the mean of the saved session models (the "
                                 "session paper's Average baseline)",
                      coordinator=_FEDAVG, plugins={"sessions": {"init": "average"}},
                      when="boards come and go and each session mixes labels anew (overlap 0.2): "
                           "2-3 points more session accuracy than session-init on digits and "
                           "MNIST-5k"))
PRESETS.append(Method("session-init", "each session starts from the saved models weighted by how close "
                                      "their gradient from the pilot model is to the new session's, after "
                                      "one auxiliary round (the session paper's Algorithm 1)",
                      coordinator=_FEDAVG, plugins={"sessions": {"init": "session-init"}},
                      when="boards come and go and earlier label sets come back whole: 95% of its "
                           "peak within 2 rounds at 73-80% of the boundaries (previous: 7-20%); "
                           "worse than previous where most labels stay"))
PRESETS.append(Method("session-init-beside", "session-init with its auxiliary round run beside the "
                                             "global model (ours): the fleet keeps training its model "
                                             "while each board trains one round from the pilot, where "
                                             "the paper serves the pilot as the global model",
                      coordinator=_FEDAVG, plugins={"sessions": {"init": "session-init", "aux_model": "beside"}},
                      when="boards come and go but most labels stay (overlap 0.8): level with "
                           "previous, where session-init loses 1-4 points, at session-init's "
                           "seconds to the target; behind session-init wherever labels come back"))
PRESETS.append(Method("session-init+adaclp", "session-init's starting models composed with AdaCLP "
                                             "(FedAsync, CLP probe, CLP hyper-parameters and clocks)",
                      coordinator=_FEDASYNC, plugins={"clp": {}, "sessions": {"init": "session-init"}},
                      dvfs_policy="clp-aware",
                      when="not recommended: later to the target than session-init under FedAvg "
                           "(39-44 against 33-34 s) for 4-7% less energy"))
