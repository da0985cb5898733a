"""Sessions of a dynamic device set: boundaries, the saved models and pilot, the three starting
models, the auxiliary round through the real coordinator core (FedAvg and FedAsync), the operator's
new-session, persistence, the payload at the codec, and the agent side."""
import math

import numpy as np
import pytest

from factories import UNBOUNDED_ADMISSION, greet, make_global_model, make_update
from streamfl.agent.plugins.base import RoundContext
from streamfl.methods.sessions.agent import SessionsAgentConfig, SessionsAgentPlugin
from streamfl.config import build
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.core import WITHHELD, CoordinatorCore
from streamfl.coordinator.persistence import Persister, StateStore
from streamfl.methods.sessions.coordinator import SessionsConfig
from streamfl.methods.sessions.initializers import AverageInit, GradientWeightedInit, PreviousInit, make_init
from streamfl.methods.sessions.initializers.aux import AuxRound
from streamfl.methods.sessions.initializers.library import SavedSession, SessionLibrary, mean_model
from streamfl.methods.sessions.initializers.membership import Membership
from streamfl.methods.sessions.initializers.weighted import similarity_weights
from streamfl.errors import ProtocolError
from streamfl.models import ModelSpec, tensor_spec
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import Command, Offline
from streamfl.methods.sessions.payloads import SessionAux, SessionTerms

SPEC = {"name": "mlp", "in_channels": 3, "window_len": 8, "num_classes": 3, "hidden": 8}
MSPEC = ModelSpec(**SPEC)


def _model(value):
    return {k: np.full(s, value, dtype=np.float32) for k, (s, _) in tensor_spec(MSPEC).items()}


def _equal(a, b):
    return all(np.allclose(a[k], b[k], atol=1e-6) for k in a)


# ---- membership ----------------------------------------------------------------------------------
def test_membership_counts_gone_plus_new_over_the_session_and_waits_for_settle_and_min_age():
    m = Membership(change_fraction=0.3, min_session_s=10.0, settle_s=2.0)
    m.start(0.0, ["a", "b", "c", "d"])
    m.due(1.0, ["a", "b", "c", "d", "e"])            # arrives within settle_s: joins the session
    assert m.reference == {"a", "b", "c", "d", "e"}
    assert m.change(["a", "b", "c", "d"]) == pytest.approx(0.2)
    assert not m.due(5.0, ["a", "b", "c", "d"])       # one board of five gone: under 0.3
    assert not m.due(5.0, ["a", "b", "x", "y"])       # all 5 changed, but younger than min_session_s
    assert m.due(10.0, ["a", "b", "x", "y"])          # old enough, and the change lasted 5 s >= settle_s
    m2 = Membership(change_fraction=0.3, min_session_s=10.0, settle_s=2.0)
    m2.start(0.0, ["a", "b", "c"])
    assert not m2.due(11.0, ["a", "x", "y"])          # first seen changed now
    assert not m2.due(12.0, ["a", "b", "c"])          # it flapped back: forgotten
    assert not m2.due(13.0, ["a", "x", "y"])
    assert m2.due(15.0, ["a", "x", "y"])              # lasted settle_s


def test_membership_state_round_trip_restarts_the_clock():
    m = Membership(0.3, 10.0, 2.0)
    m.start(0.0, ["a", "b"])
    again = Membership(0.3, 10.0, 2.0)
    again.load_state(m.state())
    assert again.reference == {"a", "b"} and again.started_s is None
    with pytest.raises(ValueError):
        again.load_state({"reference": [1, 2]})


# ---- library and the three constructions ------------------------------------------------------
def test_library_builds_the_pilot_from_the_first_P_and_keeps_at_most_H():
    lib = SessionLibrary(pilot_sessions=2, max_saved=3)
    lib.end_session(0, _model(1.0), None)
    assert lib.pilot is None
    lib.end_session(1, _model(3.0), None)
    assert _equal(lib.pilot, _model(2.0))
    for s in range(2, 6):
        lib.end_session(s, _model(float(s)), _model(0.1 * s))
    assert [s.session for s in lib.saved] == [3, 4, 5]
    assert _equal(lib.pilot, _model(2.0))            # later sessions never move the pilot


