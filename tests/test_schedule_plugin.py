"""Device scheduling at the coordinator: the reports it keeps, the choices it commands, the budget it
plans with (measured latency, or eq. 14 bandwidth on a shared channel), FedAvg rounds that wait
for the chosen devices only, FedAsync cohorts, frames, state, and what a hostile report can do."""
import math

import numpy as np
import pytest

from factories import UNBOUNDED_ADMISSION, make_hello, make_update
from streamfl.config import build
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.core import CoordinatorCore
from streamfl.methods.schedule.coordinator import ScheduleConfig
from streamfl.errors import ConfigError, ProtocolError
from streamfl.models import ModelSpec
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import Telemetry
from streamfl.methods.schedule.payloads import ScheduleRequest, ScheduleStats

SPEC = ModelSpec(name="mlp", in_channels=2, window_len=4, num_classes=4, hidden=4)
DEVICES = ("d0", "d1", "d2", "d3", "d4", "d5")


def core(strategy="fedavg", devices=DEVICES, **schedule):
    schedule.setdefault("policy", "fedteddi")
    settings = {"model": SPEC, "strategy": strategy, "alpha": 0.5, "staleness": "constant",
                "plugins": {"schedule": schedule}, "fedavg": {"deadline_s": 1.0},
                "admission": UNBOUNDED_ADMISSION}
    c = CoordinatorCore(build(CoordinatorConfig, settings, "test"))
    for i, d in enumerate(devices):
        c.on_message(make_hello(d, SPEC), 0.001 * i)
    return c


def stats(counts, prev=None, frame=0, **kw):
    return ScheduleStats(counts=tuple(counts), prev_counts=tuple(prev if prev is not None else counts),
                         frame=frame, **kw)


def report(c, device, counts, t, **kw):
    msg = Telemetry(device_id=device, time_s=t, buffer_fill=1, buffer_capacity=2,
                    extras={"schedule_stats": stats(counts, **kw)})
    return c.on_message(Decoder({}).decode(encode(msg)), t)


def update(c, device, counts, t, **kw):
    u = make_update(SPEC, device_id=device, base_version=c.version,
                    class_counts={i: n for i, n in enumerate(counts) if n},
                    extras={"schedule_stats": stats(counts, **kw)})
    return c.on_message(u, t)


def plugin(c):
    return next(p for p in c.plugins if p.name == "schedule")


def commands(step):
    return {a.device_id: a.command for a in step.commands}


# ---- the wire ----------------------------------------------------------------------------------

def test_stats_and_request_round_trip_in_telemetry_and_models():
    s = stats([3, 0, 1, 0], prev=[3, 0, 0, 0], frame=2, class_grad_norms=(1.0, 0.0, 2.5, 0.0),
              grad_var=4.0, grad_norm=1.5, loss=0.7, snr_hz=1e9)
    msg = Telemetry(device_id="d0", time_s=1.0, buffer_fill=4, buffer_capacity=8, extras={s.KIND: s})
    assert Decoder({}).decode(encode(msg)).extras == {s.KIND: s}
    assert ScheduleRequest.parse(ScheduleRequest(False).fields(), {}) == ScheduleRequest(False)


@pytest.mark.parametrize("fields", [
    {"counts": [1, 2], "prev_counts": [1]},                      # lengths differ
    {"counts": [1, -2], "prev_counts": [1, 2]},                  # negative count
    {"counts": [1.5, 2], "prev_counts": [1, 2]},                 # not an integer
    {"counts": [1, 2], "prev_counts": [1, 2], "class_grad_norms": [1.0]},
    {"counts": [1] * 5000, "prev_counts": [1] * 5000},           # unbounded
    {"counts": [1, 2], "prev_counts": [1, 2], "grad_var": -1.0},
    {"counts": [1, 2], "prev_counts": [1, 2], "snr_hz": float("inf")},
    {"counts": [1, 2], "prev_counts": [1, 2], "owner": "d9"},    # unknown field
    {"counts": "12", "prev_counts": [1, 2]},
])
def test_malformed_stats_are_refused_at_parse(fields):
    with pytest.raises(ProtocolError):
        ScheduleStats.parse(fields, {})


