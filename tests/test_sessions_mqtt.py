"""Sessions over a real MQTT broker: agents leave and join, the coordinator opens a new session, runs
the auxiliary round and publishes the constructed model.

A coordinator process (FedAvg, the ``sessions`` plug-in with ``init: session-init`` and one pilot
session) and agent processes on synthetic sensors. Agents A and B train session 0; then C joins and
B leaves: session 1 begins, the fleet trains the pilot (session 0's final model) once, those
updates stay out of FedAvg, and the coordinator switches to session 1's model. Then D joins and C
leaves: session 2 runs its auxiliary round too and, since session 1 was saved with its gradient
from the pilot, builds its model from the saved sessions by gradient similarity.

Read from what the processes leave behind: the coordinator's metrics.jsonl (``session`` events, the
update records), the global models seen on the broker (and the retained one a late subscriber
gets), and the agents' logs.

Each swap starts the new agent first and stops the old one once its Hello is on the broker, so
both changes fall within one ``settle_s``. ``change_fraction`` is 0.4, not 0.3: one device joining
(or leaving) a session of two is a change of 0.5, but should the old agent's Offline still come
after the boundary, the session of three it then opened loses one device, 0.33, which must not end
it again.
"""
import re

import pytest

from fleet import ModelWatcher
from streamfl.protocol.messages import GlobalModel, Hello
from streamfl.methods.sessions.payloads import SessionTerms
from streamfl.sim.demo import DemoOptions

A, B, C, D = range(4)
AGENT = {"round_interval_s": 0.5, "telemetry_interval_s": 1.0, "buffer_capacity": 64, "min_buffer": 32}
SESSIONS = {"init": "session-init", "pilot_sessions": 1, "change_fraction": 0.4, "settle_s": 1.0,
            "min_session_s": 3.0, "aux_wait_s": 20.0}
COORDINATOR = {"strategy": "fedavg", "fedavg": {"deadline_s": 2.0}, "eval_every_versions": 1000,
               "plugins": {"sessions": SESSIONS}}
AUX_LOG = re.compile(r"session (\d+): auxiliary round 1/1 \(model version (\d+)\)")
OWN_LOG = re.compile(r"session (\d+): training the session's model \(version (\d+)\)")


def _terms(gm: GlobalModel):
    terms = gm.extras.get(SessionTerms.KIND)
    return (terms.session, terms.aux_round) if isinstance(terms, SessionTerms) else None


