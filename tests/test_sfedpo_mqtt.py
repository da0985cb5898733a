"""SFedPO over a real MQTT broker: windows with latent states in, DDS admission and SAW out.

A coordinator process (FedAvg, the ``sfedpo`` plug-in) and two agent processes whose sensor is the
MQTT source; the test publishes JSON windows with a label and a latent ``state`` to each device's
``sensor`` topic, as a phone or gateway would. Device A sees mostly state 0 (a skewed class mix)
and some state 1 (every class); device B state 1 and, mostly, state 2 (another skewed mix). The
states cycle deterministically, so each device's share of windows per state is known.

Read from what the processes leave behind: the coordinator's metrics.jsonl (each update record's
``saw_factor``, ``sfedpo_score``, ``availability``, ``admission_rate``), the global models on the
broker (their ``SfedpoTerms``: the fleet's state weights w_m) and the agents' logs.
"""
import json
import math
import threading
import time
from typing import Dict, List

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from fleet import ModelWatcher
from streamfl.protocol.messages import GlobalModel, Hello
from streamfl.methods.sfedpo.payloads import SfedpoTerms
from streamfl.sim.demo import DemoOptions

A, B = 0, 1
#: Each device's states in cycle order: A 3/4 state 0, 1/4 state 1; B 1/3 state 1, 2/3 state 2.
STATE_CYCLE = {A: (0, 0, 0, 1), B: (1, 2, 2)}
#: The class mix per state: state 0 skewed to classes 0-1, state 1 balanced, state 2 skewed to 4-5.
LABELS = {0: (0, 0, 0, 1, 1, 2), 1: (0, 1, 2, 3, 4, 5), 2: (5, 5, 5, 4, 4, 3)}
#: The fleet's w_m these cycles give: the mean over the two devices of their state shares.
EXPECTED_W = {0: 0.75 / 2, 1: (0.25 + 1 / 3) / 2, 2: (2 / 3) / 2}
WINDOWS_PER_S = 40.0  # per device
AGENT = {"round_interval_s": 0.5, "telemetry_interval_s": 1.0, "buffer_capacity": 32,
         "min_buffer": 16, "sensor": {"kind": "mqtt"}, "plugins": {"sfedpo": {}}}
COORDINATOR = {"strategy": "fedavg", "fedavg": {"deadline_s": 2.0, "min_updates": 1},
               "eval_every_versions": 1000, "plugins": {"sfedpo": {}}}
SFEDPO_FIELDS = ("saw_factor", "sfedpo_score", "availability", "admission_rate")
ACCEPTED = ("aggregated", "buffered")


class WindowPublisher:
    """A plain paho client publishing each device's windows (JSON, with ``state``) at a steady pace
    on a background thread until ``stop``."""

    def __init__(self, host: str, port: int, topics: Dict[int, str], shape=(50, 6), seed: int = 0):
        self.topics = topics
        self.shape = shape
        self.sent = {i: 0 for i in topics}
        self._rng = np.random.default_rng(seed)
        self._stop = threading.Event()
        self._client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="test-sensor-publisher",
                                   clean_session=True, protocol=mqtt.MQTTv311)
        self._client.connect(host, port, 30)
        self._client.loop_start()
        self._thread = threading.Thread(target=self._run, name="window-publisher", daemon=True)
        self._t0 = time.monotonic()
        self._thread.start()

    def window(self, device: int, n: int) -> bytes:
        cycle = STATE_CYCLE[device]
        state = cycle[n % len(cycle)]
        label = int(self._rng.choice(LABELS[state]))
        # A class-dependent offset on noise, so the model has something to learn.
        x = self._rng.normal(0.0, 0.3, self.shape) + 0.5 * (label - 2.5)
        doc = {"x": np.round(x, 3).tolist(), "label": label,
               "t_s": round(time.monotonic() - self._t0, 3), "state": state}
        return json.dumps(doc, separators=(",", ":")).encode("utf-8")

    def _run(self) -> None:
        period = 1.0 / WINDOWS_PER_S
        next_t = time.monotonic()
        while not self._stop.is_set():
            for device, topic in self.topics.items():
                self._client.publish(topic, self.window(device, self.sent[device]), qos=0)
                self.sent[device] += 1
            next_t += period
            delay = next_t - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)
            else:
                next_t = time.monotonic()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._client.disconnect()
        self._client.loop_stop()


