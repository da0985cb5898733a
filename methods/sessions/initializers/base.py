"""How a new session's starting model is built: the ``SessionInit`` ABC (methods/sessions/README.md).

When the set of devices changes, the model the last session ended with may be a poor start for the
new one. One construction per file: ``previous`` (keep training the last model: the null object,
it builds nothing), ``average`` (the mean of the saved session models) and ``session-init`` (the
session paper's Algorithm 1: the saved models weighted by how close their session's gradient from
the pilot model is to the new session's). The ``sessions`` coordinator plug-in runs the auxiliary
rounds a construction asks for and puts its model in place.
"""
import abc
from typing import ClassVar, Dict, Optional, Sequence

from streamfl.methods.sessions.initializers.library import SavedSession
from streamfl.protocol.messages import Tensors


class SessionInit(abc.ABC):
    """Builds the starting model of a new session from the saved ones; subclasses set ``name``."""

    #: The ``init`` value that picks this construction in the plug-in's settings.
    name: ClassVar[str] = ""
    #: True if the construction needs the new session's gradient from the pilot model (``g_s``):
    #: the plug-in then runs the auxiliary rounds first.
    needs_gradient: ClassVar[bool] = False
    #: The weight of each saved session (by number) in the last model built; empty where the
    #: construction weighs none (the metrics' ``weights``).
    last_weights: Dict[int, float] = {}

    @abc.abstractmethod
    def build(self, saved: Sequence[SavedSession], gradient: Optional[Tensors]) -> Optional[Tensors]:
        """The new session's starting model, or None to keep training the current one.

        ``saved`` holds the earlier sessions' final models, oldest first; ``gradient`` is the new
        session's ``g_s = w_aux - w_pilot`` (None unless ``needs_gradient``)."""
