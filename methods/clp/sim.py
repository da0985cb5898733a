"""The simulator's hooks for AdaCLP: a tuned learning rate is the CLP's rate and its cap alike."""
from typing import Any, Dict


def tuned_lr_settings(lr: float) -> Dict[str, Any]:
    """The agent plug-in's settings for a rate ``streamfl tune`` found: the devices' rate outside
    the critical period (``eta0``) and the cap of the learned one (``lr_max``)."""
    return {"initial_lr": lr, "lr_max": lr}
