"""What each method shows an operator of a live fleet (``CoordinatorPlugin.describe``): every
registered plug-in returns a bounded, JSON-able ``MethodState`` that describing does not change, and
each method's values follow its hooks (the CLP flag and its changes, FedCurv's peers, CriticalFL's
round size, who was sampled, balance's weights and rests, the schedule, ST-EWC's periods, the
session each update was trained in, SAW weights, the broadcast terms, the learning-rate factor)."""
import json

import numpy as np
import pytest

from factories import plugin_strategy, UNBOUNDED_ADMISSION, greet, make_hello, make_update
from streamfl.config import build
from streamfl.coordinator import plugins as coordinator_plugins
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.core import WITHHELD, CoordinatorCore
from streamfl.coordinator.plugins.base import MAX_STATE_KEYS, Aggregation, FleetView, MethodState
from streamfl.models import ModelSpec, tensor_spec
from streamfl.protocol.messages import Offline, Telemetry
from streamfl.methods.adaptive_lr.coordinator import AdaptiveLrConfig, AdaptiveLrPlugin
from streamfl.methods.balance.coordinator import BalanceConfig, BalancePlugin
from streamfl.methods.clp.coordinator import ClpProbePlugin
from streamfl.methods.clp.payloads import FisherTrace
from streamfl.methods.clp.probe import ClpProbeConfig
from streamfl.methods.criticalfl.coordinator import CriticalFlConfig, CriticalFlPlugin
from streamfl.methods.fedcurv.coordinator import FedCurvConfig, FedCurvPlugin
from streamfl.methods.fedcurv.payloads import CurvatureDiagonal
from streamfl.methods.importance.coordinator import ImportanceConfig, ImportancePlugin
from streamfl.methods.sampling.coordinator import SamplingConfig, SamplingPlugin
from streamfl.methods.schedule.payloads import ScheduleStats
from streamfl.methods.sfedpo.coordinator import SfedpoConfig, SfedpoPlugin
from streamfl.methods.sfedpo.payloads import SfedpoReport
from streamfl.methods.stewc.payloads import PeriodFisher

SPEC = ModelSpec(name="mlp", in_channels=2, window_len=4, num_classes=3, hidden=4)
DEVICES = ("d0", "d1", "d2")
SCALARS = (str, int, float, bool, type(None))


def check_shape(state):
    """A ``MethodState`` the fleet view can show: at most MAX_STATE_KEYS keys fleet-wide and per
    device, every value a plain Scalar (no numpy), the whole JSON-able without NaN."""
    assert isinstance(state, MethodState)
    rows = [state.fleet] + list(state.devices.values())
    for row in rows:
        assert isinstance(row, dict) and len(row) <= MAX_STATE_KEYS, row
        for key, value in row.items():
            assert isinstance(key, str) and key
            assert type(value) in SCALARS, "%s=%r is a %s" % (key, value, type(value).__name__)
    assert all(isinstance(d, str) for d in state.devices)
    text = json.dumps({"fleet": state.fleet, "devices": state.devices}, allow_nan=False)
    assert json.loads(text) == {"fleet": state.fleet, "devices": state.devices}


# ---- every registered plug-in -------------------------------------------------------------------

def settings_for(name):
    """The plug-in with what it requires, under the first strategy it accepts."""
    strategy, plugins = plugin_strategy(name)
    return {"model": SPEC, "strategy": strategy, "plugins": plugins, "admission": UNBOUNDED_ADMISSION,
            "fedavg": {"deadline_s": 2.0}, "alpha": 0.5}


def drive(core, n=12):
    """Hellos, then ``n`` updates from the three devices (each with a Fisher trace and diagonal), a
    tick after each."""
    rng = np.random.default_rng(0)
    for i, d in enumerate(DEVICES):
        core.on_message(make_hello(d, SPEC), 0.01 * i)
    for k in range(n):
        t = 1.0 + k
        diag = {name: rng.random(a.shape).astype(np.float32) for name, a in core.model.items()}
        core.on_message(make_update(SPEC, None, seed=k, device_id=DEVICES[k % 3], update_id="u%d" % k,
                                    base_version=core.version, num_samples=10 + k,
                                    class_counts={k % 3: 6, (k * k) % 3: 4},
                                    extras={"fisher_trace": FisherTrace(1.0 + 0.3 * k),
                                            "curvature_diagonal": CurvatureDiagonal(diag)}), t)
        core.tick(t + 0.5)


