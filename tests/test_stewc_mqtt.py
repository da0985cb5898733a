"""ST-EWC over a real MQTT broker: a coordinator whose periods run on a schedule, and two agent
processes. A period boundary is announced in the global model and reaches the agents; each answers
with its T-FDM; the coordinator folds them into P and Q (eq. 9) and broadcasts them; from then on
the agents train with the temporal term ``lambda1 (P theta - Q)`` in their gradient, beside
FedCurv's spatial term.

Read from what the processes leave behind: the coordinator's metrics.jsonl (``period`` and
``consolidated`` events), the global models seen on the broker, and the agents' logs.
"""
import re

import pytest

from fleet import ModelWatcher
from streamfl.methods.stewc.payloads import PeriodTerms

AGENTS = 2
PERIOD_S = 6.0
AGENT = {"round_interval_s": 0.5, "telemetry_interval_s": 1.0, "buffer_capacity": 64, "min_buffer": 32}
COORDINATOR = {
    "strategy": "fedasync",
    "plugins": {"fedcurv": {"fisher_samples": 8},
                "stewc": {"boundary": "schedule", "period_s": PERIOD_S, "temporal_strength": 5.0,
                          "fisher_samples": 8, "fisher_wait_s": 20.0}},
}
PULL = re.compile(r"temporal EWC term in period (\d+): lambda1 ([0-9.e+-]+), "
                  r"\|lambda1 \(P theta - Q\)\| = ([0-9.e+-]+)")


@pytest.mark.integration
@pytest.mark.timeout(150)
def test_a_period_boundary_reaches_the_agents_and_p_q_enter_their_gradients(fleet, mqtt_broker):
    run = fleet(agent_overrides=AGENT, coordinator_overrides=COORDINATOR)
    devices = [run.device_id(i) for i in range(AGENTS)]
    watcher = ModelWatcher(mqtt_broker.host, mqtt_broker.port, run.fleet, run.spec)
    try:
        run.start_coordinator()
        for i in range(AGENTS):
            run.start_agent(i)

        def consolidated():
            return [m for m in run.metrics() if m.get("event") == "consolidated"] or None
        folded = run.wait_for(consolidated, 90, "a period's T-FDM folded into P and Q", poll_s=0.5)

        def pulled():
            logs = {d: PULL.findall(run.agents[i].log_text()) for i, d in enumerate(devices)}
            return logs if all(logs.values()) else None
        pulls = run.wait_for(pulled, 40, "every agent training with the temporal term", poll_s=0.5)
        models = watcher.models()
    finally:
        watcher.close()
    run.stop_all()

    metrics = run.metrics()
    periods = [m for m in metrics if m.get("event") == "period"]
    assert periods and periods[0]["period"] == 1 and periods[0]["boundary"] == "schedule", periods
    assert folded[0]["period"] == 0 and folded[0]["devices"] == AGENTS, folded
    # The boundary reached both agents, and both answered it with their T-FDM.
    for i in range(AGENTS):
        text = run.agents[i].log_text()
        assert "period 1 begins" in text, run.agents[i].tail()
        assert "T-FDM of period 0 from" in text, run.agents[i].tail()
    # Global models: the announcement (period 1, consolidating 0, no P yet), then P and Q.
    terms = [gm.extras[PeriodTerms.KIND] for gm in models if PeriodTerms.KIND in gm.extras]
    assert any(t.period == 1 and t.consolidating == 0 and t.P is None for t in terms), terms[:5]
    with_pq = [t for t in terms if t.P is not None]
    assert with_pq and all(set(t.P) == set(run_spec_names(models)) for t in with_pq)
    assert all(float(max(a.max() for a in t.P.values())) > 0 for t in with_pq)
    # The agents' gradients now carry lambda1 (P theta - Q): a non-zero pull, logged by each.
    for d, found in pulls.items():
        period, lam, pull = found[0]
        assert int(period) >= 1 and float(lam) == 5.0 and float(pull) > 0, (d, found)
    codes = {p.name: p.popen.returncode for p in run.procs}
    assert set(codes.values()) == {0}, (codes, run.diagnostics())


def run_spec_names(models):
    return set(models[0].tensors)
