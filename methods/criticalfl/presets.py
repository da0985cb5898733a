"""CriticalFL's named run (a baseline of AdaCLP)."""
from typing import List

from streamfl.methods.base import FEDAVG as _FEDAVG, Method

#: The named simulator runs of this method (``streamfl sim --methods NAME``).
PRESETS: List[Method] = []

PRESETS.append(Method("criticalfl", "CriticalFL: synchronous rounds whose client count doubles inside "
                                    "the CLP and halves after (Yan et al. 2023)",
                      coordinator=_FEDAVG, plugins={"clp": {"refine_hparams": False}, "criticalfl": {}},
                      when="a baseline of AdaCLP's: 17.1 points below FedAsync in the 30 s "
                           "AdaCLP-regime run (3 seeds, each at its best rate)"))
