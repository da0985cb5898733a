"""CriticalFL's named run (a baseline of AdaCLP)."""
from typing import List

from streamfl.methods.base import FEDAVG as _FEDAVG, Method
from streamfl.methods.clp.presets import MEASURED_PROBE as _PROBE, paper_figures

#: The named simulator runs of this method (``streamfl sim --methods NAME``).
PRESETS: List[Method] = []

#: Where AdaCLP's other baselines were measured: the paper regime's extreme setting, periods
#: counted in merged updates, each method at its tuned rate (docs/results.md).
_BASELINES = "The paper's other baselines (3 seeds, each at its best rate)"
_COUNT_UPDATES = ("stream.params.count=updates",)

PRESETS.append(Method("criticalfl", "CriticalFL: synchronous rounds whose client count doubles inside "
                                    "the CLP and halves after (Yan et al. 2023)",
                      coordinator=_FEDAVG, plugins={"clp": {"refine_hparams": False}, "criticalfl": {}},
                      when="a baseline of AdaCLP's: 17.1 points below FedAsync in the 30 s "
                           "AdaCLP-regime run (3 seeds, each at its best rate)",
                      measured=_PROBE,
                      figures=paper_figures("criticalfl", 0.1, table=_BASELINES, sets=_COUNT_UPDATES)))
