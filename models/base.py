"""What every streamfl model shares: its spec, its architecture id, and run-time dropout."""
from dataclasses import dataclass

from torch import nn

from streamfl.config import bounded


@dataclass(frozen=True)
class ModelSpec:
    """A model's architecture: registry name plus the data shape it takes ([B, T, C] -> [B, K])."""

    #: Architecture from the model registry: lstm (AdaCLP's one-layer LSTM), cnn1d or mlp; must
    #: match on the agents and the coordinator.
    name: str = "lstm"
    #: Sensor channels per time step (C of a [T, C] window); must equal sensor.channels.
    in_channels: int = bounded(6, 1, 1024)
    #: Time steps per window (T); must equal sensor.window_len.
    window_len: int = bounded(50, 1, 100000)
    #: Output classes (K); at least sensor.num_classes, and labels must be below it.
    num_classes: int = bounded(6, 2, 4096)
    #: Hidden units; 128 as in AdaCLP's one-layer LSTM.
    hidden: int = bounded(128, 1, 10 ** 6)

    @property
    def arch_id(self) -> str:
        """The id every model message carries and every receiver checks against its own."""
        return "%s-c%d-w%d-k%d-h%d" % (self.name, self.in_channels, self.window_len,
                                       self.num_classes, self.hidden)

    def __post_init__(self) -> None:
        for key in ("in_channels", "window_len", "num_classes", "hidden"):
            if getattr(self, key) < 1:
                raise ValueError("model %s must be at least 1" % key)
        if self.num_classes < 2:
            raise ValueError("model num_classes must be at least 2")


class HarModel(nn.Module):
    """A classifier of windows [B, T, C] into K class logits, with one dropout layer settable live."""

    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)

    def set_dropout(self, p: float) -> None:
        """Change the dropout rate between rounds (AdaCLP eq. 6 regulates it)."""
        if not 0.0 <= p < 1.0:
            raise ValueError("dropout must be in [0, 1), got %r" % p)
        self.dropout.p = float(p)
