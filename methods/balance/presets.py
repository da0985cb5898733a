"""Class-balanced mixing's named runs (ours)."""
from typing import List

from streamfl.methods.base import FEDASYNC as _FEDASYNC, FEDAVG as _FEDAVG, Method
from streamfl.methods.clp.presets import LEARNED as _LEARNED

#: The named simulator runs of this method (``streamfl sim --methods NAME``).
PRESETS: List[Method] = []

# Class-balanced mixing (methods/balance/coordinator.py): alone; with rests for the devices whose
# update was weighted under 0.25 (5 round intervals: in the extreme setting about one update in
# five, those of the class every device is on); and composed with streamclp and the same rests.
# 0.25 and 5 sit between the rests tried on seeds 0-1 (docs/results.md): 0.2 saved 9% of the
# energy at no cost, 0.3 saved 15% for a point.
_REST = {"rest_below": 0.25, "rest_rounds": 5}
PRESETS.append(Method("fedasync+balance", "FedAsync with class-balanced mixing (ours): updates of the "
                                          "classes the model already holds too much of weigh less",
                      coordinator=_FEDASYNC, plugins={"balance": {}}))
PRESETS.append(Method("fedasync+balance-rest", "fedasync+balance, and a device whose update weighed under "
                                               "0.25 rests 5 round intervals (ours)",
                      coordinator=_FEDASYNC, plugins={"balance": _REST}))
PRESETS.append(Method("streamclp+balance", "streamclp with class-balanced mixing and the same rests (ours)",
                      coordinator=_FEDASYNC, plugins={"clp": {}, "balance": _REST}, agent=_LEARNED,
                      dvfs_policy="none"))