@pytest.mark.parametrize("name", sorted(coordinator_plugins.registered()))
def test_every_plugin_describes_a_bounded_json_state_without_changing_itself(name):
    core = CoordinatorCore(build(CoordinatorConfig, settings_for(name), "test"))
    plugin = core.plugin(name)
    check_shape(plugin.describe(0.0))                      # before anything happened
    drive(core)
    before = json.dumps(plugin.state(), sort_keys=True, default=str)
    first, again = plugin.describe(20.0), plugin.describe(20.0)
    check_shape(first)
    assert first == again                                   # a query: the same answer twice
    assert json.dumps(plugin.state(), sort_keys=True, default=str) == before
    assert set(first.devices) <= set(DEVICES)               # rows only for devices it tracks
    assert core.version > 0


# ---- clp: the flag, since when, how often ------------------------------------------------------

def clp_plugin(**settings):
    config = dict(trace_window=1, staleness_decay=0.0, growth_threshold=0.1)
    config.update(settings)
    return ClpProbePlugin(ClpProbeConfig(**config), FleetView(lambda: DEVICES), {})


def merge(plugin, version, device, trace, now):
    """One FedAsync aggregation of ``device``'s update carrying ``trace``, at ``now``."""
    update = make_update(device_id=device, base_version=version - 1, extras={"fisher_trace": FisherTrace(trace)})
    plugin.on_update_admitted(update, now)
    return plugin.on_model_made(Aggregation(version, (update,), now))


def test_clp_shows_the_flag_when_it_changed_how_often_and_each_devices_trace():
    plugin = clp_plugin()
    fleet = plugin.describe(0.0).fleet
    assert (fleet["flag"], fleet["flag_since_version"], fleet["flag_changes"], fleet["flag_age_s"]) == \
        ("critical", 0, 0, None)                           # training starts in the CLP
    traces = [1.0, 2.0, 3.0, 3.0, 3.0, 6.0]
    for v, f in enumerate(traces, start=1):
        merge(plugin, v, DEVICES[v % 2], f, 10.0 * v)
        state = plugin.describe(10.0 * v + 4)
        if v == 3:
            assert state.fleet["flag"] == "critical" and state.fleet["flag_changes"] == 0
            assert state.fleet["growth"] == pytest.approx(0.5)
        if v == 4:                                         # 3 -> 3: no growth, out
            assert state.fleet == dict(state.fleet, flag="not critical", flag_since_version=4,
                                       flag_changes=1, flag_age_s=4.0, growth=0.0, segment=0)
    assert state.fleet["flag"] == "critical" and state.fleet["flag_since_version"] == 6
    assert state.fleet["flag_changes"] == 2 and state.fleet["segment"] == 1   # re-entry: a segment
    assert state.fleet["fisher_global"] == pytest.approx(6.0)
    assert state.fleet["refining_hparams"] is True
    assert state.devices == {"d0": {"fisher_trace": 6.0}, "d1": {"fisher_trace": 3.0}}
    assert plugin.describe(100.0).fleet["flag_age_s"] == pytest.approx(40.0)
    assert clp_plugin(refine_hparams=False).describe(0.0).fleet["refining_hparams"] is False


def test_clp_flag_shows_ended_after_r_end_and_the_changes_survive_a_restart():
    plugin = clp_plugin(last_regulated_version=4)
    for v, f in enumerate([1.0, 2.0, 2.0, 4.0, 8.0], start=1):
        merge(plugin, v, "d0", f, float(v))
    assert plugin.describe(6.0).fleet["flag"] == "ended"
    restored = clp_plugin(last_regulated_version=4)
    restored.load_state(json.loads(json.dumps(plugin.state())))
    fleet = restored.describe(6.0).fleet
    assert (fleet["flag_changes"], fleet["flag_since_version"]) == (2, 4)
    assert fleet["flag_age_s"] is None                     # the old clock's time is not kept


# ---- fedcurv: peers, totals, ages --------------------------------------------------------------