def test_library_arrays_round_trip_and_refuse_bad_arrays():
    lib = SessionLibrary(1, 4)
    lib.end_session(0, _model(1.0), None)
    lib.end_session(1, _model(2.0), _model(0.5))
    spec = {k: s for k, (s, _) in tensor_spec(MSPEC).items()}
    again = SessionLibrary(1, 4)
    again.load(lib.state(), lib.arrays(), spec)
    assert [(s.session, s.gradient is not None) for s in again.saved] == [(0, False), (1, True)]
    assert _equal(again.pilot, lib.pilot) and _equal(again.saved[1].gradient, _model(0.5))
    bad = dict(lib.arrays())
    key = next(k for k in bad if k.startswith("saved/1/model/"))
    bad[key] = np.full(bad[key].shape, np.nan, dtype=np.float32)
    with pytest.raises(ValueError, match="non-finite"):
        SessionLibrary(1, 4).load(lib.state(), bad, spec)
    del bad[key]
    with pytest.raises(ValueError, match="missing"):
        SessionLibrary(1, 4).load(lib.state(), bad, spec)


def test_previous_builds_nothing_and_average_is_the_mean():
    saved = [SavedSession(0, _model(1.0)), SavedSession(1, _model(3.0), _model(0.0))]
    assert PreviousInit().build(saved, _model(1.0)) is None
    assert AverageInit().build([], None) is None
    assert _equal(AverageInit().build(saved, None), _model(2.0))


def test_session_init_weights_by_softmax_of_the_gradient_distance():
    g1, g2 = _model(1.0), _model(-1.0)
    saved = [SavedSession(0, _model(5.0)),                    # pilot session: no gradient, no say
             SavedSession(1, _model(10.0), g1), SavedSession(2, _model(20.0), g2)]
    init = GradientWeightedInit(kappa=10.0)
    built = init.build(saved, _model(0.9))                    # close to g1
    assert set(init.last_weights) == {1, 2} and init.last_weights[1] > 0.999
    assert np.allclose(next(iter(built.values())), 10.0, atol=0.02)
    # kappa = 0: the plain mean of the candidates (the paper's limit)
    assert _equal(GradientWeightedInit(kappa=0.0).build(saved, _model(0.9)), _model(15.0))
    # eqs. 18-19 by hand, absolute distances
    n = sum(int(np.prod(s)) for s, _ in tensor_spec(MSPEC).values())
    d1, d2 = math.sqrt(n) * 0.1, math.sqrt(n) * 1.9
    c1 = math.exp(-0.05 * d1) / (math.exp(-0.05 * d1) + math.exp(-0.05 * d2))
    built = GradientWeightedInit(kappa=0.05, distance="absolute").build(saved, _model(0.9))
    assert np.allclose(next(iter(built.values())), 10.0 * c1 + 20.0 * (1 - c1), rtol=1e-4)
    assert GradientWeightedInit().build(saved[:1], _model(0.9)) is None   # no gradient saved yet


def test_similarity_weights_are_stable_and_make_init_checks_names():
    w = similarity_weights([1e6, 1e6 + 1.0], kappa=1e3)
    assert np.isfinite(w).all() and w.sum() == pytest.approx(1.0) and w[0] > w[1]
    assert make_init("average").name == "average"
    with pytest.raises(ValueError, match="unknown session init"):
        make_init("bogus")
    with pytest.raises(ValueError):
        GradientWeightedInit(kappa=float("nan"))


def test_aux_round_takes_each_devices_first_update_from_its_model():
    r = AuxRound(version=5, started_s=0.0, expected=["a", "b"], quorum=1.0, wait_s=10.0)
    assert not r.offer(make_update(MSPEC, device_id="a", base_version=4))    # an older model's
    assert r.offer(make_update(MSPEC, 1.0, device_id="a", base_version=5, num_samples=10))
    assert not r.offer(make_update(MSPEC, 9.0, device_id="a", base_version=5))  # a second round
    assert not r.done(1.0) and r.done(10.0)                                  # waited long enough
    assert r.offer(make_update(MSPEC, 4.0, device_id="b", base_version=5, num_samples=30))
    assert r.done(1.0)
    assert _equal(r.merged(), _model(3.25))                                  # sample-weighted


def test_config_refuses_bad_values():
    for bad in ({"init": "nope"}, {"similarity_sharpness": float("nan")}, {"aux_rounds": 0}, {"aux_quorum": 0.0},
                {"change_fraction": float("nan")}, {"distance": "cosine"}, {"settle_s": -1.0},
                {"aux_model": "served"}):
        with pytest.raises(ValueError):
            SessionsConfig(**bad)


