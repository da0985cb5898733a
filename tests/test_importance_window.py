"""Per-window importance sampling (the SFedPO paper's IS baseline, after Li et al. 2021): each
window admitted by its own gradient norm at a mean of the budget, the least important candidate
evicted, a copy of the trained model scoring, and the forward passes charged to the round."""
import numpy as np
import pytest
import torch

from streamfl.agent.buffer import Buffer
from streamfl.agent.buffer_policies.base import ReplacementPolicy
from streamfl.agent.plugins.base import RoundContext
from streamfl.errors import ProtocolError
from streamfl.methods.importance.agent import ImportanceAgentConfig, ImportanceAgentPlugin, logit_gradient_norms
from streamfl.methods.importance.buffer_policy import ImportancePolicy
from streamfl.methods.importance.payloads import ImportanceTerms
from streamfl.methods.importance.window_policy import WindowImportancePolicy
from streamfl.models import ModelSpec, build_model, model_to_arrays
from streamfl.protocol.messages import GlobalModel

T, C, K = 4, 2, 3


def value_scorer(X, y):
    """A stand-in for the model: a window's importance is its first value."""
    return np.asarray(X, dtype=np.float64)[:, 0, 0].copy()


def window(value):
    return np.full((T, C), value, dtype=np.float32)


def full_buffer(policy, capacity=8, values=None):
    buf = Buffer(capacity, T, C, K, policy=policy)
    for i, v in enumerate(values if values is not None else [1.0] * capacity):
        assert buf.add(window(v), i % K)
    return buf


def admitted_share(policy, buf, values, n=4000):
    """Share of ``n`` offers of each value in ``values`` the policy admits (the buffer unchanged)."""
    out = {}
    for v in values:
        out[v] = sum(policy.admit(0, buf, window=window(v)) for _ in range(n)) / n
    return out


def test_before_any_model_windows_are_admitted_at_the_budget_and_nothing_is_scored():
    policy = WindowImportancePolicy(seed=1, budget=0.3)
    buf = full_buffer(policy)
    share = admitted_share(policy, buf, [0.1, 5.0])
    assert share[0.1] == pytest.approx(0.3, abs=0.03) and share[5.0] == pytest.approx(0.3, abs=0.03)
    assert policy.scored == 0 and 0 <= policy.victim(0, buf) < buf.capacity


def test_a_window_is_admitted_in_proportion_to_its_importance_at_a_mean_of_the_budget():
    policy = WindowImportancePolicy(seed=2, budget=0.3, mean_windows=64)
    policy.scorer = value_scorer
    buf = full_buffer(policy)
    rng = np.random.default_rng(0)
    values = rng.choice([0.5, 1.0, 2.0], size=6000)
    kept = np.asarray([policy.admit(0, buf, window=window(v)) for v in values])
    assert kept.mean() == pytest.approx(0.3, abs=0.03)           # the budget, on average
    rate = {v: kept[values == v].mean() for v in (0.5, 1.0, 2.0)}
    # mean importance 7/6: rates 0.3 * v / (7/6), i.e. 0.129, 0.257, 0.514
    for v, r in rate.items():
        assert r == pytest.approx(0.3 * v / (3.5 / 3), abs=0.04), rate
    assert policy.scored == len(values)


def test_a_window_well_above_the_mean_is_always_admitted():
    policy = WindowImportancePolicy(seed=3, budget=0.5, mean_windows=8)
    policy.scorer = value_scorer
    buf = full_buffer(policy)
    kept = []
    for _ in range(20):
        for _ in range(20):
            policy.admit(0, buf, window=window(1.0))
        kept.append(policy.admit(0, buf, window=window(10.0)))   # 0.5 * 10 / (1 + 9/8) > 1
    assert all(kept)


def test_the_least_important_candidate_is_evicted():
    policy = WindowImportancePolicy(seed=4, candidates=64)
    policy.scorer = value_scorer
    values = [3.0, 2.0, 5.0, 0.25, 4.0, 6.0, 1.0, 7.0]
    buf = full_buffer(policy, values=values)
    # 64 draws from 8 slots miss slot 3 with probability (7/8)^64 < 2e-4.
    assert policy.victim(0, buf) == 3 and policy.scored == 64


