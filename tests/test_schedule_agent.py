"""The device side of scheduling: the gradient statistics, frames noticed in the buffer, the
reports a skipping device sends, and the ``train`` command's one-round budget and model version."""
import numpy as np
import pytest
import torch

from test_agent_core import SPEC, FakeClock, fill, global_model, make_core, separable_windows
from streamfl.agent.plugins.base import ReportContext
from streamfl.methods.schedule.agent import ScheduleAgentConfig, ScheduleAgentPlugin
from streamfl.models import build_model
from streamfl.models.class_gradients import gradient_stats
from streamfl.protocol.messages import Command, GlobalModel
from streamfl.methods.schedule.payloads import ScheduleRequest, ScheduleStats


def scheduled_model(version, gradients=True):
    gm = global_model(version)
    return GlobalModel(version=gm.version, arch_id=gm.arch_id, tensors=gm.tensors,
                       extras={"schedule": ScheduleRequest(class_gradients=gradients)})


def data(n=24, seed=0, classes=3):
    ws = separable_windows(n, np.random.default_rng(seed), classes)
    return np.stack([w.x for w in ws]), np.array([w.label for w in ws])


# ---- gradient statistics ----------------------------------------------------------------------

def test_class_norms_cover_the_present_classes_and_the_total_is_the_batch_gradient():
    model = build_model(SPEC, seed=3)
    X, y = data(24, classes=2)  # classes 0 and 1 only
    stats = gradient_stats(model, X, y, SPEC.num_classes)
    assert stats.class_norms[2] == 0.0 and min(stats.class_norms[:2]) > 0
    loss = torch.nn.functional.cross_entropy(model(torch.as_tensor(X)), torch.as_tensor(y))
    grads = torch.autograd.grad(loss, [p for p in model.parameters()])
    direct = float(torch.sqrt(sum(g.double().pow(2).sum() for g in grads)))
    assert stats.norm == pytest.approx(direct, rel=1e-5)
    assert stats.variance is not None and stats.variance > 0


def test_gradient_stats_leave_the_model_as_they_found_it():
    model = build_model(SPEC, seed=3)
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    X, y = data(8)
    stats = gradient_stats(model, X, y, SPEC.num_classes)
    assert model.training and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert gradient_stats(model, X[:1], y[:1], SPEC.num_classes).variance is None
    assert stats.variance >= 0
    with pytest.raises(ValueError):
        gradient_stats(model, X, np.full(len(y), 7), SPEC.num_classes)


