"""Per-window importance sampling over a real MQTT broker, by name: a coordinator process whose
file says ``method: is-window``, two agent processes whose sensor is the MQTT source, windows published to
their ``sensor`` topics as a gateway would. Each board scores every window offered to its full
buffer on its sensor thread, with a copy of its last round's model, while it goes on training."""
import pytest

import test_sfedpo_mqtt as windows
from streamfl.methods.importance.payloads import ImportanceTerms
from streamfl.sim.demo import DemoOptions

A, B = windows.A, windows.B
AGENT = {"round_interval_s": 0.5, "telemetry_interval_s": 1.0, "buffer_capacity": 32,
         "min_buffer": 16, "sensor": {"kind": "mqtt"}}
COORDINATOR = {"method": "is-window", "fedavg": {"deadline_s": 2.0, "min_updates": 1},
               "eval_every_versions": 1000}
SCORING = "importance sampling per window: scoring each window offered"


@pytest.mark.integration
@pytest.mark.timeout(150)
def test_boards_score_each_window_by_name_over_mqtt_and_keep_training(fleet, mqtt_broker):
    run = fleet(opts=DemoOptions(seed=0, model="mlp"), agent_overrides=AGENT,
                coordinator_overrides=COORDINATOR)
    boards = windows.TwoBoards(run, mqtt_broker)
    ids = boards.ids

    def scoring(i):
        return SCORING in run.agents[i].log_text()

    def accepted(i):
        return [u for u in run.updates() if u.get("device") == ids[i] and u.get("outcome") in windows.ACCEPTED]

    with boards:
        run.wait_for(lambda: scoring(A) and scoring(B), 60, "both boards scoring windows")
        before = {i: len(accepted(i)) for i in ids}
        run.wait_for(lambda: all(len(accepted(i)) >= before[i] + 3 for i in ids), 60,
                     "three more updates from each board while it scores", poll_s=0.25)
        terms = [gm.extras.get(ImportanceTerms.KIND) for gm in boards.watcher.models()]
        sent = dict(boards.publisher.sent)

    assert terms and all(isinstance(t, ImportanceTerms) and t.per_window for t in terms), terms
    assert all(sent[i] > AGENT["buffer_capacity"] for i in ids), sent
    for i in ids:
        text = run.agents[i].log_text()
        assert text.count(SCORING) == 1 and "Traceback" not in text, run.agents[i].tail()
    codes = {p.name: p.popen.returncode for p in run.procs}
    assert set(codes.values()) == {0}, (codes, run.diagnostics())
