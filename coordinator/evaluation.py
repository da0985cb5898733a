"""The coordinator's held-out evaluation: its ``eval_path`` loaded into the shared ``Evaluator``.

The data is an ``.npz`` in the project's dataset format (``streamfl.sensors.datasets``): ``X`` float32
[N, T, C], ``y`` int64 [N] (plus ``subject``, ``classes``). The accuracy and loss per version that
go to metrics.jsonl come from ``streamfl.models.evaluation.Evaluator``, the evaluation the simulator
uses too. Evaluation runs on the coordinator's one worker thread with torch limited to one thread so
it never starves aggregation or the network.
"""
import logging
from pathlib import Path
from typing import Optional, Tuple

import numpy as np

from streamfl.errors import ConfigError, SensorError
from streamfl.models.evaluation import Evaluator
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


def evaluator_from_path(path: Path, spec, batch_size: int = 512) -> Evaluator:
    """An ``Evaluator`` on the windows of the dataset npz at ``path``, checked against ``spec``."""
    x, y = load_eval_data(path, spec)
    log.info("evaluating on %d held-out windows from %s", len(y), path)
    return Evaluator(spec, x, y, batch_size)


def make_evaluator(config) -> Optional[Evaluator]:
    """An Evaluator for ``config.eval_path``, or None when evaluation is off."""
    if not config.eval_path:
        return None
    return evaluator_from_path(Path(config.eval_path), config.model, config.eval_batch_size)


__all__ = ["Evaluator", "evaluator_from_path", "load_eval_data", "make_evaluator"]