def test_fedcurv_shows_each_peers_fisher_total_its_cap_and_the_age_of_its_contribution():
    plugin = FedCurvPlugin(FedCurvConfig(max_peer_multiple=4.0), FleetView(lambda: DEVICES), {})
    assert plugin.describe(0.0) == MethodState(fleet={"peers": 0, "capped": 0}, devices={})
    like = {"w": np.zeros(4, np.float32), "b": np.zeros(2, np.float32)}

    def send(device, scale, now, diagonal=True):
        extras = {"curvature_diagonal": CurvatureDiagonal({k: np.full(a.shape, scale, np.float32)
                                                           for k, a in like.items()})} if diagonal else {}
        plugin.on_update_admitted(make_update(like, 1.0, device_id=device, extras=extras), now)

    send("d0", 1.0, 1.0)
    send("d1", 1.0, 2.0)
    send("d2", 100.0, 3.0)                                 # 100x its peers' total: capped at 4x
    state = plugin.describe(5.0)
    assert state.fleet == {"peers": 3, "capped": 1}
    assert state.devices["d0"] == {"fisher_total": 6.0, "counts_x": 1.0, "update_age_s": 4.0, "fisher_age_s": 4.0}
    assert state.devices["d2"]["fisher_total"] == pytest.approx(600.0)
    assert state.devices["d2"]["counts_x"] == pytest.approx(0.04)
    send("d0", 0.0, 9.0, diagonal=False)                   # a round without a diagonal: the old one stands
    row = plugin.describe(10.0).devices["d0"]
    assert (row["update_age_s"], row["fisher_age_s"], row["fisher_total"]) == (1.0, 9.0, 6.0)
    send("d9", 0.0, 10.0, diagonal=False)                  # no diagonal ever: not a peer, no row
    assert "d9" not in plugin.describe(10.0).devices


# ---- criticalfl: the round size it sets --------------------------------------------------------

def test_criticalfl_shows_the_round_size_following_the_clp_flag():
    online = ["d%d" % i for i in range(10)]
    clp = clp_plugin()
    plugin = CriticalFlPlugin(CriticalFlConfig(clients_max=6), FleetView(lambda: online, round_deadline_s=30.0),
                              {"clp": clp})
    assert plugin.describe(0.0).fleet == {"round_size": 2, "round_size_max": 6, "in_clp": True}
    for v, f in enumerate([1.0, 2.0], start=1):
        merge(clp, v, "d0", f, float(v))
        plugin.on_model_made(Aggregation(v, (), float(v)))
    assert plugin.describe(3.0).fleet["round_size"] == 6   # 2 -> 4 -> 6 (capped)
    merge(clp, 3, "d0", 2.0, 3.0)                          # flat: out of the CLP
    plugin.on_model_made(Aggregation(3, (), 3.0))
    assert plugin.describe(3.0).fleet == {"round_size": 3, "round_size_max": 6, "in_clp": False}


# ---- sampling: who was told to train -----------------------------------------------------------

def test_sampling_shows_who_was_selected_in_the_last_choice_only():
    online = list(DEVICES) + ["d3"]
    plugin = SamplingPlugin(SamplingConfig(clients_per_round=2, seed=1), FleetView(lambda: online), {})
    assert plugin.describe(0.0).devices == {}
    effects = plugin.on_model_made(Aggregation(1, (), 1.0))
    told = {a.device_id: a.command.kind == "train" for a in effects.commands}
    state = plugin.describe(1.0)
    assert state.devices == {d: {"selected": s} for d, s in told.items()} and sum(told.values()) == 2
    assert state.fleet == {"rounds": 1, "selected": 2, "clients_per_round": 2}
    online.remove("d3")                                    # gone: not in the next choice's rows
    effects = plugin.on_model_made(Aggregation(2, (), 2.0))
    told = {a.device_id: a.command.kind == "train" for a in effects.commands}
    assert plugin.describe(2.0).devices == {d: {"selected": s} for d, s in told.items()}
    assert set(told) == set(DEVICES)


# ---- balance: weights and rests ----------------------------------------------------------------

