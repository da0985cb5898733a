"""``previous``: keep training the last session's model (the session paper's baseline)."""
from typing import Optional, Sequence

from streamfl.methods.sessions.initializers.base import SessionInit
from streamfl.methods.sessions.initializers.library import SavedSession
from streamfl.protocol.messages import Tensors


class PreviousInit(SessionInit):
    """Builds nothing: the fleet goes on from the model it has (the null construction)."""

    name = "previous"

    def build(self, saved: Sequence[SavedSession], gradient: Optional[Tensors]) -> Optional[Tensors]:
        return None