def test_an_unscorable_window_is_admitted_at_the_budget_and_an_unscorable_slot_is_kept():
    policy = WindowImportancePolicy(seed=5, budget=0.4, candidates=64)
    policy.scorer = value_scorer
    buf = full_buffer(policy, values=[np.nan, 2.0, np.inf, 1.0, 3.0, 4.0, 5.0, 6.0])
    share = admitted_share(policy, buf, [np.nan], n=3000)[np.nan]
    assert share == pytest.approx(0.4, abs=0.04) and policy.mean == 0.0
    assert policy.victim(0, buf) == 3


def test_the_same_seed_and_scores_keep_the_same_windows():
    def run():
        policy = WindowImportancePolicy(seed=6)
        policy.scorer = value_scorer
        buf = Buffer(8, T, C, K, policy=policy)
        rng = np.random.default_rng(1)
        for i in range(300):
            buf.add(window(float(rng.random())), i % K)
        return buf.X.copy()
    assert np.array_equal(run(), run())


def test_the_buffer_shows_the_policy_the_window_it_is_offered():
    seen = []

    class Recording(ReplacementPolicy):
        def admit(self, label, buffer, state=-1, window=None):
            seen.append(None if window is None else float(window[0, 0]))
            return True

        def victim(self, label, buffer):
            return 0

    buf = Buffer(2, T, C, K, policy=Recording())
    for v in (1.0, 2.0, 3.0):
        buf.add(window(v), 0)
    assert seen == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("bad", [dict(budget=0.0), dict(budget=1.5), dict(candidates=0), dict(mean_windows=0)])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        WindowImportancePolicy(**bad)


# ---- the device plug-in -------------------------------------------------------------------------

SPEC = ModelSpec(name="mlp", in_channels=C, window_len=T, num_classes=K, hidden=8)


def terms_model(per_window):
    model = build_model(SPEC, seed=0)
    return GlobalModel(version=1, arch_id=SPEC.arch_id, tensors=model_to_arrays(model),
                       extras={ImportanceTerms.KIND: ImportanceTerms(0.5, 8, per_window)})


def round_ctx(model, round_index=0):
    return RoundContext(model=model, tensors=model_to_arrays(model), round_index=round_index, seed=0,
                        sample=lambda n: (np.zeros((n, T, C), np.float32), np.zeros(n, np.int64)),
                        buffer_len=8, num_classes=K)


def test_the_plugin_lends_the_policy_the_terms_name_and_switches_when_they_change():
    plugin = ImportanceAgentPlugin(ImportanceAgentConfig())
    assert isinstance(plugin.on_model_received(terms_model(True), {}).buffer_policy, WindowImportancePolicy)
    assert isinstance(plugin.on_model_received(terms_model(False), {}).buffer_policy, ImportancePolicy)


def test_after_a_round_a_copy_of_the_trained_model_scores_windows_and_the_passes_are_charged():
    plugin = ImportanceAgentPlugin(ImportanceAgentConfig())
    policy = plugin.on_model_received(terms_model(True), {}).buffer_policy
    model = build_model(SPEC, seed=3)
    assert plugin.after_round(round_ctx(model)) == []              # nothing scored before it
    X = np.random.default_rng(0).normal(size=(5, T, C)).astype(np.float32)
    y = np.asarray([0, 1, 2, 0, 1])
    model.eval()
    expected = logit_gradient_norms(model, X, y)
    probs = torch.softmax(model(torch.as_tensor(X)), dim=1).detach().numpy()
    assert np.allclose(expected, np.linalg.norm(probs - np.eye(K)[y], axis=1))
    assert np.allclose(policy.scorer(X, y), expected)
    with torch.no_grad():                                          # the next round trains the model
        for p in model.parameters():
            p.add_(1.0)
    assert np.allclose(policy.scorer(X, y), expected)              # the copy scores as before
    buf = full_buffer(policy, values=[0.1 * i for i in range(8)])
    for _ in range(10):
        policy.admit(0, buf, window=window(0.5))
    policy.victim(0, buf)
    stats = plugin.after_round(round_ctx(model, 1))
    assert [s.batched_windows for s in stats] == [10 + 8]
    assert plugin.after_round(round_ctx(model, 2)) == []           # charged once


def test_the_terms_carry_the_choice_and_refuse_anything_but_a_boolean():
    terms = ImportanceTerms(0.4, 4, True)
    assert ImportanceTerms.parse(terms.fields(), {}) == terms
    assert ImportanceTerms.parse({"budget": 0.4, "candidates": 4}, {}).per_window is False
    for bad in (1, "true", None):
        with pytest.raises(ProtocolError):
            ImportanceTerms.parse(dict(terms.fields(), per_window=bad), {})