def test_balance_shows_each_devices_weight_and_the_rest_it_was_told():
    plugin = BalancePlugin(BalanceConfig(power=1.0, rest_below=0.9, rest_rounds=7), FleetView(lambda: DEVICES), {})
    first = make_update(device_id="d0", class_counts={0: 6, 1: 2})
    assert plugin.on_update_admitted(first, 1.0).weight == 1.0
    plugin.on_model_made(Aggregation(1, (first,), 1.0, mixing_weight=0.5))
    again = make_update(device_id="d1", class_counts={0: 8})     # the class the model is full of
    verdict = plugin.on_update_admitted(again, 2.0)
    assert verdict.weight < 0.9 and verdict.commands
    rare = make_update(device_id="d2", class_counts={1: 8})
    plugin.on_update_admitted(rare, 3.0)
    state = plugin.describe(3.0)
    assert state.devices == {
        "d0": {"weight": 1.0, "resting": False, "rest_rounds": 0},
        "d1": {"weight": round(verdict.weight, 4), "resting": True, "rest_rounds": 7},
        "d2": {"weight": 1.0, "resting": False, "rest_rounds": 0}}
    assert verdict.weight == pytest.approx(0.5 / 0.75)     # class 0 holds 3/4 of the model, its target 1/2
    assert state.fleet == {"classes": 2, "top_class": 0, "top_class_share": 0.75, "rests_told": 1}
    plugin.on_model_made(Aggregation(2, (rare,), 3.0, mixing_weight=0.5))
    assert plugin.describe(3.0).fleet == {"classes": 2, "top_class": 1, "top_class_share": 0.625, "rests_told": 1}


# ---- schedule: scheduled or skipping -----------------------------------------------------------

def test_schedule_shows_who_is_scheduled_who_is_still_out_and_each_devices_frame():
    settings = {"model": SPEC, "strategy": "fedavg", "alpha": 0.5, "staleness": "constant",
                "plugins": {"schedule": {"policy": "random", "max_devices": 2, "seed": 3}},
                "fedavg": {"deadline_s": 1.0}, "admission": UNBOUNDED_ADMISSION}
    core = CoordinatorCore(build(CoordinatorConfig, settings, "test"))
    for i, d in enumerate(DEVICES):
        core.on_message(make_hello(d, SPEC), 0.001 * i)
    plugin = core.plugin("schedule")
    assert plugin.describe(0.0).devices == {}

    def send(device, t, frame=0):
        stats = ScheduleStats(counts=(4, 0, 0), prev_counts=(4, 0, 0), frame=frame)
        return core.on_message(make_update(SPEC, device_id=device, base_version=core.version,
                                           class_counts={0: 4}, extras={"schedule_stats": stats}), t)

    for i, d in enumerate(DEVICES):                        # the first round closes: a choice
        step = send(d, 1.0 + 0.01 * i, frame=i)
    chosen = {a.device_id for a in step.commands if a.command.kind == "train"}
    state = plugin.describe(1.5)
    assert len(chosen) == 2
    assert {d for d, row in state.devices.items() if row["scheduled"]} == chosen
    assert {d for d, row in state.devices.items() if row["out"]} == chosen
    assert {d: row["frame"] for d, row in state.devices.items()} == {"d0": 0, "d1": 1, "d2": 2}
    assert state.fleet["policy"] == "random" and state.fleet["rounds"] == 1
    assert (state.fleet["scheduled"], state.fleet["out"], state.fleet["deadline_s"]) == (2, 2, 1.0)
    back = sorted(chosen)[0]
    send(back, 1.6)
    row = plugin.describe(1.7).devices[back]
    assert row["scheduled"] is True and row["out"] is False and row["latency_s"] == pytest.approx(0.58, abs=0.02)


# ---- stewc: periods and who answered ------------------------------------------------------------