def _terms(gm: GlobalModel):
    terms = gm.extras.get(SfedpoTerms.KIND)
    return terms if isinstance(terms, SfedpoTerms) else None


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class TwoBoards:
    """The coordinator and boards A and B of ``run`` started and greeted, then windows published to
    both boards' sensor topics (``publisher``) while a watcher reads the models and status topics;
    everything stopped on exit, whatever happened."""

    def __init__(self, run, broker):
        self.run = run
        self.ids = {i: run.device_id(i) for i in (A, B)}
        self._status = {i: run.topics.device(self.ids[i], "status") for i in self.ids}
        self.watcher = ModelWatcher(broker.host, broker.port, run.fleet, run.spec,
                                    extra_topics=tuple(self._status.values()))
        self._broker = broker
        self.publisher = None

    def said_hello(self, i) -> bool:
        return any(isinstance(m, Hello) for _, m in self.watcher.on_topic(self._status[i]))

    def __enter__(self) -> "TwoBoards":
        try:
            self.run.start_coordinator()
            self.run.start_agent(A)
            self.run.start_agent(B)
            self.run.wait_for(lambda: self.said_hello(A) and self.said_hello(B), 60, "both agents' Hellos")
            self.publisher = WindowPublisher(self._broker.host, self._broker.port,
                                             {i: self.run.topics.device(self.ids[i], "sensor") for i in self.ids})
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.publisher is not None:
            self.publisher.stop()
        self.watcher.close()
        self.run.stop_all()


@pytest.mark.integration
@pytest.mark.timeout(150)
def test_sfedpo_admits_windows_by_state_and_weighs_updates_by_saw_over_mqtt(fleet, mqtt_broker):
    run = fleet(opts=DemoOptions(seed=0, model="mlp"), agent_overrides=AGENT,
                coordinator_overrides=COORDINATOR)
    boards = TwoBoards(run, mqtt_broker)
    ids, watcher = boards.ids, boards.watcher

    def sfedpo_updates() -> Dict[str, List[dict]]:
        out: Dict[str, List[dict]] = {ids[i]: [] for i in ids}
        for u in run.updates():
            if u.get("outcome") in ACCEPTED and u.get("device") in out \
                    and all(k in u for k in SFEDPO_FIELDS):
                out[u["device"]].append(u)
        return out

    def fleet_weights():
        models = [gm for gm in watcher.models() if _terms(gm) is not None]
        if models and set(EXPECTED_W) <= set(_terms(models[-1]).states):
            return models[-1]
        return None

    with boards:
        run.wait_for(lambda: all(len(v) >= 3 for v in sfedpo_updates().values()), 60,
                     "three updates from each device with SFedPO's fields", poll_s=0.25)
        run.wait_for(fleet_weights, 20, "a global model with the fleet's three states")
        late = ModelWatcher(mqtt_broker.host, mqtt_broker.port, run.fleet, run.spec,
                            client_id="test-late-subscriber")
        try:
            retained = run.wait_for(lambda: late.models()[:1], 20, "the retained global model")[0]
        finally:
            late.close()
        sent = dict(boards.publisher.sent)

    updates = sfedpo_updates()
    assert all(sent[i] >= AGENT["buffer_capacity"] for i in ids), sent
    for device, records in updates.items():
        for u in records:
            assert all(_finite(u[k]) for k in SFEDPO_FIELDS), u
            assert 0.0 < u["availability"] <= 1.0, u
            assert u["sfedpo_score"] >= 0.0, u
            # Under FedAvg the factor is eq. 14's value itself (the round normalizes the weights):
            # ReLU(1/q_n - a2 s_n + b2) of the device's own report (a2 1, b2 0.5), or less where
            # the peer cap bites; not a constant (q_n 0.277 gives 4.0), and the fields are rounded.
            eq14 = max(0.0, 1.0 / u["availability"] - u["sfedpo_score"] + 0.5)
            assert 0.0 <= u["saw_factor"] <= eq14 + 2e-3, (eq14, u)
            assert 0.0 <= u["admission_rate"] <= 1.0, u
    # Once the buffer is full DDS refuses some windows and admits others (about the budget, 0.5).
    latest = {device: records[-1]["admission_rate"] for device, records in updates.items()}
    assert any(0.0 < rate < 1.0 for rate in latest.values()), latest
    # Some versions were made from these updates (FedAvg with SAW's factors).
    assert any(u["aggregated"] for records in updates.values() for u in records), updates

    # The global model a late subscriber gets carries w_m over both devices' states: the mean of
    # their shares (one device, one vote), summing to 1.
    terms = _terms(retained)
    assert terms is not None, retained.extras
    assert terms.dds and terms.saw and 0.0 < terms.budget < 1.0, terms
    weights = terms.state_weights
    assert set(weights) == set(EXPECTED_W), weights
    assert sum(weights.values()) == pytest.approx(1.0, abs=1e-4), weights
    for state, w in EXPECTED_W.items():
        assert weights[state] == pytest.approx(w, abs=0.08), (state, weights)

    for i in ids:
        assert "SFedPO: admitting windows by latent state" in run.agents[i].log_text(), \
            run.agents[i].tail()
    codes = {p.name: p.popen.returncode for p in run.procs}
    assert set(codes.values()) == {0}, (codes, run.diagnostics())
