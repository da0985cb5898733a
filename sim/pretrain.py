"""A run's version-0 model trained beforehand on some classes: the paper's pre-trained start.

FedTeddi (sec. V-A) starts its new-class frames from a model trained on the earlier classes; the
frames' figures then measure how fast a fleet takes in new classes, not how fast it learns from
scratch. A scenario's ``pretrain`` section trains such a model centrally, once per seed, on the
seed's training windows (never the held-out ones) of the chosen classes, and every method of that
seed starts from it. Its cost (seconds, joules) is not part of any run's figures: it stands for a
model shipped with the boards. How good it is, is: ``pretrain_accuracy`` in each run's figures is
its accuracy on the held-out windows of the classes it saw.
"""
import logging
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from streamfl.config import bounded
from streamfl.protocol.messages import Tensors

log = logging.getLogger(__name__)

#: What ``pretrain.classes`` may name.
CLASS_CHOICES = ("none", "initial", "all")


@dataclass(frozen=True)
class PretrainConfig:
    """How a scenario's version-0 model is trained before the run (``classes: none``: it is not).

    The paper does not give its pre-training, so these are a choice: SGD with momentum 0.9 at lr
    0.05, batches of 64, 40 epochs, enough for the shipped models to level off on the shipped
    datasets' initial classes (``pretrain_accuracy`` shows how far they got). They are the same
    for every method compared, so no method is favoured by them.
    """

    #: none | initial (the stream's ``initial_classes``: new_class_frames' frame 0) | all.
    classes: str = "none"
    epochs: int = bounded(40, 1, 10 ** 4)
    lr: float = bounded(0.05, 0.0, 10.0, lo_open=True)
    momentum: float = bounded(0.9, 0.0, 1.0, hi_open=True)
    batch_size: int = bounded(64, 1, 65536)

    def __post_init__(self) -> None:
        if self.classes not in CLASS_CHOICES:
            raise ValueError("pretrain.classes must be one of %s, got %r"
                             % (", ".join(CLASS_CHOICES), self.classes))

    @property
    def enabled(self) -> bool:
        return self.classes != "none"


def pretrain(spec: Any, X: np.ndarray, y: np.ndarray, config: PretrainConfig,
             seed: int) -> Tensors:
    """The version-0 model (``build_model(spec, seed)``) after ``config.epochs`` of SGD on ``X, y``.

    Deterministic for a seed on any machine: the batch order and torch's own state come from it,
    inside a forked RNG, and it trains on one torch thread (the thread count changes how sums are
    split, so a serial run and a ``--jobs`` worker would otherwise start from models a few bits
    apart); the caller's thread count is given back.
    """
    import torch  # here, not at import: scenarios are read without torch
    from streamfl.models import build_model, model_to_arrays
    if len(y) == 0:
        raise ValueError("pretrain: no training windows of the chosen classes")
    model = build_model(spec, seed=seed)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    order_rng = np.random.default_rng([seed, 0x9E7A])
    Xt = torch.from_numpy(np.ascontiguousarray(X, dtype=np.float32))
    yt = torch.from_numpy(np.asarray(y, dtype=np.int64))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            _epochs(model, opt, Xt, yt, config, order_rng)
    finally:
        torch.set_num_threads(threads)
    model.eval()
    tensors = model_to_arrays(model)
    if not all(np.all(np.isfinite(a)) for a in tensors.values()):
        raise ValueError("pretrain: the model diverged (lr %g too high for this data?)" % config.lr)
    return tensors


def _epochs(model: Any, opt: Any, Xt: Any, yt: Any, config: PretrainConfig,
            order_rng: np.random.Generator) -> None:
    """``config.epochs`` passes of SGD over ``Xt, yt`` in minibatches, a new order each pass."""
    import torch
    for _ in range(config.epochs):
        perm = torch.from_numpy(order_rng.permutation(len(yt)))
        for start in range(0, len(perm), config.batch_size):
            idx = perm[start:start + config.batch_size]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(Xt[idx]), yt[idx])
            loss.backward()
            opt.step()


def held_out_accuracy(spec: Any, tensors: Tensors, X: np.ndarray, y: np.ndarray) -> Optional[float]:
    """Accuracy of ``tensors`` on ``X, y`` (None without windows)."""
    if len(y) == 0:
        return None
    from streamfl.models.evaluation import Evaluator
    return Evaluator(spec, X, y).evaluate(tensors)[0]


def chosen_classes(config: PretrainConfig, meta: Any, num_classes: int) -> Sequence[int]:
    """The classes ``config`` names, from a stream's ``meta`` (``initial``) or all of them."""
    if config.classes == "all":
        return list(range(num_classes))
    initial = (meta or {}).get("initial_classes")
    if initial is None:
        raise ValueError("pretrain.classes: initial needs a stream with initial classes "
                         "(new_class_frames); this stream has none")
    return [int(c) for c in initial]


def select(X: np.ndarray, y: np.ndarray, classes: Sequence[int]) -> Tuple[np.ndarray, np.ndarray]:
    """The windows of ``X, y`` whose class is among ``classes``."""
    keep = np.isin(y, np.asarray(list(classes), dtype=np.int64))
    return X[keep], y[keep]


__all__ = ["CLASS_CHOICES", "PretrainConfig", "pretrain", "held_out_accuracy", "chosen_classes",
           "select"]
