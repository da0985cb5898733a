"""``average``: start a session from the mean of the saved session models (the paper's baseline)."""
from typing import Optional, Sequence

from streamfl.methods.sessions.initializers.base import SessionInit
from streamfl.methods.sessions.initializers.library import SavedSession, mean_model
from streamfl.protocol.messages import Tensors


class AverageInit(SessionInit):
    """The unweighted mean of every saved final model (up to H); None before any session ended."""

    name = "average"

    def build(self, saved: Sequence[SavedSession], gradient: Optional[Tensors]) -> Optional[Tensors]:
        return mean_model([s.model for s in saved]) if saved else None