@pytest.mark.integration
@pytest.mark.timeout(150)
def test_agents_leave_and_join_and_each_new_session_starts_from_its_constructed_model(
        fleet, mqtt_broker):
    run = fleet(opts=DemoOptions(seed=0, model="mlp"), agent_overrides=AGENT,
                coordinator_overrides=COORDINATOR)
    ids = {i: run.device_id(i) for i in (A, B, C, D)}
    status = {i: run.topics.device(ids[i], "status") for i in ids}
    watcher = ModelWatcher(mqtt_broker.host, mqtt_broker.port, run.fleet, run.spec,
                           extra_topics=tuple(status.values()))

    def said_hello(i):
        return any(isinstance(m, Hello) for _, m in watcher.on_topic(status[i]))

    def session_events(session, what):
        return [m for m in run.metrics() if m.get("event") == "session"
                and m.get("session") == session and m.get("what") == what]

    def swap(join, leave, session):
        """``join`` starts; once its Hello is on the broker ``leave`` stops cleanly (its Offline)."""
        run.start_agent(join)
        run.wait_for(lambda: said_hello(join), 60, "agent %s's Hello" % ids[join], poll_s=0.05)
        run.agents[leave].send_term()
        assert run.agents[leave].terminate(timeout_s=30) == 0, run.diagnostics()
        return run.wait_for(lambda: session_events(session, "init"), 60,
                            "session %d's constructed model" % session, poll_s=0.2)[0]

    try:
        # Both first agents are online (retained Hellos) before the coordinator starts: one session.
        run.start_agent(A)
        run.start_agent(B)
        run.wait_for(lambda: said_hello(A) and said_hello(B), 60, "the first two agents' Hellos")
        run.start_coordinator()
        run.wait_for(lambda: run.version() >= 3 and session_events(0, "start"), 60,
                     "session 0 with a few FedAvg versions", poll_s=0.2)
        init1 = swap(C, B, 1)
        # The metrics line comes before the publisher thread sends the model: wait until it is out.
        run.wait_for(lambda: [m for m in watcher.models() if _terms(m) == (1, 0)], 30,
                     "session 1's own model on the broker", poll_s=0.1)
        late = ModelWatcher(mqtt_broker.host, mqtt_broker.port, run.fleet, run.spec,
                            client_id="test-late-subscriber")
        try:
            retained = run.wait_for(lambda: late.models()[:1], 20, "the retained global model")[0]
        finally:
            late.close()
        init2 = swap(D, C, 2)
        run.wait_for(lambda: [i for i in (A, D) if "session 2: training the session's model"
                              in run.agents[i].log_text()] == [A, D], 30,
                     "A and D training session 2's model")
        models = watcher.models()
    finally:
        watcher.close()
        run.stop_all()

    metrics = run.metrics()
    events = [m for m in metrics if m.get("event") == "session"]
    # One boundary per swap, each from membership, each followed by its auxiliary round and model.
    assert [(e["session"], e["what"]) for e in events] == [
        (0, "start"), (1, "boundary"), (1, "aux"), (1, "init"), (2, "boundary"), (2, "aux"),
        (2, "init")], events
    assert all(e["reason"] == "membership" for e in events if e["what"] == "boundary"), events
    # Session 1: no saved session has a gradient yet, so it goes on from session 0's model;
    # session 2 weighs session 1 (saved with its gradient from the pilot).
    assert init1["answers"] >= 1 and init1["weights"] == {}, init1
    assert init2["answers"] >= 1 and set(init2["weights"]) == {"1"}, init2
    assert init2["weights"]["1"] == pytest.approx(1.0), init2

    # The global models: each session's pilot (aux_round 1), then its own model (aux_round 0).
    seen = [(gm.version, _terms(gm)) for gm in models]
    aux_versions = {}
    for session in (1, 2):
        aux = [v for v, t in seen if t == (session, 1)]
        own = [v for v, t in seen if t == (session, 0)]
        assert aux and own and max(aux) < min(own), seen
        aux_versions[session] = aux[0]
    assert all(t is not None for _, t in seen), seen
    # What a device subscribing after session 1's switch gets first: session 1's own model.
    assert _terms(retained) == (1, 0) and retained.version > aux_versions[1], retained.version

    # The auxiliary updates (trained from the pilot) were withheld from FedAvg, and recorded with
    # their session.
    updates = [m for m in metrics if m.get("event") == "update"]
    assert all("session" in u for u in updates), updates[:3]
    for (session, version), init in zip(sorted(aux_versions.items()), (init1, init2)):
        from_pilot = [u for u in updates if u["base_version"] == version]
        assert len({u["device"] for u in from_pilot}) >= init["answers"], (from_pilot, init)
        assert all(u["session"] == session and u["outcome"] == "withheld" and not u["aggregated"]
                   for u in from_pilot), from_pilot

    # The agents name the session: its auxiliary round, then its own model.
    expect = {A: (0, 1, 2), B: (0,), C: (1,), D: (2,)}
    for i, sessions in expect.items():
        text = run.agents[i].log_text()
        own = {int(s) for s, _ in OWN_LOG.findall(text)}
        assert set(sessions) <= own, (ids[i], own, run.agents[i].tail())
        aux = {int(s): int(v) for s, v in AUX_LOG.findall(text)}
        for session in sessions:
            if session:
                assert aux.get(session) == aux_versions[session], (ids[i], aux, aux_versions)
    codes = {p.name: p.popen.returncode for p in run.procs}
    assert set(codes.values()) == {0}, (codes, run.diagnostics())


def _three_agents(fleet, mqtt_broker, coordinator):
    """A run of agents A and B, with C to swap in for B; a watcher of the models and the agents'
    status topics; and ``said_hello(i)``."""
    run = fleet(opts=DemoOptions(seed=0, model="mlp"), agent_overrides=AGENT,
                coordinator_overrides=coordinator)
    ids = {i: run.device_id(i) for i in (A, B, C)}
    status = {i: run.topics.device(ids[i], "status") for i in ids}
    watcher = ModelWatcher(mqtt_broker.host, mqtt_broker.port, run.fleet, run.spec,
                           extra_topics=tuple(status.values()))

    def said_hello(i):
        return any(isinstance(m, Hello) for _, m in watcher.on_topic(status[i]))

    return run, ids, watcher, said_hello


def _start_then_swap_b_for_c(run, said_hello, before_swap=lambda: None):
    """A and B say Hello before the coordinator starts (one session); after a few versions and
    ``before_swap()``, C joins and B leaves cleanly: session 1's boundary."""
    run.start_agent(A)
    run.start_agent(B)
    run.wait_for(lambda: said_hello(A) and said_hello(B), 60, "the first two agents' Hellos")
    run.start_coordinator()
    run.wait_for(lambda: run.version() >= 3, 60, "a few versions", poll_s=0.2)
    before_swap()
    run.start_agent(C)
    run.wait_for(lambda: said_hello(C), 60, "agent C's Hello", poll_s=0.05)
    run.agents[B].send_term()
    assert run.agents[B].terminate(timeout_s=30) == 0, run.diagnostics()


