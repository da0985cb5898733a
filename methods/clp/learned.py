"""streamfl's own CLP rule, ``learned``: slow down once the data in hand is learned, not while it is.

AdaCLP's eq. 4 lowers the learning rate while the global Fisher trace F_G is high, and on
single-class streams F_G is high exactly while a new class is being learned (docs/results.md), so
the paper's rule slows the learning the stream rewards. This rule reads a signal of the device's
own instead: its last round's mean training loss L against ln K, the loss of a chance-level
prediction over K classes (a scale every classifier shares, so nothing is tuned per model):

* rest: below ``rest_loss_frac * ln K`` the global model already fits what this device holds, and
  more rounds on it would only pull the model towards the current class, which is how the others
  are forgotten; the device rests for ``rest_rounds`` round-lengths (idle, which saves energy),
  then trains one round to measure again;
* optionally (``learned_loss_frac`` > 0) lr = eta0 * clamp(L / (learned_loss_frac * ln K),
  lr_min / eta0, 1): the full rate while the data is not yet learned, proportionally less once L
  falls below that level (off by default: resting alone did better, ``ClpAgentConfig``).

It applies while the coordinator's CLP state says ``regulating`` (up to R_end), as eq. 4-6 do.
Pure functions, Python 3.8 (the agent runs on JetPack 5).
"""
import math
from typing import Optional


def learned_lr(loss: Optional[float], num_classes: int, eta0: float, lr_min: float,
               learned_loss_frac: float) -> float:
    """The round's learning rate from the last round's loss; eta0 when there is none yet."""
    if loss is None or not math.isfinite(loss) or num_classes < 2 or learned_loss_frac <= 0:
        return eta0
    level = learned_loss_frac * math.log(num_classes)
    return min(eta0, max(lr_min, eta0 * max(0.0, loss) / level))


def should_rest(loss: Optional[float], num_classes: int, rest_loss_frac: float) -> bool:
    """True when the last round's loss says the device's data is learned (never without one)."""
    if loss is None or not math.isfinite(loss) or num_classes < 2 or rest_loss_frac <= 0:
        return False
    return loss < rest_loss_frac * math.log(num_classes)