def test_stewc_shows_the_period_the_open_consolidation_and_each_devices_latest_answer():
    settings = {"model": SPEC, "admission": UNBOUNDED_ADMISSION,
                "plugins": {"stewc": {"boundary": "schedule", "period_s": 10.0}}}
    core = greet(CoordinatorCore(build(CoordinatorConfig, settings, "test")), "a", "b")
    plugin = core.plugin("stewc")
    core.tick(0.0)
    core.on_update(make_update(SPEC, device_id="a", base_version=core.version), 1.0)
    state = plugin.describe(1.0)
    assert state.fleet == {"period": 0, "consolidating": None, "answers": 0, "periods_consolidated": 0,
                           "boundary": "schedule"} and state.devices == {}
    core.tick(10.0)                                        # the boundary; the next model announces it
    core.on_update(make_update(SPEC, device_id="a", base_version=core.version), 10.0)
    state = plugin.describe(10.0)
    assert (state.fleet["period"], state.fleet["consolidating"]) == (1, 0)
    assert state.devices == {"a": {"fisher_period": None, "awaited": True},
                             "b": {"fisher_period": None, "awaited": True}}
    fisher = {k: np.ones(s, np.float32) for k, (s, _) in tensor_spec(SPEC).items()}
    core.on_update(make_update(SPEC, device_id="a", base_version=core.version,
                               extras={"period_fisher": PeriodFisher(0, 10, fisher)}), 10.2)
    state = plugin.describe(10.2)
    assert state.fleet["answers"] == 1
    assert state.devices == {"a": {"fisher_period": 0, "awaited": False},
                             "b": {"fisher_period": None, "awaited": True}}
    core.on_update(make_update(SPEC, device_id="b", base_version=core.version,
                               extras={"period_fisher": PeriodFisher(0, 10, fisher)}), 10.3)
    core.tick(10.5)                                        # both answered: folded
    state = plugin.describe(10.5)
    assert (state.fleet["consolidating"], state.fleet["periods_consolidated"]) == (None, 1)
    assert state.devices == {"a": {"fisher_period": 0, "awaited": False},
                             "b": {"fisher_period": 0, "awaited": False}}


# ---- sessions: which session each update was trained in ----------------------------------------

def test_sessions_shows_the_phase_and_which_session_each_devices_last_update_was_trained_in():
    settings = {"model": SPEC, "admission": UNBOUNDED_ADMISSION, "strategy": "fedavg",
                "fedavg": {"deadline_s": 100.0},
                "plugins": {"sessions": {"init": "session-init", "change_fraction": 0.3, "settle_s": 1.0,
                                         "min_session_s": 5.0, "aux_wait_s": 30.0}}}
    core = greet(CoordinatorCore(build(CoordinatorConfig, settings, "test")), "a", "b", "c")
    plugin = core.plugin("sessions")
    assert plugin.describe(0.0).fleet["phase"] == "waiting"
    core.tick(0.0)

    def train(devices, now, base=None):
        return [core.on_update(make_update(SPEC, 1.0, device_id=d,
                                           base_version=core.version if base is None else base), now)
                for d in devices]

    train("abc", 1.0)
    state = plugin.describe(2.0)
    assert state.fleet == dict(state.fleet, session=0, phase="own", aux_round=0, saved_sessions=0,
                               pilot=False, new_session_deferred=False, own_model_age_s=2.0)
    assert state.devices == {d: {"session": 0, "auxiliary": False, "withheld": False} for d in "abc"}
    old_version = core.version
    core.on_message(Offline(device_id="c"), 6.0)
    greet(core, "d", "e", now=6.0)
    core.tick(6.0)
    core.tick(7.5)                                         # session 1: its auxiliary round from the pilot
    state = plugin.describe(7.5)
    assert state.fleet == dict(state.fleet, session=1, phase="auxiliary", aux_round=1, saved_sessions=1,
                               pilot=True, own_model_age_s=None)
    pilot_version = core.version
    train("a", 8.0, base=old_version)                      # trained in session 0: withheld
    train("b", 8.0)                                        # the pilot: an auxiliary update
    rows = plugin.describe(8.0).devices
    assert rows["a"] == {"session": 0, "auxiliary": False, "withheld": True}
    assert rows["b"] == {"session": 1, "auxiliary": True, "withheld": True}
    train("ade", 9.0, base=pilot_version)                  # the aux round closes: the session's own model
    state = plugin.describe(9.0)
    assert state.fleet["phase"] == "own" and state.fleet["aux_round"] == 0
    assert [s.update.outcome for s in train("d", 10.0)] != [WITHHELD]
    assert plugin.describe(10.0).devices["d"] == {"session": 1, "auxiliary": False, "withheld": False}
    restored = CoordinatorCore(build(CoordinatorConfig, settings, "test"))
    restored.plugin("sessions").load_state(json.loads(json.dumps(plugin.state())))
    assert restored.plugin("sessions")._phase_of(old_version) == (0, False)
    assert restored.plugin("sessions")._phase_of(pilot_version) == (1, True)