@pytest.mark.integration
@pytest.mark.timeout(150)
def test_continuous_by_name_distills_on_the_boards_from_the_next_session_on(fleet, mqtt_broker):
    """``method: continuous`` on the coordinator alone: the boards get the distillation from the
    global model's method settings, and after a boundary train toward session 1's start."""
    coordinator = {"method": "continuous", "fedavg": {"deadline_s": 2.0}, "eval_every_versions": 1000,
                   "plugins": {"sessions": dict(SESSIONS, init="previous")}}
    run, ids, watcher, said_hello = _three_agents(fleet, mqtt_broker, coordinator)

    def nothing_distilled_yet():
        assert "distilling" not in run.agents[A].log_text()        # session 0: nothing before it

    try:
        _start_then_swap_b_for_c(run, said_hello, nothing_distilled_yet)
        run.wait_for(lambda: "session 1: distilling toward its starting model"
                     in run.agents[A].log_text(), 60, "A distilling in session 1", poll_s=0.2)
        start = run.version()
        run.wait_for(lambda: run.version() >= start + 2, 60, "session 1 training on", poll_s=0.2)
    finally:
        watcher.close()
        run.stop_all()
    metrics = run.metrics()
    assert [(e["session"], e["what"]) for e in metrics if e.get("event") == "session"][:2] == [
        (0, "start"), (1, "boundary")]
    # A's rounds with the distillation term reach FedAvg (buffered for a round, or the last one).
    accepted = [m for m in metrics if m.get("event") == "update" and m.get("session") == 1
                and m.get("device") == ids[A] and m.get("outcome") in ("buffered", "aggregated")]
    assert accepted, [(m.get("device"), m.get("session"), m.get("outcome"))
                      for m in metrics if m.get("event") == "update"][-8:]


BESIDE_LOG = re.compile(r"session (\d+): trained auxiliary round 1 beside the global model")


@pytest.mark.integration
@pytest.mark.timeout(150)
def test_beside_the_fleet_keeps_training_while_the_boards_answer_the_auxiliary_round(fleet, mqtt_broker):
    """``aux_model: beside`` under FedAsync: at session 1's boundary no other model is switched in
    (one version of the fleet's own model announces the round); the auxiliary model rides in the
    global models, each board trains one round from it and marks it,
    those updates stay out of the model, and the fleet's own updates go on making versions."""
    sessions = dict(SESSIONS, aux_model="beside")
    coordinator = {"strategy": "fedasync", "eval_every_versions": 1000, "plugins": {"sessions": sessions}}
    run, ids, watcher, said_hello = _three_agents(fleet, mqtt_broker, coordinator)

    def init_event():
        return [m for m in run.metrics() if m.get("event") == "session" and m.get("what") == "init"]

    try:
        _start_then_swap_b_for_c(run, said_hello)
        init = run.wait_for(init_event, 60, "session 1's auxiliary round closed", poll_s=0.2)[0]
        start = run.version()
        run.wait_for(lambda: run.version() >= start + 2, 60, "session 1 training on", poll_s=0.2)
        models = watcher.models()
    finally:
        watcher.close()
        run.stop_all()
    metrics = run.metrics()
    events = [(e["session"], e["what"]) for e in metrics if e.get("event") == "session"]
    assert events[:4] == [(0, "start"), (1, "boundary"), (1, "aux"), (1, "init")], events
    # Nothing saved has a gradient yet: the fleet keeps its model. Every version but one is an
    # aggregation: the one that announced the auxiliary model (the fleet's model, nothing merged).
    assert init["answers"] >= 1 and init["weights"] == {}, init
    updates = [m for m in metrics if m.get("event") == "update"]
    made = {u["version"] for u in updates if u["aggregated"]}
    assert len(set(range(1, max(made) + 1)) - made) == 1, sorted(set(range(1, max(made) + 1)) - made)
    # The models of the auxiliary round carry the auxiliary model beside their own tensors.
    beside = [gm for gm in models if _terms(gm) == (1, 1)]
    assert beside and all(gm.extras[SessionTerms.KIND].aux is not None for gm in beside), \
        [(gm.version, _terms(gm)) for gm in models]
    assert all(gm.extras[SessionTerms.KIND].aux is None for gm in models if _terms(gm) != (1, 1))
    # Marked updates stayed out of the model; the fleet's own updates made versions meanwhile.
    aux_t = next(e["time_s"] for e in metrics if e.get("event") == "session" and e.get("what") == "aux")
    init_t = init["time_s"]
    marked = [u for u in updates if u.get("aux_round") == 1]
    assert len({u["device"] for u in marked}) >= init["answers"], marked
    assert all(u["outcome"] == "withheld" and u["session"] == 1 for u in marked), marked
    during = [u for u in updates if aux_t <= u["time_s"] <= init_t and u.get("aux_round") is None]
    assert any(u["outcome"] == "aggregated" for u in during), during
    for i in (A, C):
        assert BESIDE_LOG.search(run.agents[i].log_text()), (ids[i], run.agents[i].tail())
