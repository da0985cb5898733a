"""States as the source says them (``Window.state``), with a fallback for windows that carry none."""
from typing import Optional

from streamfl.methods.sfedpo.latent.base import StateSource
from streamfl.methods.sfedpo.latent.single import SingleState
from streamfl.sensors.window import Window


class GivenStates(StateSource):
    """The window's own state; a window without one gets ``fallback``'s (default: state 0)."""

    name = "given"

    def __init__(self, fallback: Optional[StateSource] = None):
        self.fallback = fallback if fallback is not None else SingleState()
        #: Windows that carried no state of their own.
        self.missing = 0

    def state_of(self, window: Window) -> int:
        if window.state >= 0:
            return window.state
        self.missing += 1
        return self.fallback.state_of(window)

    @property
    def shared_ids(self) -> bool:
        return self.missing == 0