# ---- sfedpo: SAW weights -----------------------------------------------------------------------

def test_sfedpo_shows_each_devices_current_saw_weight_score_availability_and_state():
    plugin = SfedpoPlugin(SfedpoConfig(score_weight=1.0, weight_offset=0.5), FleetView(lambda: DEVICES), {})

    def send(device, score, q, states, counts, now):
        report = SfedpoReport(score=score, availability=q, shared_ids=True, states=states, counts=counts)
        return plugin.on_update_admitted(make_update(device_id=device, extras={"sfedpo_report": report}), now)

    send("d0", 1.0, 0.2, (0, 1), (3, 7), 1.0)              # eq. 14: 5 - 1 + .5 = 4.5; alone: 1
    verdict = send("d1", 2.0, 0.5, (2,), (10,), 2.0)       # 2 - 2 + .5 = 0.5
    state = plugin.describe(2.0)
    assert state.devices["d1"] == {"saw_weight": round(verdict.weight, 4), "score": 2.0,
                                   "availability": 0.5, "state": 2}
    # d0's weight is what its next update would get now, not what its last one got (1.0 alone)
    assert state.devices["d0"]["saw_weight"] == pytest.approx(2.0 / 1.25, abs=1e-4)
    assert state.devices["d0"]["state"] == 1
    assert state.fleet == {"dds": True, "saw": True, "states": 3, "top_state": 2, "top_state_weight": 0.5}
    off = SfedpoPlugin(SfedpoConfig(saw=False), FleetView(lambda: DEVICES), {})
    off.on_update_admitted(make_update(device_id="d0", extras={"sfedpo_report": SfedpoReport(
        score=1.0, availability=0.2, shared_ids=False, states=(0,), counts=(1,))}), 1.0)
    assert off.describe(1.0).devices == {"d0": {"saw_weight": 1.0, "score": 1.0, "availability": 0.2,
                                                "state": None}}


# ---- importance and adaptive_lr: what the fleet is told ----------------------------------------

@pytest.mark.parametrize("per_window", [False, True])
def test_importance_shows_the_budget_and_sample_every_model_carries(per_window):
    plugin = ImportancePlugin(ImportanceConfig(budget=0.3, candidates=4, per_window=per_window),
                              FleetView(lambda: DEVICES), {})
    (terms,) = plugin.before_publish()
    assert plugin.describe(0.0) == MethodState(fleet={"budget": terms.budget, "candidates": terms.candidates,
                                                      "per_window": per_window})
    assert terms.budget == 0.3 and terms.candidates == 4 and terms.per_window is per_window


def test_adaptive_lr_shows_the_learning_rate_factor_it_broadcasts():
    model = {"w": np.ones(8, np.float32)}
    plugin = AdaptiveLrPlugin(AdaptiveLrConfig(lr0=0.1), FleetView(lambda: DEVICES, model=lambda: model), {})
    assert plugin.describe(0.0).fleet == {"lr_factor": None, "lr": None, "aggregations": 0, "variance_ratio": 1.0}
    factors = []
    for v in range(1, 5):
        model = {"w": np.full(8, float(v), np.float32)}
        plugin.on_model_made(Aggregation(v, (), float(v)))
        fleet = plugin.describe(float(v)).fleet
        (broadcast,) = plugin.before_publish()
        assert fleet["lr_factor"] == broadcast.scale and fleet["lr"] == pytest.approx(0.1 * broadcast.scale)
        assert fleet["aggregations"] == v
        factors.append(fleet["lr_factor"])
    assert factors[0] == 1.0 and factors[-1] < factors[0]  # 1/t decay


def test_telemetry_of_a_scheduled_device_is_not_a_row_before_it_reported_its_stats():
    settings = {"model": SPEC, "strategy": "fedavg", "fedavg": {"deadline_s": 1.0},
                "plugins": {"schedule": {"policy": "random"}}, "admission": UNBOUNDED_ADMISSION}
    core = greet(CoordinatorCore(build(CoordinatorConfig, settings, "test")), *DEVICES)
    core.on_message(Telemetry(device_id="d0", time_s=1.0, buffer_fill=1, buffer_capacity=2), 1.0)
    assert core.plugin("schedule").describe(1.0).devices == {}