# ---- through the coordinator core --------------------------------------------------------------
def _core(strategy="fedavg", **settings):
    plugin = {"init": "session-init", "change_fraction": 0.3, "settle_s": 1.0, "min_session_s": 5.0,
              "aux_wait_s": 30.0}
    plugin.update(settings)
    return CoordinatorCore(build(CoordinatorConfig, {
        "model": SPEC, "admission": UNBOUNDED_ADMISSION, "strategy": strategy,
        "fedavg": {"deadline_s": 100.0}, "plugins": {"sessions": plugin}}, "test"), tensors=_model(0.1))


def _session(core):
    return core.global_model().extras["session"]


def _train(core, devices, value, now):
    """Every device sends one update trained from the current version; the steps."""
    return [core.on_update(make_update(MSPEC, value, device_id=d, base_version=core.version), now)
            for d in devices]


def _change(core, gone, new, now):
    for d in gone:
        core.on_message(Offline(device_id=d), now)
    greet(core, *new, now=now)


@pytest.mark.parametrize("strategy", ["fedavg", "fedasync"])
def test_a_session_runs_its_aux_round_from_the_pilot_then_starts_from_the_nearest_saved_model(strategy):
    core = greet(_core(strategy), "a", "b", "c")
    core.tick(0.0)
    assert _session(core) == SessionTerms(0, 0, 1)
    _train(core, "abc", 1.0, 1.0)                       # session 0 ends at 1.0 (FedAsync: nearly)
    session0 = {k: v.copy() for k, v in core.model.items()}
    _change(core, ["c"], ["d", "e"], 6.0)               # 3 of 3 changed
    assert not core.tick(6.0).aggregations              # the change must last settle_s
    step = core.tick(7.5)
    plugin = core.plugin("sessions")
    assert plugin.session == 1 and plugin.library.pilot is not None
    assert len(step.aggregations) == 1 and step.aggregations[0].merged == ()   # a switch, no round
    assert _equal(core.model, session0) and _session(core) == SessionTerms(1, 1, 1)  # the pilot
    pilot_version = core.version
    events = [e for e in step.events if e["event"] == "session"]
    assert [e["what"] for e in events] == ["boundary", "aux"] and events[0]["change"] == pytest.approx(1.0)
    # an update trained before the switch is not part of the aux round, nor aggregated
    late = core.on_update(make_update(MSPEC, 7.0, device_id="a", base_version=pilot_version - 1), 8.0)
    assert late.update.outcome == WITHHELD and core.version == pilot_version
    steps = _train(core, ["a", "b", "d"], 3.0, 9.0)     # a quorum of a, b, d, e: wait for e
    assert all(s.update.outcome == WITHHELD for s in steps) and core.version == pilot_version
    assert steps[0].update.fields["session"] == 1
    step = core.on_update(make_update(MSPEC, 3.0, device_id="e", base_version=pilot_version), 9.5)
    # no saved session has a gradient yet (the first after the pilot): back to session 0's model
    assert core.version == pilot_version + 1 and _equal(core.model, session0)
    assert _session(core) == SessionTerms(1, 0, 1)
    init = [e for e in step.events if e.get("what") == "init"]
    assert init and init[0]["answers"] == 4 and init[0]["weights"] == {}
    assert _equal(plugin.gradient, {k: np.full_like(v, 3.0) - session0[k] for k, v in session0.items()})
    # old-session updates are fenced off from the new session's model, under either strategy
    fenced = core.on_update(make_update(MSPEC, 9.0, device_id="a", base_version=pilot_version - 1), 10.0)
    assert fenced.update.outcome == WITHHELD
    # session 1 trains to 5.0, then the fleet changes again; its gradient is the one saved
    for t in (11.0, 12.0, 13.0):
        _train(core, "abde", 5.0, t)
    _change(core, ["d", "e"], ["f"], 20.0)
    core.tick(20.0)
    core.tick(21.5)
    assert plugin.session == 2 and [s.session for s in plugin.library.saved] == [0, 1]
    _train(core, "abf", 3.1, 22.0)                      # a gradient close to session 1's
    assert plugin.aux is None and plugin.init.last_weights[1] == pytest.approx(1.0)
    assert np.allclose(next(iter(core.model.values())), next(iter(plugin.library.saved[1].model.values())))


