"""One labelled window of a multichannel signal: the unit sensors produce and the buffer stores."""
from dataclasses import dataclass

import numpy as np

#: Label of a window whose class is not known (e.g. a live IIO stream with no label source).
UNLABELLED = -1
#: State of a window whose context (a latent state such as at work, at home, driving) nobody says.
UNKNOWN_STATE = -1


@dataclass
class Window:
    """``x`` is float32 [T, C] (time, channels); ``label`` the majority class or ``UNLABELLED``;
    ``state`` the id (>= 0) of the context the window was recorded in, as its source or a method
    resolves it, or ``UNKNOWN_STATE``; buffer policies may admit windows by it."""

    x: np.ndarray
    label: int
    t_s: float = 0.0
    state: int = UNKNOWN_STATE

    def __post_init__(self) -> None:
        self.x = np.asarray(self.x, dtype=np.float32)
        if self.x.ndim != 2:
            raise ValueError("a window must be [T, C], got shape %s" % (self.x.shape,))
        self.label = int(self.label)
        self.state = int(self.state)
        if self.state < UNKNOWN_STATE:
            raise ValueError("a window's state must be >= 0 or UNKNOWN_STATE, got %d" % self.state)
