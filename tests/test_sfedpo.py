"""SFedPO (SFedPO paper, sec. 5): the oracle, DDS's shares (eq. 10-11, Algorithm 2), s_n (eq. 12),
the admission policy, the device plug-in on a real AgentCore, SAW (eq. 14) on a real
CoordinatorCore under FedAvg and FedAsync, and the payloads refusing hostile values."""
import math

import numpy as np
import pytest

from factories import make_global_model, make_hello, make_update
from streamfl.agent.buffer import Buffer
from streamfl.methods.sfedpo.buffer_policy import DdsPolicy
from streamfl.agent.config import AgentConfig
from streamfl.agent.core import AgentCore
from streamfl.methods.sfedpo.dds import (DirichletOracle, dds_rates, dds_scores, heterogeneity_score,
                                        population_weights, replaced_per_step)
from streamfl.methods.sfedpo.agent import SfedpoAgentConfig
from streamfl.config import build
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.core import CoordinatorCore
from streamfl.methods.sfedpo.coordinator import SfedpoConfig
from streamfl.errors import ProtocolError
from streamfl.models import ModelSpec
from streamfl.methods.importance.payloads import ImportanceTerms
from streamfl.methods.sfedpo.payloads import SfedpoReport, SfedpoTerms
from streamfl.sensors.window import Window

SPEC = ModelSpec(name="mlp", in_channels=2, window_len=4, num_classes=4, hidden=8)


# ---- the math ---------------------------------------------------------------------------------

def test_the_oracle_is_the_dirichlet_posterior_mean():
    oracle = DirichletOracle(num_classes=4, prior=1.0)
    for _ in range(6):
        oracle.observe(0, 1)
    oracle.observe(2, 3)
    states = oracle.states(also=[5])
    assert states == [0, 2, 5]
    assert oracle.pi_hat(states) == pytest.approx([7 / 10, 2 / 10, 1 / 10])
    assert not oracle.observe(-1, 0) and oracle.counts == {0: 6, 2: 1}


def test_divergence_is_kl_from_uniform_of_the_smoothed_class_mix():
    oracle = DirichletOracle(num_classes=4, class_prior=0.0)
    for c in range(4):
        oracle.observe(0, c)
    for _ in range(10):
        oracle.observe(1, 2)
    d = oracle.divergence([0, 1, 9])
    assert d[0] == pytest.approx(0.0, abs=1e-12)
    assert d[1] == pytest.approx(math.log(4))        # one class only: the largest divergence
    assert d[2] == 0.0                               # never seen
    smoothed = DirichletOracle(num_classes=4, class_prior=1.0)
    smoothed.observe(0, 2)
    p = np.array([1, 1, 2, 1]) / 5.0
    assert smoothed.divergence([0])[0] == pytest.approx(float(np.sum(p * np.log(p * 4))))


def test_oracle_is_bounded_and_round_trips():
    oracle = DirichletOracle(num_classes=3, max_states=2)
    assert oracle.observe(0, 0) and oracle.observe(1, 1) and not oracle.observe(2, 2)
    assert oracle.overflow == 1
    again = DirichletOracle(num_classes=3, max_states=2)
    again.load_state(oracle.state())
    assert again.counts == oracle.counts and again.divergence([0, 1]) == pytest.approx(oracle.divergence([0, 1]))


def test_eq10_score_at_known_points():
    pi = np.array([0.5, 0.5])
    s = dds_scores(pi, w=np.array([0.6, 0.4]), d=np.array([0.0, 1.0]), budget=0.5, a1=0.2, b1=0.3)
    assert s == pytest.approx([(0.6 + 0.3) / 1.5, (0.4 - 0.2 + 0.3) / 1.5])
    # The practical form's ratio: alpha/(1 - alpha) = 3 at alpha = 0.75.
    s = dds_scores(np.array([1.0]), np.array([1.0]), np.array([0.0]), 0.75, 0.0, 0.0)
    assert s == pytest.approx([1.0 / 4.0])