def _marked(core, device, value, session, aux_round=1, **fields):
    return make_update(MSPEC, value, device_id=device, base_version=core.version,
                       extras={"session-aux": SessionAux(session, aux_round)}, **fields)


def test_beside_the_fleet_keeps_training_while_marked_updates_measure_the_gradient_from_the_pilot():
    core = greet(_core("fedasync", aux_model="beside"), "a", "b", "c")
    core.tick(0.0)
    _train(core, "abc", 1.0, 1.0)
    session0 = {k: v.copy() for k, v in core.model.items()}
    _change(core, ["c"], ["d", "e"], 6.0)
    core.tick(6.0)
    step = core.tick(7.5)
    plugin = core.plugin("sessions")
    assert plugin.session == 1 and plugin.aux_round == 1
    # one version announces the auxiliary model: the fleet's own tensors, nothing merged
    assert [a.merged for a in step.aggregations] == [()]
    assert _equal(core.model, session0)
    terms = _session(core)
    assert terms == SessionTerms(1, 1, 1) and not terms.aux_served and _equal(terms.aux, plugin.library.pilot)
    assert plugin.describe(7.5).fleet["phase"] == "auxiliary-beside"
    # nothing is fenced off by the announcement: an update trained from the version before it counts
    version = core.version
    late = core.on_update(make_update(MSPEC, 1.5, device_id="a", base_version=version - 1), 7.8)
    assert late.update.outcome == "aggregated" and core.version == version + 1
    # the fleet's own updates reach the strategy during the auxiliary round
    version = core.version
    own = _train(core, "ab", 2.0, 8.0)
    assert [s.update.outcome for s in own] == ["aggregated", "aggregated"] and core.version == version + 2
    trained = {k: v.copy() for k, v in core.model.items()}
    # a mark of another round, or a forged one, is kept from the model and from the round
    for mark in ((0, 1), (1, 2)):
        wrong = core.on_update(_marked(core, "d", 9.0, *mark), 8.5)
        assert wrong.update.outcome == WITHHELD and not plugin.aux.updates
    # marked updates: measured against the pilot, withheld from the strategy, merged by the round
    marked = [core.on_update(_marked(core, d, 3.0, 1), 9.0) for d in "abd"]
    assert all(m.update.outcome == WITHHELD for m in marked) and _equal(core.model, trained)
    pilot = plugin.library.pilot
    norm = float(np.sqrt(sum(float(np.sum((3.0 - v.astype(np.float64)) ** 2)) for v in pilot.values())))
    assert core.admission.state()["votes"]["a"][-1] == pytest.approx(norm, rel=1e-5)  # a's vote
    step = core.on_update(_marked(core, "e", 3.0, 1), 9.5)    # the quorum: a, b, d, e
    # nothing saved has a gradient yet: the fleet keeps the model it trained meanwhile, no switch
    assert plugin.aux is None and plugin.aux_round == 0 and not step.aggregations
    assert _equal(core.model, trained) and _session(core).aux is None
    assert _equal(plugin.gradient, {k: np.full_like(v, 3.0) - pilot[k] for k, v in pilot.items()})
    assert [e["what"] for e in step.events if e["event"] == "session"] == ["init"]
    # nothing is fenced off: the fleet goes on
    assert core.on_update(make_update(MSPEC, 4.0, device_id="a", base_version=core.version), 10.0).update.outcome \
        == "aggregated"


def test_beside_a_marked_int8_delta_is_added_to_the_auxiliary_model_it_trained_from():
    core = greet(_core("fedasync", aux_model="beside", aux_quorum=0.5), "a", "b")
    core.tick(0.0)
    _train(core, "ab", 1.0, 1.0)
    _change(core, ["b"], ["c"], 6.0)
    core.tick(6.0)
    core.tick(7.5)
    plugin = core.plugin("sessions")
    pilot = plugin.aux_model
    assert pilot is not None and plugin.aux_round == 1
    _train(core, "a", 2.0, 7.6)                           # the fleet's model moves away from the pilot
    assert not _equal(core.model, pilot)
    dec = Decoder({MSPEC.arch_id: tensor_spec(MSPEC)})
    update = _marked(core, "a", None, 1, seed=4)
    frame = encode(update, encoding="int8_delta", base=pilot)
    decoded = dec.decode(frame)
    assert decoded.extras["session-aux"] == SessionAux(1, 1)
    core.on_update(decoded, 8.0)                          # a quorum of one: the round closes
    assert plugin.gradient is not None
    want = {k: update.tensors[k] - pilot[k] for k in pilot}
    got = plugin.gradient
    assert all(np.allclose(got[k], want[k], atol=0.02) for k in want)