def test_telemetry_extras_carry_no_tensors():
    from streamfl.methods.clp.payloads import FisherTrace
    from streamfl.methods.fedcurv.payloads import CurvatureDiagonal
    ok = Telemetry(device_id="d0", time_s=1.0, buffer_fill=0, buffer_capacity=1,
                   extras={"fisher_trace": FisherTrace(1.0)})
    assert Decoder({}).decode(encode(ok)).extras["fisher_trace"].value == 1.0
    bad = Telemetry(device_id="d0", time_s=1.0, buffer_fill=0, buffer_capacity=1,
                    extras={"curvature_diagonal": CurvatureDiagonal({"w": np.ones(2, np.float32)})})
    with pytest.raises(ProtocolError):
        encode(bad)


# ---- configuration -----------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [{"policy": "best"}, {"options": {"lambda9": 1}},
                                 {"deadline_s": 0}, {"total_bandwidth_hz": -1.0},
                                 {"max_devices": 0}, {"frame_rounds": 0}, {"headroom": 1.0},
                                 {"gradient_noise": float("nan")}])
def test_bad_settings_are_config_errors(bad):
    with pytest.raises((ConfigError, ValueError)):
        core(**bad)


def test_every_registered_policy_builds():
    from streamfl.methods.schedule.policies import POLICIES
    for name in POLICIES:
        assert plugin(core(policy=name)).policy.name == name


# ---- choosing ----------------------------------------------------------------------------------

def _first_round(c, counts_by_device, t=1.0):
    """Every device trains version 0 and reports; returns the step that closed the round."""
    step = None
    for i, (d, counts) in enumerate(counts_by_device.items()):
        step = update(c, d, counts, t + 0.01 * i)
    return step


def test_a_closed_round_commands_train_to_the_chosen_and_skip_to_the_rest():
    c = core(policy="random", max_devices=2, seed=3)
    step = _first_round(c, {d: [4, 0, 0, 0] for d in DEVICES})
    assert c.version == 1
    cmds = commands(step)
    assert set(cmds) == set(DEVICES)
    chosen = {d for d, cmd in cmds.items() if cmd.kind == "train"}
    assert len(chosen) == 2
    for d in chosen:
        assert cmds[d].params == {"rounds": 1, "then_skip": 10, "version": 1}
    assert all(cmds[d].kind == "skip" and cmds[d].params == {"rounds": 10}
               for d in set(DEVICES) - chosen)
    event = next(e for e in step.events if e["event"] == "schedule")
    assert set(event["chosen"]) == chosen and event["candidates"] == len(DEVICES)


def test_fedavg_rounds_wait_for_the_chosen_devices_only():
    c = core(policy="random", max_devices=2, seed=1)
    step = _first_round(c, {d: [4, 0, 0, 0] for d in DEVICES})
    chosen = sorted(d for d, cmd in commands(step).items() if cmd.kind == "train")
    update(c, chosen[0], [4, 0, 0, 0], 2.0)
    assert c.version == 1  # the other chosen device is still out
    update(c, chosen[1], [4, 0, 0, 0], 2.1)
    assert c.version == 2  # closed without waiting for the four told to skip


def test_fedteddi_prefers_the_devices_that_drifted_early_in_a_frame():
    c = core(policy="fedteddi", gradient_noise=0.0)
    _first_round(c, {d: [4, 4, 0, 0] for d in DEVICES})
    p = plugin(c)
    assert len(p._chosen_last) == len(DEVICES)  # no drift, no noise term: every device helps
    # The next round: d4 and d5 saw a new class (their frame advanced), the others did not.
    step = None
    for i, d in enumerate(DEVICES):
        new = {"d4": [2, 2, 4, 0], "d5": [2, 2, 0, 4]}.get(d)
        step = update(c, d, new or [4, 4, 0, 0], 1.5 + 0.01 * i, prev=[4, 4, 0, 0],
                      frame=1 if new else 0)
    chosen = {d for d, cmd in commands(step).items() if cmd.kind == "train"}
    assert {"d4", "d5"} <= chosen and len(chosen) < len(DEVICES)
    event = next(e for e in step.events if e["event"] == "schedule")
    assert event["frame_round"] == 0 and event["with_new_class"] == 2