def test_shares_are_normalized_to_the_budget_and_favour_rare_balanced_states():
    pi = np.array([0.7, 0.2, 0.1])
    w = np.full(3, 1 / 3)
    d = np.array([2.0, 0.1, 0.1])
    alpha = dds_rates(pi, dds_scores(pi, w, d, 0.5, 0.15, 0.25), 0.5)
    assert float(np.sum(pi * alpha)) == pytest.approx(0.5)
    assert alpha[0] < alpha[1] < alpha[2] <= 1.0  # frequent and skewed least, rare and balanced most


def test_algorithm2_clips_at_one_and_hands_the_rest_to_the_others():
    pi = np.array([0.05, 0.95])
    scores = np.array([10.0, 1.0])
    alpha = dds_rates(pi, scores, 0.5)
    assert alpha[0] == 1.0                      # eq. 11 would give 0.5 * 10 / 1.45 > 1
    assert float(np.sum(pi * alpha)) == pytest.approx(0.5)
    assert alpha[1] == pytest.approx(0.45 / 0.95)


def test_relu_and_all_negative_scores():
    pi = np.array([0.5, 0.5])
    assert dds_rates(pi, np.array([1.0, -3.0]), 0.4) == pytest.approx([0.8, 0.0])
    assert dds_rates(pi, np.array([-1.0, -3.0]), 0.4) == pytest.approx([0.4, 0.4])  # Algorithm 2 l. 8
    unseen = dds_rates(np.array([1.0, 0.0]), np.array([1.0, 5.0]), 0.3)
    assert unseen == pytest.approx([0.3, 0.3])  # pi = 0: admitted at the budget
    with pytest.raises(ValueError):
        dds_rates(pi, np.ones(2), 1.0)


def test_heterogeneity_score_eq12_at_a_known_point():
    pi, alpha, d, w = np.array([0.5, 0.5]), np.array([0.4, 0.6]), np.array([1.0, 0.0]), np.array([0.5, 0.5])
    a_n = 0.5
    beta = 0.5 * 0.4 * 1.0
    beta_p = 2 * (0.5 * 0.16 + 0.5 * 0.36) - (0.25 * 0.16 + 0.25 * 0.36) + a_n ** 2
    gamma = sum((1 - a_n) ** t for t in range(1, 4)) / 3
    mix = (0.5 * 0.4 / a_n - 0.5) ** 2 + (0.5 * 0.6 / a_n - 0.5) ** 2
    expected = 0.1 + beta / a_n * (1 - gamma) + 2 * 2.0 * gamma * beta_p / (1 - (1 - a_n) ** 2) \
        + 2 * 2.0 * gamma * mix
    assert heterogeneity_score(pi, alpha, d, w, local_steps=3, g=2.0, l_eta_sigma2=0.1) == pytest.approx(expected)


def test_admission_chances_become_eq1s_per_step_shares():
    # 40 windows offered to a full buffer of 400 over a 5-step round: each admitted window
    # replaces 1/400 of it, so a state admitted with chance 0.5 replaces 0.5*40/400/5 = 1% a step.
    per_step = replaced_per_step(np.array([0.5, 0.25]), 40, 400, 5)
    assert per_step == pytest.approx([0.01, 0.005])
    # eq. 7's gamma_n on them is near 1 (the buffer mostly holds old data), not the 0.19 that
    # the admission chances themselves would give with T = 5.
    pi, d, w = np.array([0.5, 0.5]), np.array([1.0, 0.0]), np.array([0.5, 0.5])
    alpha_n = float(pi @ per_step)
    gamma = sum((1 - alpha_n) ** t for t in range(1, 6)) / 5
    assert gamma == pytest.approx(0.978, abs=1e-3)
    beta = float(pi @ (per_step * d))
    beta_p = 2 * float(pi @ per_step ** 2) - float(pi ** 2 @ per_step ** 2) + alpha_n ** 2
    mix = float(np.sum((pi * per_step / alpha_n - w) ** 2))
    expected = beta / alpha_n * (1 - gamma) + 2 * gamma * beta_p / (1 - (1 - alpha_n) ** 2) + 2 * gamma * mix
    assert heterogeneity_score(pi, per_step, d, w, 5) == pytest.approx(expected)
    with pytest.raises(ValueError):
        replaced_per_step(np.array([0.5]), 10, 0, 5)