def test_the_split_half_variance_tracks_the_within_class_per_sample_variance():
    """Averaged over many draws, the stratified split-half estimate is sigma^2, the mean squared
    deviation of per-sample gradients from their class's mean, for a linear model where per-sample
    gradients are cheap to compute exactly."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(8 * 3, 3))
    rng = np.random.default_rng(1)
    X, y = data(512, seed=2)
    per = []
    for i in range(len(y)):
        loss = torch.nn.functional.cross_entropy(model(torch.as_tensor(X[i:i + 1])), torch.as_tensor(y[i:i + 1]))
        per.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(model.parameters()))]))
    per = torch.stack(per).double()
    labels = torch.as_tensor(y)
    centred = per.clone()
    for c in range(3):
        centred[labels == c] -= per[labels == c].mean(0)
    true = float(centred.pow(2).sum(1).mean())
    est = [gradient_stats(model, X[idx], y[idx], 3).variance
           for idx in (rng.choice(len(y), 32, replace=False) for _ in range(300))]
    assert np.mean(est) == pytest.approx(true, rel=0.15)


# ---- the agent plug-in ------------------------------------------------------------------------

def test_dormant_until_a_global_model_asks():
    core = make_core()
    core.on_global_model(global_model(1))
    assert core.plugin("schedule") not in core.active_plugins
    core.on_global_model(scheduled_model(2))
    plugin = core.plugin("schedule")
    assert plugin in core.active_plugins
    [stats] = plugin.before_telemetry(ReportContext({0: 4}, 3, 0.0))
    assert isinstance(stats, ScheduleStats) and stats.counts == (4, 0, 0)


def test_a_new_class_starts_a_frame_and_keeps_the_previous_distribution():
    plugin = ScheduleAgentPlugin(ScheduleAgentConfig(channel_snr_hz=1e9))
    plugin.on_model_received(scheduled_model(1), {})

    def rep(counts):
        [s] = plugin.before_telemetry(ReportContext(counts, 3, 0.0))
        return s

    first = rep({0: 10})
    assert (first.frame, first.prev_counts, first.snr_hz) == (0, (10, 0, 0), 1e9)
    assert rep({0: 12}).frame == 0  # more of the same
    new = rep({0: 12, 2: 1})  # a class the frame did not hold
    assert (new.frame, new.prev_counts) == (1, (12, 0, 0))
    later = rep({0: 6, 2: 6})  # the buffer refills with the new mix: the same frame
    assert (later.frame, later.prev_counts, later.counts) == (1, (12, 0, 0), (6, 0, 6))


def test_a_large_shift_of_known_classes_is_a_frame_too():
    plugin = ScheduleAgentPlugin(ScheduleAgentConfig(frame_shift=0.3))
    plugin.on_model_received(scheduled_model(1), {})
    for counts, frame in (({0: 8, 1: 8}, 0), ({0: 10, 1: 6}, 0), ({0: 15, 1: 1}, 1)):
        [s] = plugin.before_telemetry(ReportContext(counts, 3, 0.0))
        assert s.frame == frame


@pytest.mark.parametrize("bad", [{"stat_windows": 1}, {"frame_shift": 0.0}, {"frame_shift": 1.5},
                                 {"channel_snr_hz": -1.0}, {"channel_snr_hz": float("inf")}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        ScheduleAgentConfig(**bad)


def test_updates_carry_the_statistics_and_their_cost():
    core = make_core()
    fill(core, 32)
    core.on_global_model(scheduled_model(1))
    update = core.train_round()
    stats = update.extras["schedule_stats"]
    assert sum(stats.counts) == 32 and len(stats.class_grad_norms) == SPEC.num_classes
    assert stats.grad_norm > 0 and stats.grad_var > 0 and stats.loss is not None
    assert core.statistics_windows["batched"] == 32
    # a skipping device's report repeats the last round's gradient figures with fresh counts
    fill(core, 4, seed=1)
    report = core.report_extras(0.0)["schedule_stats"]
    assert sum(report.counts) == 36 and report.class_grad_norms == stats.class_grad_norms


def test_no_gradient_work_when_the_policy_reads_none():
    core = make_core()
    fill(core, 32)
    core.on_global_model(scheduled_model(1, gradients=False))
    stats = core.train_round().extras["schedule_stats"]
    assert stats.class_grad_norms == () and stats.grad_var is None
    assert "batched" not in core.statistics_windows


def test_no_report_before_a_global_model_or_without_a_scheduler():
    core = make_core()
    fill(core, 8)
    assert core.report_extras(0.0) == {}
    core.on_global_model(global_model(1))
    assert core.report_extras(0.0) == {}


# ---- the train command ------------------------------------------------------------------------

def test_a_one_round_train_command_holds_the_device_after_its_round():
    clock = FakeClock()
    core = make_core(clock=clock)
    fill(core, 16)
    core.on_global_model(global_model(1))
    core.on_command(Command("train", {"rounds": 1, "then_skip": 3, "version": 1}))
    assert core.ready(clock()) and core.take_train_request()
    core.train_round()
    assert core.skipping and not core.ready(clock())
    clock.t_s += 3 * 2.0  # three round intervals
    assert core.ready(clock())
    core.on_command(Command("train", {"rounds": 1, "then_skip": 3}))
    assert core.ready(clock())  # a new command lifts any skip at once


def test_a_train_command_waits_for_the_model_version_it_names():
    clock = FakeClock()
    core = make_core(clock=clock)
    fill(core, 16)
    core.on_global_model(global_model(1))
    core.on_command(Command("train", {"rounds": 1, "version": 2}))
    assert not core.ready(clock())  # the command overtook model 2
    core.on_global_model(global_model(2))
    assert core.ready(clock())


@pytest.mark.parametrize("params", [{"rounds": 0}, {"rounds": "1"}, {"rounds": 1, "then_skip": -1},
                                    {"rounds": True}])
def test_a_malformed_round_budget_trains_unbounded(params):
    core = make_core()
    fill(core, 16)
    core.on_global_model(global_model(1))
    core.on_command(Command("train", params))
    core.train_round()
    assert not core.skipping
