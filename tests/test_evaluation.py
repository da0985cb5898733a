"""The one held-out evaluation the coordinator and the simulator share (streamfl.models.evaluation)."""
import numpy as np
import pytest
import torch

from streamfl.models import ModelSpec, build_model, model_to_arrays
from streamfl.models.evaluation import Evaluator

SPEC = ModelSpec(name="mlp", in_channels=3, window_len=4, num_classes=3, hidden=8)


def _data(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 4, 3)).astype(np.float32), rng.integers(0, 3, n).astype(np.int64)


def test_accuracy_loss_and_accuracy_on_classes_match_a_direct_computation():
    x, y = _data()
    model = build_model(SPEC, seed=1)
    tensors = model_to_arrays(model)
    ev = Evaluator(SPEC, x, y, batch_size=7)
    with torch.no_grad():
        logits = model.eval()(torch.from_numpy(x))
    correct = logits.argmax(1).numpy() == y
    accuracy, loss, on_classes = ev.evaluate_classes(tensors, {0, 2})
    assert accuracy == pytest.approx(float(correct.mean()))
    assert loss == pytest.approx(float(torch.nn.functional.cross_entropy(logits, torch.from_numpy(y))),
                                 rel=1e-5)
    assert on_classes == pytest.approx(float(correct[np.isin(y, [0, 2])].mean()))
    # The coordinator's call gives the same two numbers, bit for bit.
    assert ev.evaluate(tensors) == (accuracy, loss)
    assert ev.evaluations == 2 and len(ev) == 40


def test_no_window_of_the_classes_and_a_transform():
    x, y = _data()
    y[:] = 1
    tensors = model_to_arrays(build_model(SPEC, seed=2))
    ev = Evaluator(SPEC, x, y)
    assert ev.evaluate_classes(tensors, {0})[2] is None
    flipped = Evaluator(SPEC, -x, y)
    assert ev.evaluate_classes(tensors, (), lambda X, p: -X if p else X, period=1) == \
        flipped.evaluate_classes(tensors)