def test_a_buffer_that_did_not_turn_over_scores_eq12s_limit():
    pi, d, w = np.array([0.7, 0.3]), np.array([1.0, 0.2]), np.array([0.5, 0.5])
    admission = np.array([0.4, 0.9])
    still = heterogeneity_score(pi, replaced_per_step(admission, 0, 100, 5), d, w, 5)
    shares = pi * admission / float(pi @ admission)  # gamma_n = 1: only the mismatch is left
    assert still == pytest.approx(2 * float(np.sum((shares - w) ** 2)), abs=1e-8)
    slow = heterogeneity_score(pi, replaced_per_step(admission, 1, 10 ** 6, 5), d, w, 5)
    assert slow == pytest.approx(still, abs=1e-6)  # continuous at the limit


def test_a_device_stuck_in_one_skewed_state_scores_higher():
    w = np.full(4, 0.25)
    d = np.array([2.0, 2.0, 0.1, 0.1])
    wide = heterogeneity_score(np.full(4, 0.25), np.full(4, 0.5), d, w, 5)
    narrow = heterogeneity_score(np.array([0.97, 0.01, 0.01, 0.01]), np.full(4, 0.5), d, w, 5)
    assert narrow > wide > 0


def test_population_weights_renormalize_or_fall_back_to_uniform():
    assert population_weights([0, 1], {0: 0.2, 1: 0.6, 7: 0.2}) == pytest.approx([0.25, 0.75])
    assert population_weights([3, 4], {0: 1.0}) == pytest.approx([0.5, 0.5])
    assert population_weights([3, 4], None) == pytest.approx([0.5, 0.5])


# ---- the admission policy ---------------------------------------------------------------------

def test_dds_admits_everything_while_filling_then_each_state_at_its_rate():
    buf = Buffer(50, 4, 2, 4, DdsPolicy(seed=1))
    buf.policy.rates = {0: 0.2, 1: 0.9}
    x = np.zeros((4, 2), np.float32)
    assert all(buf.add(x, 0, 0) for _ in range(50))
    kept0 = sum(buf.add(x, 0, 0) for _ in range(4000))
    kept1 = sum(buf.add(x, 1, 1) for _ in range(4000))
    assert kept0 / 4000 == pytest.approx(0.2, abs=0.03) and kept1 / 4000 == pytest.approx(0.9, abs=0.03)
    assert buf.policy.admission_rate == pytest.approx(0.55, abs=0.03)
    unknown = sum(buf.add(x, 2, -1) for _ in range(4000)) / 4000
    assert unknown == pytest.approx(0.5, abs=0.03)  # no rate: the default budget


def test_dds_admits_by_the_state_the_buffer_is_given():
    policy = DdsPolicy(seed=0)
    policy.rates = {3: 0.0}
    buf = Buffer(2, 4, 2, 4, policy)
    x = np.zeros((4, 2), np.float32)
    buf.add(x, 0), buf.add(x, 0)
    assert not buf.add(x, 0, 3)           # state 3 is never admitted


def test_dds_random_victims_mix_the_buffer_as_eq1():
    """After a switch to state 1, admitted at rate a into random slots, the share of state 0
    left after n offered windows is (1 - 1/C)^(a n) (eq. 1's geometric decay), not FIFO's 0."""
    cap, a, n = 200, 0.5, 200
    policy = DdsPolicy(seed=3)
    policy.rates = {0: a, 1: a}
    buf = Buffer(cap, 4, 2, 4, policy)
    for i in range(cap):
        buf.add(np.zeros((4, 2), np.float32), 0, 0)
    for i in range(n):
        buf.add(np.zeros((4, 2), np.float32), 1, 1)
    share0 = buf.counts[0] / cap
    assert share0 == pytest.approx((1 - 1 / cap) ** (a * n), abs=0.08)


# ---- the device plug-in on an AgentCore --------------------------------------------------------

def agent(**plugin):
    values = dict(device_id="dev-1", model=SPEC, min_buffer=8, local_steps=2, batch_size=8, lr=0.05,
                  round_interval_s=1.0, buffer_capacity=40, plugins={"sfedpo": plugin},
                  sensor={"kind": "mqtt", "channels": 2, "window_len": 4, "num_classes": 4})
    return AgentCore(build(AgentConfig, values, "test"), clock=lambda: 0.0, seed=5)