def test_beside_survives_a_restart_mid_aux_round(tmp_path):
    core = greet(_core(aux_model="beside"), "a", "b")
    core.tick(0.0)
    _train(core, "ab", 1.0, 1.0)
    _change(core, ["b"], ["c"], 6.0)
    core.tick(6.0)
    core.tick(7.5)
    aux = core.plugin("sessions").aux_model
    Persister(StateStore(tmp_path)).flush(core)
    tensors, state = StateStore(tmp_path).load(MSPEC)
    again = greet(_core(aux_model="beside"), "a", "c")
    again.restore(tensors, state, now=0.0)
    plugin = again.plugin("sessions")
    assert plugin.aux_round == 1 and _equal(plugin.aux_model, aux) and _equal(_session(again).aux, aux)
    again.tick(0.5)
    for d in "ac":
        again.on_update(_marked(again, d, 2.0, 1), 1.0)
    assert plugin.aux_round == 0 and plugin.gradient is not None


def test_previous_switches_nothing_and_average_switches_to_the_mean():
    for init, switches in (("previous", 0), ("average", 1)):
        core = greet(_core(init=init), "a", "b")
        core.tick(0.0)
        _train(core, "ab", 2.0, 1.0)
        version = core.version
        _change(core, ["b"], ["c"], 6.0)
        core.tick(6.0)
        step = core.tick(7.5)
        assert core.plugin("sessions").session == 1 and core.version == version + switches
        assert core.counters["switches"] == switches
        if switches:
            assert step.aggregations[0].merged == () and _equal(core.model, _model(2.0))


def test_flapping_devices_and_young_sessions_do_not_end_a_session():
    core = greet(_core(min_session_s=30.0), "a", "b", "c")
    core.tick(0.0)
    for t in range(1, 29):
        if t % 2:
            _change(core, ["c"], ["x"], float(t))     # one board in three flaps: 2/3 changed
        else:
            _change(core, ["x"], ["c"], float(t))
        core.tick(float(t))
    assert core.plugin("sessions").session == 0


def test_a_silent_device_counts_as_gone():
    core = greet(_core(init="previous", silence_s=10.0, min_session_s=0.0), "a", "b")
    core.tick(0.0)
    for t in (5.0, 9.0, 13.0, 17.0):
        core.on_update(make_update(MSPEC, device_id="a", base_version=core.version), t)
        core.tick(t)
    assert core.plugin("sessions").session == 1     # b went silent at 10 s: half the fleet changed


def test_an_operator_command_starts_a_session_at_once_once_the_session_is_old_enough():
    core = greet(_core(init="previous", min_session_s=0.5), "a", "b")
    core.tick(0.0)
    assert core.on_operator(Command(kind="new-session"), 1.0).commands == []
    assert core.plugin("sessions").session == 1
    assert core.counters["operator_commands"] == 1
    core.on_operator(Command(kind="unknown-thing"), 2.0)     # logged and ignored
    assert core.plugin("sessions").session == 1


def test_new_sessions_inside_min_session_s_are_deferred_to_its_end_and_make_one():
    core = greet(_core(init="previous", min_session_s=10.0), "a", "b")
    core.tick(0.0)
    plugin = core.plugin("sessions")
    steps = [core.on_operator(Command(kind="new-session"), t) for t in (1.0, 2.0, 5.0)]
    assert plugin.session == 0
    assert [e["what"] for s in steps for e in s.events if e.get("event") == "session"] == ["deferred"]
    core.tick(9.9)
    assert plugin.session == 0
    step = core.tick(10.0)
    assert plugin.session == 1
    assert [(e["what"], e.get("reason")) for e in step.events] == [("boundary", "operator")]
    core.tick(15.0)
    core.tick(30.0)
    assert plugin.session == 1                           # three commands, one session