def test_pure_drift_and_best_norm_read_the_reports():
    c = core(policy="best-norm", max_devices=1)
    step = None
    for i, d in enumerate(DEVICES):
        step = update(c, d, [4, 4, 0, 0], 1.0 + 0.01 * i, grad_norm=float(i == 2))
    assert [d for d, cmd in commands(step).items() if cmd.kind == "train"] == ["d2"]


def test_measured_latency_over_the_deadline_keeps_a_device_out_for_a_while():
    c = core(policy="random", retry_rounds=3)
    p = plugin(c)
    _first_round(c, {d: [4, 0, 0, 0] for d in DEVICES})
    assert p._chosen_last == set(DEVICES)  # nobody measured yet: everyone fits
    for i, d in enumerate(DEVICES[1:]):  # d0 does not come back in time
        update(c, d, [4, 0, 0, 0], 1.5 + 0.01 * i)
    c.tick(1.2)
    c.tick(2.6)  # the round's deadline passed: it closes without d0, which is marked late
    assert c.version == 2 and p._devices["d0"].latency_s > 1.0
    assert "d0" not in p._chosen_last and len(p._chosen_last) == len(DEVICES) - 1
    for r in range(3):
        p._choose(3.0 + r)
    assert "d0" in p._chosen_last  # retried after retry_rounds choices


def test_shared_channel_grants_bandwidth_within_the_total():
    total = 400.0  # the test model is tiny: about a hundred Hz each meets the deadline
    c = core(policy="random", total_bandwidth_hz=total)
    step = None
    for i, d in enumerate(DEVICES):
        step = update(c, d, [4, 4, 0, 0], 1.0 + 0.01 * i, snr_hz=1e9 * (i + 1))
    grants = {d: cmd.params["bandwidth_hz"] for d, cmd in commands(step).items() if cmd.kind == "train"}
    assert grants and sum(grants.values()) <= total * (1 + 1e-9)
    assert all(g > 0 and math.isfinite(g) for g in grants.values())
    assert len(grants) < len(DEVICES)  # the band binds


def test_a_device_without_a_known_channel_is_not_planned_on_a_shared_channel():
    c = core(policy="random", total_bandwidth_hz=1e9)
    step = None
    for i, d in enumerate(DEVICES):
        step = update(c, d, [4, 4, 0, 0], 1.0 + 0.01 * i, snr_hz=None if d == "d3" else 1e9)
    assert commands(step)["d3"].kind == "skip"


def test_fedasync_without_refill_invites_a_new_cohort_once_the_last_is_back():
    c = core(strategy="fedasync", policy="random", max_devices=2, seed=5, refill=False)
    step = update(c, "d0", [4, 0, 0, 0], 1.0)
    # The first aggregation chooses among the devices that reported (d0); the rest skip and
    # report while they do.
    assert {d: cmd.kind for d, cmd in commands(step).items()} == dict(
        {"d0": "train"}, **{d: "skip" for d in DEVICES[1:]})
    for d in DEVICES[1:]:
        report(c, d, [4, 0, 0, 0], 1.1)
    step = update(c, "d0", [4, 0, 0, 0], 1.5)  # the cohort is back: a new one of two
    p = plugin(c)
    cohort = sorted(p._cohort)
    assert len(cohort) == 2 and p.rounds == 2
    first = update(c, cohort[0], [4, 0, 0, 0], 2.0)
    assert not [a for a in first.commands if a.command.kind == "train"]  # one still out
    second = update(c, cohort[1], [4, 0, 0, 0], 2.1)
    assert len([a for a in second.commands if a.command.kind == "train"]) == 2