def terms(**kw):
    return make_global_model(SPEC, version=1, extras={"sfedpo": SfedpoTerms(**kw)})


def feed(core, state, labels, rng):
    for label in labels:
        core.add_window(Window(rng.normal(size=(4, 2)).astype(np.float32), int(label), 0.0, state))


def test_the_plugin_is_dormant_until_a_model_carries_the_terms():
    core = agent()
    rng = np.random.default_rng(0)
    core.on_global_model(make_global_model(SPEC, version=1))
    feed(core, 0, [0] * 50, rng)
    assert type(core.buffer.policy).__name__ == "FifoPolicy"
    assert "sfedpo_report" not in core.train_round().extras


def test_the_plugin_lends_dds_and_reports_s_q_and_state_counts():
    core = agent()
    plugin = core.plugin("sfedpo")
    rng = np.random.default_rng(0)
    core.on_global_model(terms())
    assert core.buffer.policy is plugin.policy
    feed(core, 0, [0] * 300 + [1] * 20, rng)            # frequent, skewed
    feed(core, 1, list(range(4)) * 10, rng)              # rare, balanced
    rates = plugin.refresh()
    assert set(rates) == {0, 1} and rates[0] < rates[1]
    pi = plugin.oracle.pi_hat([0, 1])
    assert float(pi @ np.array([rates[0], rates[1]])) == pytest.approx(0.5)
    for t in range(5):
        core.round_opportunity(float(t))
    report = core.train_round().extras["sfedpo_report"]
    assert isinstance(report, SfedpoReport) and report.shared_ids
    assert dict(zip(report.states, report.counts)) == {0: 320, 1: 40}
    assert 0 < report.availability <= 1 and report.availability == pytest.approx(2 / 7)  # (1+1)/(5+2)
    assert 0 < report.score < 100 and 0 < report.admission_rate < 1
    # s_n in eq. 1's units: the 320 windows offered once the buffer of 40 was full, over the
    # round's 2 steps (the agent's local_steps: the model's hparams do not set them).
    offered = plugin.policy.offered_full
    assert offered == 360 - 40
    states, pi, w, d = plugin._inputs()
    admission = np.array([plugin.policy.rates[s] for s in states])
    assert report.score == pytest.approx(heterogeneity_score(
        pi, replaced_per_step(admission, offered, 40, 2), d, w, 2))
    feed(core, 0, [0] * 8, rng)  # the next report counts only the windows offered since
    second = core.train_round().extras["sfedpo_report"]
    states, pi, w, d = plugin._inputs()
    admission = np.array([plugin.policy.rates[s] for s in states])
    assert second.score == pytest.approx(heterogeneity_score(
        pi, replaced_per_step(admission, 8, 40, 2), d, w, 2))


def test_with_dds_off_every_state_is_admitted_at_the_budget():
    core = agent()
    core.on_global_model(terms(dds=False, budget=0.3))
    feed(core, 0, [0] * 100, np.random.default_rng(0))
    assert core.plugin("sfedpo").policy.rates == {} and core.buffer.policy.default_rate == 0.3


def test_inferred_states_separate_label_mixes_without_a_source_state():
    core = agent(states="inferred", history=16, every=4)
    plugin = core.plugin("sfedpo")
    core.on_global_model(terms())
    rng = np.random.default_rng(1)
    feed(core, -1, [0] * 64, rng)
    feed(core, -1, rng.integers(0, 4, size=64), rng)
    feed(core, -1, [0] * 64, rng)
    assert len(plugin.oracle.counts) == 2 and not plugin.source.shared_ids


@pytest.mark.parametrize("bad", [{"states": "magic"}, {"victim": "newest"}, {"prior": 0.0},
                                 {"prior": float("nan")}, {"min_availability": 0.0},
                                 {"refresh_windows": 0}, {"max_states": 0}])
def test_bad_device_settings_are_refused(bad):
    with pytest.raises(ValueError):
        SfedpoAgentConfig(**bad)


