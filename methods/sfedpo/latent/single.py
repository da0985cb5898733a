"""The null source: every window is of state 0 (DDS then admits every window at the budget)."""
from streamfl.methods.sfedpo.latent.base import StateSource
from streamfl.sensors.window import Window


class SingleState(StateSource):
    """One state for everything: uniform sampling at the budget, the paper's DDS ablation."""

    name = "single"

    def state_of(self, window: Window) -> int:
        return 0