def test_min_session_s_counts_from_the_end_of_the_auxiliary_round():
    """A session in its auxiliary round withholds every update: a new-session then, or a membership
    change, waits until the session has trained its own model for min_session_s."""
    core = greet(_core(min_session_s=5.0), "a", "b")
    core.tick(0.0)
    plugin = core.plugin("sessions")
    _train(core, "ab", 1.0, 1.0)
    core.on_operator(Command(kind="new-session"), 6.0)   # session 0 is 6 s old: at once
    assert plugin.session == 1 and plugin.aux_round == 1
    core.on_operator(Command(kind="new-session"), 7.0)   # in the auxiliary round: deferred
    _change(core, ["b"], ["c"], 8.0)                     # and a membership change too
    for t in (8.0, 10.0, 15.0, 19.0):
        core.tick(t)
    assert plugin.session == 1 and plugin.aux_round == 1
    _train(core, "ac", 2.0, 20.0)                        # the aux round closes at 20 s
    assert plugin.aux_round == 0
    core.tick(24.9)
    assert plugin.session == 1
    core.tick(25.0)
    assert plugin.session == 2


def test_sessions_survive_a_restart_mid_aux_round(tmp_path):
    core = greet(_core(), "a", "b")
    core.tick(0.0)
    _train(core, "ab", 1.0, 1.0)
    _change(core, ["b"], ["c"], 6.0)
    core.tick(6.0)
    core.tick(7.5)
    assert core.plugin("sessions").aux_round == 1
    Persister(StateStore(tmp_path)).flush(core)
    tensors, state = StateStore(tmp_path).load(MSPEC)
    again = greet(_core(), "a", "c")
    again.restore(tensors, state, now=0.0)
    plugin = again.plugin("sessions")
    assert plugin.session == 1 and plugin.aux_round == 1 and plugin.library.pilot is not None
    assert _session(again) == SessionTerms(1, 1, 1)
    again.tick(0.5)
    _train(again, "ac", 2.0, 1.0)
    assert plugin.aux_round == 0 and plugin.gradient is not None and _session(again).aux_round == 0


# ---- the payload --------------------------------------------------------------------------------
def test_session_terms_round_trip_and_refuse_forgeries():
    dec = Decoder({MSPEC.arch_id: tensor_spec(MSPEC)})
    gm = make_global_model(MSPEC, extras={"session": SessionTerms(3, 1, 2)})
    assert dec.decode(encode(gm)).extras["session"] == SessionTerms(3, 1, 2)
    for fields in ({"session": -1}, {"session": 1, "aux_round": 3, "aux_rounds": 2},
                   {"session": 1, "aux_rounds": 10 ** 9}, {"session": 1, "extra": 1}, {"session": "1"}):
        with pytest.raises(ProtocolError):
            SessionTerms.parse(fields, {})


# ---- the agent side ----------------------------------------------------------------------------
def _ctx(base_version):
    return RoundContext(model=None, tensors={}, round_index=0, seed=0, sample=None, buffer_len=8,
                        base_version=base_version)


def test_agent_trains_an_aux_model_once_and_forgets_windows_on_a_new_session_when_asked():
    plugin = SessionsAgentPlugin(SessionsAgentConfig(forget_on_new_session=True))
    decision = plugin.on_model_received(make_global_model(MSPEC, version=3, extras={"session": SessionTerms(0)}), {})
    assert plugin.session == 0 and not decision.forget_windows and plugin.on_round_opportunity(0.0)
    decision = plugin.on_model_received(make_global_model(MSPEC, version=4, extras={"session": SessionTerms(1, 1)}), {})
    assert decision.forget_windows
    plugin.after_round(_ctx(3))                         # a round from the old model: not the aux one
    assert plugin.on_round_opportunity(0.0)
    plugin.after_round(_ctx(4))
    assert not plugin.on_round_opportunity(0.0)         # rests until the next model
    decision = plugin.on_model_received(make_global_model(MSPEC, version=5, extras={"session": SessionTerms(1)}), {})
    assert plugin.on_round_opportunity(0.0) and not decision.forget_windows


def test_agent_keeps_its_windows_by_default():
    plugin = SessionsAgentPlugin(SessionsAgentConfig())
    plugin.on_model_received(make_global_model(MSPEC, version=1, extras={"session": SessionTerms(0)}), {})
    assert not plugin.on_model_received(make_global_model(MSPEC, version=2, extras={"session": SessionTerms(1)}),
                                        {}).forget_windows


