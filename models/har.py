"""The activity-recognition models in the registry: one-layer LSTM (AdaCLP), 1-D CNN and MLP."""
import torch
from torch import nn

from streamfl.models.base import HarModel, ModelSpec


class LstmClassifier(HarModel):
    """One LSTM layer over time, dropout, a linear head on the last hidden state (AdaCLP sec. 5)."""

    def __init__(self, spec: ModelSpec, dropout: float = 0.0):
        super().__init__(dropout)
        self.lstm = nn.LSTM(spec.in_channels, spec.hidden, batch_first=True)
        self.head = nn.Linear(spec.hidden, spec.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, (h_n, _) = self.lstm(x)
        return self.head(self.dropout(h_n[-1]))


class Cnn1dClassifier(HarModel):
    """Two 1-D convolutions over time and global average pooling: cheap on a Pi's CPU."""

    def __init__(self, spec: ModelSpec, dropout: float = 0.0):
        super().__init__(dropout)
        width = max(16, spec.hidden // 2)
        self.conv1 = nn.Conv1d(spec.in_channels, width, kernel_size=5, padding=2)
        self.conv2 = nn.Conv1d(width, spec.hidden, kernel_size=5, padding=2)
        self.head = nn.Linear(spec.hidden, spec.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv1(x.transpose(1, 2)))
        h = torch.relu(self.conv2(h)).mean(dim=2)
        return self.head(self.dropout(h))


class MlpClassifier(HarModel):
    """Flattened window through two hidden layers: the smallest baseline."""

    def __init__(self, spec: ModelSpec, dropout: float = 0.0):
        super().__init__(dropout)
        self.fc1 = nn.Linear(spec.in_channels * spec.window_len, spec.hidden)
        self.fc2 = nn.Linear(spec.hidden, spec.hidden)
        self.head = nn.Linear(spec.hidden, spec.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x.flatten(1)))
        h = torch.relu(self.fc2(h))
        return self.head(self.dropout(h))
