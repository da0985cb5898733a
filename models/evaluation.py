"""Held-out evaluation of model tensors: the one path the coordinator and the simulator both use.

``Evaluator`` holds fixed windows ``X`` float32 [N, T, C] with labels ``y`` int64 [N] and a model
of ``spec``; given tensors (a global model's) it loads them and computes, batched and without
gradients, the accuracy, the mean cross-entropy and optionally the accuracy on some classes or on
transformed windows. The coordinator builds one from its ``eval_path``; the simulator from each
seed's held-out set. Nothing here may import the coordinator's code: this module sits beside the
models, which agents import too.
"""
from typing import Callable, Collection, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from streamfl.models.registry import build_model
from streamfl.models.serialize import arrays_to_model

#: ``transform(X, period)``: windows as seen in a period (the simulator's domain-incremental streams).
Transform = Callable[[np.ndarray, int], np.ndarray]


class Evaluator:
    """Accuracy and mean cross-entropy of given tensors on fixed held-out windows (no grad, batched)."""

    def __init__(self, spec, X: np.ndarray, y: np.ndarray, batch_size: int = 512):
        self.spec = spec
        self.batch_size = int(batch_size)
        self.X = np.ascontiguousarray(X, dtype=np.float32)
        self.y = np.asarray(y, dtype=np.int64)
        self.model = build_model(spec)
        self.model.eval()
        #: Calls of ``evaluate`` and ``evaluate_classes`` so far.
        self.evaluations = 0

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def evaluate(self, tensors: Dict[str, np.ndarray]) -> Tuple[float, float]:
        """``(accuracy, loss)`` of the model given by ``tensors`` on every held-out window."""
        accuracy, loss, _ = self.evaluate_classes(tensors)
        return accuracy, loss

    def evaluate_classes(self, tensors: Dict[str, np.ndarray], classes: Collection[int] = (),
                         transform: Optional[Transform] = None,
                         period: int = 0) -> Tuple[float, float, Optional[float]]:
        """``(accuracy, loss, accuracy on classes)``; the last is None without such windows.

        ``transform``, when given, maps the windows first (``transform(X, period)``).
        """
        accuracy, loss, on_sets = self.evaluate_sets(tensors, [classes], transform, period)
        return accuracy, loss, on_sets[0]

    def evaluate_sets(self, tensors: Dict[str, np.ndarray], class_sets: Sequence[Collection[int]],
                      transform: Optional[Transform] = None,
                      period: int = 0) -> Tuple[float, float, List[Optional[float]]]:
        """``(accuracy, loss, [accuracy on each class set])`` from one pass over the windows; an
        entry is None when its set is empty or has no windows."""
        arrays_to_model(self.model, tensors)
        X = self.X if transform is None else np.ascontiguousarray(transform(self.X, period), dtype=np.float32)
        preds = np.empty(len(self.y), dtype=np.int64)
        loss_sum = 0.0
        with torch.no_grad():
            for start in range(0, len(self.y), self.batch_size):
                xb = torch.from_numpy(X[start:start + self.batch_size])
                yb = torch.from_numpy(self.y[start:start + self.batch_size])
                logits = self.model(xb)
                loss_sum += float(torch.nn.functional.cross_entropy(logits, yb, reduction="sum"))
                preds[start:start + len(yb)] = logits.argmax(dim=1).numpy()
        self.evaluations += 1
        n = max(1, len(self.y))
        correct = preds == self.y
        on_sets: List[Optional[float]] = []
        for classes in class_sets:
            on = None
            if classes:
                mask = np.isin(self.y, np.fromiter(classes, dtype=np.int64))
                if mask.any():
                    on = float(correct[mask].mean())
            on_sets.append(on)
        return float(correct.mean()), loss_sum / n, on_sets


__all__ = ["Evaluator", "Transform"]