# ---- SAW on a CoordinatorCore -------------------------------------------------------------------

DEVICES = ("d0", "d1", "d2")


def coordinator(strategy, **settings):
    values = {"model": SPEC, "strategy": strategy, "alpha": 0.5, "staleness": "constant",
              "plugins": {"sfedpo": settings}, "fedavg": {"deadline_s": 5.0}}
    c = CoordinatorCore(build(CoordinatorConfig, values, "test"))
    for i, d in enumerate(DEVICES):
        c.on_message(make_hello(d, SPEC), 0.01 * i)
    return c


def report(score, q, states=(0,), counts=(10,), shared=True):
    return SfedpoReport(score=score, availability=q, shared_ids=shared, states=states, counts=counts)


def send(c, device, rep, t, value=0.5, shift=None):
    tensors = {} if shift is None else {
        "tensors": {k: v + np.float32(shift) for k, v in c.global_model().tensors.items()}}
    return c.on_message(make_update(SPEC, value, device_id=device, base_version=c.version,
                                    extras={"sfedpo_report": rep}, **tensors), t)


def mixing(step):
    """The share FedAsync gave the update ``step`` aggregated, as the core reported it."""
    (made,) = [a for a in step.aggregations if not a.switched_by]
    return made.mixing_weight


def test_fedasync_mixing_weight_is_scaled_by_eq14_over_the_fleet_median():
    c = coordinator("fedasync", score_weight=1.0, weight_offset=0.5)
    step = send(c, "d0", report(1.0, 0.2), 1.0)        # raw 5 - 1 + .5 = 4.5; alone: factor 1
    assert mixing(step) == pytest.approx(0.5)
    step = send(c, "d1", report(2.0, 0.5), 2.0)        # raw 2 - 2 + .5 = 0.5
    # d0's 4.5 counts as 4 x 0.5 = 2 against its one peer; the median of (2, 0.5) is 1.25.
    assert mixing(step) == pytest.approx(0.5 * 0.5 / 1.25)
    assert step.update.fields["saw_factor"] == pytest.approx(0.4)


def test_fedavg_round_weights_follow_eq14():
    c = coordinator("fedavg", score_weight=1.0, weight_offset=0.0)
    before = c.global_model().tensors
    send(c, "d0", report(0.0, 0.5), 1.0, shift=-0.01)     # raw 2
    send(c, "d1", report(0.0, 0.25), 1.1, shift=0.01)     # raw 4
    step = send(c, "d2", report(0.0, 0.25), 1.2, shift=0.01)
    assert step.aggregations
    merged = c.global_model().tensors
    for name, t in merged.items():  # shifts weighted 2 : 4 : 4 -> 0.01 (-2 + 4 + 4) / 10
        assert np.allclose(t - before[name], 0.006, atol=1e-6)


def test_a_forged_tiny_availability_buys_at_most_max_factor():
    c = coordinator("fedasync", max_factor=4.0)
    send(c, "d0", report(1.0, 0.2), 1.0)
    send(c, "d1", report(1.0, 0.2), 2.0)
    step = send(c, "d2", report(0.0, 1e-9), 3.0)       # q clamped to 0.01: raw 100.5
    assert step.update.fields["saw_factor"] == pytest.approx(4.0)   # 4 x the others' median, no more
    assert mixing(step) == pytest.approx(0.5)  # and never above FedAsync's own alpha
    assert c.plugin("sfedpo").reports["d2"][1] == 0.01
    step = send(c, "d0", report(1.0, 0.2), 4.0)        # the honest devices keep their weight
    assert step.update.fields["saw_factor"] == pytest.approx(1.0)


def test_updates_without_a_report_or_with_saw_off_keep_the_strategy_weight():
    c = coordinator("fedasync")
    step = c.on_message(make_update(SPEC, device_id="d0", base_version=c.version), 1.0)
    assert mixing(step) == pytest.approx(0.5)
    off = coordinator("fedasync", saw=False)
    send(off, "d0", report(1.0, 0.2), 1.0)
    step = send(off, "d1", report(50.0, 0.9), 2.0)
    assert mixing(step) == pytest.approx(0.5)


