"""Held-out evaluation of the global model: accuracy and loss per version for metrics.jsonl.

The data is an ``.npz`` in the project's dataset format (DESIGN.md section 7): ``X`` float32
[N, T, C], ``y`` int64 [N] (plus ``subject``, ``classes``). Evaluation runs on the coordinator's one
worker thread with torch limited to one thread so it never starves aggregation or the network.
"""
import logging
from pathlib import Path
from typing import Optional, Tuple

import numpy as np
import torch

from streamfl.errors import ConfigError, SensorError
from streamfl.models import arrays_to_model, build_model
from streamfl.protocol.messages import Tensors
from streamfl.sensors.datasets import load_npz

log = logging.getLogger(__name__)


def load_eval_data(path: Path, spec) -> Tuple[np.ndarray, np.ndarray]:
    """``(X, y)`` from a dataset npz, checked against model ``spec``; ConfigError if unusable."""
    try:
        data = load_npz(path)
    except SensorError as exc:
        raise ConfigError("eval data: %s" % exc) from exc
    x, y = data.X, data.y
    if len(x) == 0:
        raise ConfigError("eval data %s holds no windows" % path)
    if x.shape[1] != spec.window_len or x.shape[2] != spec.in_channels:
        raise ConfigError("eval data %s has windows of %d samples x %d channels, the model takes "
                          "%d x %d" % (path, x.shape[1], x.shape[2], spec.window_len, spec.in_channels))
    if y.max() >= spec.num_classes:
        raise ConfigError("eval data %s has labels up to %d, the model has %d classes" % (
            path, int(y.max()), spec.num_classes))
    return x, y


class Evaluator:
    """Accuracy and mean cross-entropy of given tensors on fixed held-out windows (no grad, batched)."""

    def __init__(self, spec, x: np.ndarray, y: np.ndarray, batch_size: int = 512):
        self.spec = spec
        self.batch_size = int(batch_size)
        self._x = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        self._y = torch.from_numpy(np.ascontiguousarray(y, dtype=np.int64))
        self._model = build_model(spec)
        self._model.eval()
        self.evaluations = 0

    @classmethod
    def from_path(cls, path: Path, spec, batch_size: int = 512) -> "Evaluator":
        x, y = load_eval_data(path, spec)
        log.info("evaluating on %d held-out windows from %s", len(y), path)
        return cls(spec, x, y, batch_size)

    def __len__(self) -> int:
        return int(self._y.shape[0])

    def evaluate(self, tensors: Tensors) -> Tuple[float, float]:
        """``(accuracy, loss)`` of the model given by ``tensors``."""
        arrays_to_model(self._model, tensors)
        correct = 0
        loss_sum = 0.0
        with torch.no_grad():
            for start in range(0, len(self), self.batch_size):
                xb = self._x[start:start + self.batch_size]
                yb = self._y[start:start + self.batch_size]
                logits = self._model(xb)
                loss_sum += float(torch.nn.functional.cross_entropy(logits, yb, reduction="sum"))
                correct += int((logits.argmax(dim=1) == yb).sum())
        self.evaluations += 1
        n = len(self)
        return correct / n, loss_sum / n


def make_evaluator(config) -> Optional[Evaluator]:
    """An Evaluator for ``config.eval_path``, or None when evaluation is off."""
    if not config.eval_path:
        return None
    return Evaluator.from_path(Path(config.eval_path), config.model, config.eval_batch_size)