@pytest.mark.parametrize("refill", [True, False])
def test_a_cohort_that_misses_the_timeout_is_replaced(refill):
    c = core(strategy="fedasync", policy="random", max_devices=2, timeout_factor=2.0, refill=refill)
    for d in DEVICES:
        report(c, d, [4, 0, 0, 0], 0.5)
    c.tick(1.0)  # the first choice, without an aggregation
    p = plugin(c)
    first = set(p._cohort)
    assert len(first) == 2 and p.rounds == 1
    assert not [a for a in c.tick(2.5).commands if a.command.kind == "train"]
    assert [a for a in c.tick(3.5).commands if a.command.kind == "train"]
    assert p.rounds == 2
    assert all(p._devices[d].latency_s >= 2.5 for d in first)


def test_fedasync_refills_the_cohort_as_each_device_comes_back():
    c = core(strategy="fedasync", policy="random", max_devices=2, seed=5, total_bandwidth_hz=400.0,
             refill=True)
    for d in DEVICES:
        report(c, d, [4, 4, 0, 0], 0.5, snr_hz=1e9)
    c.tick(1.0)
    p = plugin(c)
    out, other = sorted(p._cohort)
    assert len(p._cohort) == 2 and p.rounds == 1
    step = update(c, out, [4, 4, 0, 0], 1.5, snr_hz=1e9)
    cmds = commands(step)
    invited = [d for d, cmd in cmds.items() if cmd.kind == "train"]
    assert len(invited) == 1 and invited[0] != other and other not in cmds  # left to train on
    assert p._cohort == {other, invited[0]} and p.rounds == 2
    assert sum(p._grants_hz.values()) <= 400.0 * (1 + 1e-9)  # the band the busy one holds is kept
    assert p.frame_round == pytest.approx(1.5)  # half the set turned over
    # The other one never comes back: given up after timeout_factor deadlines, and replaced.
    c.tick(2.9)
    assert other in p._cohort
    replaced = commands(c.tick(3.2))
    assert other not in p._cohort and len(p._cohort) == 2 and p._devices[other].latency_s >= 2.0
    assert [d for d, cmd in replaced.items() if cmd.kind == "train"] and invited[0] not in replaced


def test_fedteddi_refill_judges_the_newcomers_with_the_devices_still_out():
    # Two class-0 devices are out: the refill balances the set with class 1, not more class 0.
    c = core(strategy="fedasync", policy="fedcgd", gradient_noise=0.0, refill=True)
    counts = {"d0": [8, 0, 0, 0], "d1": [8, 0, 0, 0], "d2": [8, 0, 0, 0], "d3": [8, 0, 0, 0],
              "d4": [0, 8, 0, 0], "d5": [0, 8, 0, 0]}
    for d, n in counts.items():
        report(c, d, n, 0.5)
    p = plugin(c)
    p._choose(1.0)
    p._choose(1.1, keep={"d0", "d1"})
    added = p._cohort - {"d0", "d1"}
    assert added and all(counts[d][1] for d in added)  # alone, the greedy would start anywhere


def test_a_new_frame_restarts_the_drift_weight():
    c = core(policy="random")
    _first_round(c, {d: [4, 0, 0, 0] for d in DEVICES})
    p = plugin(c)
    p._choose(2.0)
    assert p.frame_round == 2
    report(c, "d2", [4, 1, 0, 0], 2.5, prev=[4, 0, 0, 0], frame=1)
    assert (p.frame, p.frame_round) == (1, 0)
    report(c, "d2", [4, 2, 0, 0], 2.6, prev=[4, 0, 0, 0], frame=1)  # same frame: no restart
    p._choose(3.0)
    assert (p.frame, p.frame_round) == (1, 1)


def test_reports_with_another_class_count_are_ignored():
    c = core()
    report(c, "d0", [1, 2, 3], 1.0)  # the model has 4 classes
    assert "d0" not in plugin(c)._devices
    # an ungreeted device's report never reaches the plug-in
    c.on_message(Telemetry(device_id="stranger", time_s=1.0, buffer_fill=1, buffer_capacity=2,
                           extras={"schedule_stats": stats([1, 1, 1, 1])}), 1.0)
    assert "stranger" not in plugin(c)._devices


