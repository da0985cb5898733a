"""Fisher trace (AdaCLP eq. 1): the one-backward estimator is unbiased for the exact trace, samples
its labels from the model, and leaves the model (mode, gradients, optimizer) as it found it."""
import numpy as np
import pytest
import torch
from torch import nn

from streamfl.models import ModelSpec, build_model
from streamfl.models.fisher import fisher_trace, fisher_trace_exact

#: Tiny dimensions so 2000 draws run in about a second; float64 so rounding is far below the stderr.
TINY = {
    "mlp": dict(in_channels=2, window_len=3, num_classes=3, hidden=4),
    "lstm": dict(in_channels=2, window_len=4, num_classes=3, hidden=3),
}
DRAWS = 2000


def tiny(name, seed=1, dropout=0.0):
    return build_model(ModelSpec(name=name, **TINY[name]), dropout=dropout, seed=seed).double()


def windows(name, n=6, seed=0):
    d = TINY[name]
    g = torch.Generator().manual_seed(seed)
    # Scaled up so the softmax is far from uniform and the trace not trivially small.
    return 2.0 * torch.randn(n, d["window_len"], d["in_channels"], generator=g, dtype=torch.float64)


def draws(model, X, num_samples=None, n=DRAWS):
    return np.array([fisher_trace(model, X, num_samples, torch.Generator().manual_seed(s))
                     for s in range(n)])


def assert_unbiased(values, exact):
    """Mean of independent draws within 4 standard errors of the exact value, and within 10%.

    Seeds are fixed, so the check is deterministic; 4 stderr is where an honest estimator fails
    once in ~16,000 seedings, and at 2000 draws the stderr is about 2% of the trace here.
    """
    mean = values.mean()
    stderr = values.std(ddof=1) / np.sqrt(len(values))
    assert stderr < 0.05 * exact, "too few draws to judge the bias"
    assert abs(mean - exact) < 4 * stderr, (mean, exact, stderr)
    assert abs(mean - exact) < 0.10 * exact, (mean, exact)


@pytest.mark.parametrize("name", ["mlp", "lstm"])
def test_mean_of_estimates_matches_exact_trace(name):
    model, X = tiny(name), windows(name)
    exact = fisher_trace_exact(model, X)
    assert exact > 0.1
    assert_unbiased(draws(model, X), exact)


def test_subsampled_estimate_is_unbiased_for_the_whole_set():
    model, X = tiny("mlp"), windows("mlp", n=8)
    assert_unbiased(draws(model, X, num_samples=3), fisher_trace_exact(model, X))


def test_exact_trace_matches_closed_form_of_softmax_regression():
    # logits = W x + b: ||grad log p(y|x)||^2 = ||e_y - p||^2 (||x||^2 + 1), so the trace is
    # mean_x (1 - ||p||^2)(||x||^2 + 1).
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(6, 4)).double()
    X = torch.randn(5, 3, 2, dtype=torch.float64)
    p = torch.softmax(model(X), dim=1)
    closed = ((1 - p.pow(2).sum(1)) * (X.flatten(1).pow(2).sum(1) + 1)).mean().item()
    assert fisher_trace_exact(model, X) == pytest.approx(closed, rel=1e-10)


def test_labels_come_from_the_model_not_the_data():
    # Confident on class 0: the model's own labels are almost surely 0 with a vanishing score, so
    # the trace is ~0, while the "empirical Fisher" on any other true label would be large.
    model, X = tiny("mlp"), windows("mlp")
    with torch.no_grad():
        model.head.bias.copy_(torch.tensor([40.0, 0.0, 0.0], dtype=torch.float64))
    log_p = torch.log_softmax(model(X), dim=1)
    grads = torch.autograd.grad(log_p[:, 1].sum(), list(model.parameters()))
    empirical = sum(float(g.pow(2).sum()) for g in grads) / len(X)
    assert empirical > 1.0
    for seed in range(5):
        assert fisher_trace(model, X, generator=torch.Generator().manual_seed(seed)) < 1e-12
    assert fisher_trace_exact(model, X) < 1e-12


def test_num_samples_subsamples_deterministically():
    model, X = tiny("mlp"), windows("mlp", n=8)

    def at(seed, k):
        return fisher_trace(model, X, k, torch.Generator().manual_seed(seed))

    assert at(3, 4) == at(3, 4)
    assert len({at(s, 4) for s in range(10)}) > 5
    # Asking for at least all windows uses all of them, drawing nothing extra from the generator.
    assert at(3, 8) == at(3, 100) == at(3, None)
    with pytest.raises(ValueError):
        at(3, 0)


@pytest.mark.parametrize("name", ["mlp", "lstm"])
def test_eval_mode_used_and_modes_restored(name):
    model, X = tiny(name, dropout=0.5), windows(name)
    model.train()
    model.head.eval()  # a deliberately mixed setup survives too
    torch.manual_seed(0)
    a = fisher_trace(model, X, generator=torch.Generator().manual_seed(7))
    torch.manual_seed(1)  # dropout would draw from the global RNG; eval mode must not
    b = fisher_trace(model, X, generator=torch.Generator().manual_seed(7))
    assert a == b
    assert model.training and model.dropout.training and not model.head.training
    model.eval()
    fisher_trace_exact(model, X)
    assert not any(m.training for m in model.modules())


def test_gradients_and_optimizer_state_untouched():
    model, X = tiny("lstm"), windows("lstm")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(X).sum().backward()
    opt.step()
    params = list(model.parameters())
    params[0].grad = None
    params[1].grad.zero_()
    before_grads = [None if p.grad is None else p.grad.clone() for p in params]
    before_params = [p.detach().clone() for p in params]
    before_state = {k: v["momentum_buffer"].clone() for k, v in enumerate(opt.state.values())}
    fisher_trace(model, X, generator=torch.Generator().manual_seed(0))
    fisher_trace_exact(model, X[:2])
    for p, g, w in zip(params, before_grads, before_params):
        assert (p.grad is None) if g is None else torch.equal(p.grad, g)
        assert torch.equal(p.detach(), w)
    for k, v in enumerate(opt.state.values()):
        assert torch.equal(v["momentum_buffer"], before_state[k])


def test_accepts_numpy_float32_windows_on_a_float32_model():
    spec = ModelSpec(name="lstm", **TINY["lstm"])
    model = build_model(spec, seed=0)
    X = np.random.default_rng(0).normal(size=(5, spec.window_len, spec.in_channels))
    X = X.astype(np.float32)
    value = fisher_trace(model, X, num_samples=4, generator=torch.Generator().manual_seed(0))
    assert np.isfinite(value) and value >= 0.0
    with pytest.raises(ValueError):
        fisher_trace(model, X[:0])
