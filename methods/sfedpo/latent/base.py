"""Where a window's latent state comes from: one ``StateSource`` per agent (SFedPO sec. 3.1).

SFedPO's oracle and buffer admission need the state (at work, at home, driving) each window was
recorded in. A source may say it (``Window.state``: a scenario, replay metadata, an MQTT sensor
field), or the device infers it online; ``state_of`` returns a state id >= 0, or -1 when there is
none to be had (such windows are admitted at the plain budget).
"""
import abc
from typing import ClassVar

from streamfl.sensors.window import Window


class StateSource(abc.ABC):
    """Gives each window, in stream order, the id of the latent state it belongs to."""

    #: The registry name (``states`` in the ``sfedpo`` agent plug-in's settings).
    name: ClassVar[str] = ""

    @abc.abstractmethod
    def state_of(self, window: Window) -> int:
        """The window's state id (>= 0), or -1; called once per window, in order (keep it cheap)."""

    @property
    def shared_ids(self) -> bool:
        """True when ids mean the same state on every device (the fleet can count them)."""
        return False