def test_the_global_model_asks_for_gradients_only_where_the_policy_reads_them():
    assert core(policy="fedteddi").global_model().extras["schedule"].class_gradients
    assert not core(policy="random").global_model().extras["schedule"].class_gradients
    assert core(policy="random", class_gradients=True).global_model().extras["schedule"].class_gradients


def test_eq18_weights_follow_the_largest_fresh_class_norm():
    c = core(policy="fedteddi")
    for i, d in enumerate(DEVICES):
        update(c, d, [4, 4, 0, 0], 1.0 + 0.01 * i, class_grad_norms=(1.0 + i, 0.5, 0.0, 0.0))
    np.testing.assert_allclose(plugin(c).L, [6.0, 0.5, 1.0, 1.0])  # no norm for 2, 3: fallback 1


def test_eq18_takes_its_max_over_the_devices_that_trained_not_the_norms_a_skipping_device_resends():
    c = core(policy="fedteddi")
    for i, d in enumerate(DEVICES[:4]):
        update(c, d, [4, 4, 0, 0], 1.0 + 0.01 * i, class_grad_norms=(2.0, 0.5, 0.0, 0.0))
    # d4 skips: its telemetry repeats the large norms of a round long past (an untrained model)
    report(c, "d4", [4, 4, 0, 0], 1.1, class_grad_norms=(9.0, 9.0, 0.0, 0.0))
    plugin(c)._candidates(sorted(DEVICES[:5]), set())
    np.testing.assert_allclose(plugin(c).L, [2.0, 0.5, 1.0, 1.0])
    update(c, "d4", [4, 4, 0, 0], 2.0, class_grad_norms=(3.0, 0.25, 0.0, 0.0))  # it trained again
    plugin(c)._candidates(sorted(DEVICES[:5]), set())
    np.testing.assert_allclose(plugin(c).L, [3.0, 0.25, 1.0, 1.0])


def test_state_round_trips_and_malformed_state_is_refused():
    c = core()
    _first_round(c, {d: [4, 4, 0, 0] for d in DEVICES})
    p = plugin(c)
    state = p.state()
    again = plugin(core())
    again.load_state(state)
    assert again.state() == state
    for bad in ({"rounds": -1}, {"L": [1.0, float("nan")]}, {"L": "x"}, {"frame": "a"}):
        with pytest.raises(ValueError):
            again.load_state(bad)


def test_schedule_config_defaults_take_the_fedavg_deadline():
    c = core()
    assert plugin(c).deadline_s == 1.0
    assert plugin(core(deadline_s=0.8)).deadline_s == 0.8
    assert isinstance(plugin(c).config, ScheduleConfig)


def test_one_device_cannot_set_the_class_weights_or_the_shares_alone():
    c = core(policy="fedteddi")
    for i, d in enumerate(DEVICES):
        big = d == "d5"
        update(c, d, [4000000, 4, 0, 0] if big else [4, 4, 0, 0], 1.0 + 0.01 * i,
               class_grad_norms=(1e300 if big else 1.0 + 0.1 * i, 0.5, 0.0, 0.0))
    p = plugin(c)
    assert p.L[0] <= 10 * 1.25  # ten times the median of the fresh reports, not 1e300
    cand = p._candidates(sorted(DEVICES), set())
    assert cand.samples.max() <= 10 * 8


def test_when_nobody_meets_the_deadline_one_device_trains_with_the_whole_band():
    c = core(policy="random", total_bandwidth_hz=400.0)
    step = None
    for i, d in enumerate(DEVICES):
        step = c.on_message(make_update(SPEC, device_id=d, base_version=c.version,
                                        class_counts={0: 4}, seconds_per_sample=1.0,  # 8 s rounds
                                        extras={"schedule_stats": stats([4, 0, 0, 0], snr_hz=1e9)}),
                            1.0 + 0.01 * i)
    trains = [cmd for cmd in commands(step).values() if cmd.kind == "train"]
    assert len(trains) == 1 and trains[0].params["bandwidth_hz"] == 400.0