def test_state_weights_are_one_device_one_vote_and_ride_in_the_model():
    c = coordinator("fedasync")
    send(c, "d0", report(1.0, 0.2, states=(0, 1), counts=(10 ** 9, 0)), 1.0)
    send(c, "d1", report(1.0, 0.2, states=(1,), counts=(3,)), 2.0)
    send(c, "d2", report(1.0, 0.2, states=(5,), counts=(7,), shared=False), 3.0)  # local ids: ignored
    t = c.global_model().extras["sfedpo"]
    assert t.state_weights == pytest.approx({0: 0.5, 1: 0.5})
    assert t.budget == 0.5 and t.dds and t.saw


def test_the_plugin_state_round_trips():
    c = coordinator("fedasync")
    send(c, "d0", report(1.5, 0.3, states=(2,), counts=(4,)), 1.0)
    plugin = c.plugin("sfedpo")
    again = coordinator("fedasync").plugin("sfedpo")
    again.load_state(plugin.state())
    assert again.reports == plugin.reports and again.shares == plugin.shares


@pytest.mark.parametrize("bad", [{"budget": 1.0}, {"budget": 0.0}, {"budget": float("nan")},
                                 {"score_weight": -1.0}, {"admission_offset": float("nan")}, {"max_factor": 0.5},
                                 {"min_availability": 0.0}])
def test_bad_fleet_settings_are_refused(bad):
    with pytest.raises(ValueError):
        SfedpoConfig(**bad)


# ---- the payloads ---------------------------------------------------------------------------------

def test_payloads_round_trip():
    t = SfedpoTerms(dds=False, budget=0.4, states=(1, 3), weights=(0.25, 0.75))
    assert SfedpoTerms.parse(t.fields(), {}) == t
    r = SfedpoReport(score=1.5, availability=0.2, shared_ids=True, states=(0,), counts=(5,), admission_rate=0.4)
    assert SfedpoReport.parse(r.fields(), {}) == r
    i = ImportanceTerms(0.3, 4)
    assert ImportanceTerms.parse(i.fields(), {}) == i


@pytest.mark.parametrize("change", [
    {"score": float("nan")}, {"score": -1.0}, {"score": 1e7}, {"score": "1"}, {"availability": 0.0},
    {"availability": 1.5}, {"availability": True}, {"states": [0, 0], "counts": [1, 1]},
    {"states": [-1], "counts": [1]}, {"states": [0], "counts": [1.5]}, {"states": [0], "counts": []},
    {"states": list(range(2000)), "counts": [1] * 2000}, {"admission_rate": 2.0}, {"extra": 1}])
def test_hostile_reports_are_refused(change):
    fields = dict(report(1.0, 0.2).fields(), **change)
    with pytest.raises(ProtocolError):
        SfedpoReport.parse(fields, {})


@pytest.mark.parametrize("change", [{"budget": 1.0}, {"budget": 0.0}, {"budget": float("inf")},
                                    {"a1": -1.0}, {"dds": 1}, {"weights": [float("nan")], "states": [0]},
                                    {"states": [0], "weights": [-0.5]}])
def test_hostile_terms_are_refused(change):
    fields = dict(SfedpoTerms().fields(), **change)
    with pytest.raises(ProtocolError):
        SfedpoTerms.parse(fields, {})


def test_tensors_are_refused():
    with pytest.raises(ProtocolError):
        SfedpoReport.parse(report(1.0, 0.2).fields(), {"g": {"w": np.zeros(1, np.float32)}})


def test_a_balanced_eviction_makes_room_in_the_most_held_class():
    policy = DdsPolicy(seed=4, victim="balanced")
    buf = Buffer(40, 4, 2, 4, policy)
    x = np.zeros((4, 2), np.float32)
    for i in range(40):
        buf.add(x, 0 if i < 30 else 1 + i % 3, 0)
    policy.rates = {0: 1.0}
    for _ in range(10):
        assert buf.add(x, 3, 0)
    assert buf.counts[0] == 20 and sum(buf.counts[1:]) == 20  # every eviction hit class 0
    with pytest.raises(ValueError):
        DdsPolicy(victim="newest")