def test_an_agent_core_empties_its_buffer_when_a_new_session_is_announced():
    from streamfl.agent.config import AgentConfig
    from streamfl.agent.core import AgentCore, NotReadyError
    from streamfl.protocol.messages import GlobalModel
    from streamfl.sensors.window import Window
    cfg = build(AgentConfig, {"device_id": "d1", "model": SPEC, "min_buffer": 4, "local_steps": 2,
                              "batch_size": 4, "plugins": {"sessions": {"forget_on_new_session": True}},
                              "sensor": {"channels": 3, "window_len": 8, "num_classes": 3}}, "test")
    agent = AgentCore(cfg, clock=lambda: 0.0, seed=3)
    rng = np.random.default_rng(0)

    def feed(n):
        for i in range(n):
            agent.add_window(Window(rng.standard_normal((8, 3)).astype(np.float32), i % 3))

    def model(version, session, aux_round=0):
        return GlobalModel(version=version, arch_id=MSPEC.arch_id, tensors=_model(0.1),
                           hparams={"lr": 0.05}, extras={"session": SessionTerms(session, aux_round)})

    feed(10)
    agent.on_global_model(model(1, 0))
    assert len(agent.buffer) == 10
    agent.on_global_model(model(2, 1, aux_round=1))       # a new session: the old world's windows go
    assert len(agent.buffer) == 0
    with pytest.raises(NotReadyError):
        agent.begin_round()
    feed(6)

    def may_train():
        """The core is ready and no plug-in declines the round."""
        return agent.ready(0.0) and agent.round_opportunity(0.0)

    plan = agent.begin_round()
    agent.finish_round(plan)                              # one round from the auxiliary model...
    assert not may_train()                                # ... then it waits for the next model
    agent.on_global_model(model(3, 1))
    assert len(agent.buffer) == 6 and may_train()         # same session: the windows stay
    agent.finish_round(agent.begin_round())
    agent.on_global_model(model(4, 1, aux_round=1))
    agent.finish_round(agent.begin_round())               # an auxiliary round trained ...
    assert not may_train()
    agent.on_global_model(GlobalModel(version=5, arch_id=MSPEC.arch_id, tensors=_model(0.1), hparams={"lr": 0.05}))
    assert agent.plugin("sessions").session is None       # ... sessions stop: the plug-in starts afresh
    assert may_train()


def test_an_agent_core_trains_one_round_from_the_auxiliary_model_beside_then_the_global_one():
    from streamfl.agent.config import AgentConfig
    from streamfl.agent.core import AgentCore
    from streamfl.protocol.messages import GlobalModel
    from streamfl.sensors.window import Window
    cfg = build(AgentConfig, {"device_id": "d1", "model": SPEC, "min_buffer": 4, "local_steps": 2,
                              "batch_size": 4, "sensor": {"channels": 3, "window_len": 8, "num_classes": 3}},
                "test")
    agent = AgentCore(cfg, clock=lambda: 0.0, seed=3)
    rng = np.random.default_rng(0)
    for i in range(10):
        agent.add_window(Window(rng.standard_normal((8, 3)).astype(np.float32), i % 3))
    fleet, aux = _model(0.1), _model(-0.3)

    def model(version, terms):
        return GlobalModel(version=version, arch_id=MSPEC.arch_id, tensors=fleet, hparams={"lr": 0.05},
                           extras={"session": terms})

    agent.on_global_model(model(1, SessionTerms(0)))
    agent.finish_round(agent.begin_round())
    agent.on_global_model(model(2, SessionTerms(1, 1, 1, aux=aux)))
    plan = agent.begin_round()
    assert plan.side_start and plan.base_version == 2 and _equal(plan.start_tensors, aux)
    update = agent.finish_round(plan)
    assert update.extras["session-aux"] == SessionAux(1, 1) and update.base_version == 2
    assert agent.ready(0.0) and agent.round_opportunity(0.0)    # no rest: the fleet's model waits
    plan = agent.begin_round()                                   # back to the global model, once
    assert not plan.side_start and plan.base_version == 2 and _equal(plan.start_tensors, fleet)
    update = agent.finish_round(plan)
    assert "session-aux" not in update.extras
    agent.on_global_model(model(3, SessionTerms(1, 1, 1, aux=aux)))  # the same round: trained already
    plan = agent.begin_round()
    assert not plan.side_start and _equal(plan.start_tensors, fleet)
    agent.finish_round(plan)
    plan = agent.begin_round()                                   # FedAsync: continues its own model
    assert plan.start_tensors is None and plan.base_version == 3
