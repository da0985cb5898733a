"""A named method's agent side over a real MQTT broker: a real agent process takes what it may
from the ``method_settings`` of each global model, refuses the rest, and keeps training.

The test speaks for the coordinator: it publishes retained global models on the fleet's model
topic, first with a method's valid settings (applied), then hostile ones: keys out of range, of
the wrong type, unknown, the board's own or never a coordinator's (refused key by key, the model
still taken, one warning), a NaN (the frame refused by the codec), an oversize payload (refused),
a wrong shape (refused, its warning held back by the rate limit), and finally none (the board goes
back to its own settings). After every model it takes, the agent's next update must start from
that model: it never stopped training.
"""
import json

import pytest

from fleet import FAST_MQTT, ModelWatcher
from streamfl.methods.agent_side import KIND, MethodSettings
from streamfl.models import build_model, model_to_arrays
from streamfl.protocol.codec import encode
from streamfl.protocol.messages import GlobalModel, Update
from streamfl.protocol.transport.base import MqttSettings
from streamfl.protocol.transport.paho import PahoTransport

AGENT = {"round_interval_s": 0.5, "telemetry_interval_s": 1.0, "buffer_capacity": 64, "min_buffer": 16}
HPARAMS = {"lr": 0.05, "batch_size": 8, "local_steps": 2, "dropout": 0.0}
RUN = "method-settings-test"

HOSTILE = {
    "plugins": {"clp": {"lr_rule": "bogus", "fisher_samples": -1, "rest_rounds": 1e300, "initial_lr": "fast",
                        "no_such_key": 1},
                "schedule": {"channel_snr_hz": 1e6},
                "no_such_plugin": {"x": 1}},
    "buffer_capacity": 1,
    "mqtt": {"host": "evil.example"},
    "dvfs": {"policy": "powersave", "backend": "none"},
}


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_hostile_method_settings_are_refused_and_the_agent_keeps_training(fleet, mqtt_broker):
    run = fleet(agent_overrides=AGENT)
    device = run.device_id(0)
    updates_topic = run.topics.device(device, "update")
    watcher = ModelWatcher(mqtt_broker.host, mqtt_broker.port, run.fleet, run.spec,
                           client_id="test-updates", extra_topics=(updates_topic,))
    coordinator = PahoTransport(MqttSettings(host=mqtt_broker.host, port=mqtt_broker.port,
                                             client_id="test-coordinator", **FAST_MQTT))
    coordinator.connect()
    tensors = model_to_arrays(build_model(run.spec, seed=0))

    def frame(version, extra=None):
        extras = {} if extra is None else {KIND: extra}
        return encode(GlobalModel(version=version, arch_id=run.spec.arch_id, tensors=tensors,
                                  hparams=HPARAMS, extras=extras, run_id=RUN))

    def publish(payload):
        coordinator.publish(run.topics.model, payload, qos=1, retain=True)

    def log_has(text):
        return text in agent.log_text()

    def trained_from(version):
        """An update of the agent that started from global model ``version``."""
        def found():
            return [m for _, m in watcher.on_topic(updates_topic)
                    if isinstance(m, Update) and m.base_version == version]
        run.wait_for(found, 60, "an update from global model v%d" % version, poll_s=0.3)

    try:
        run.wait_for(lambda: coordinator.connected, 10, "the test's coordinator client connected")
        agent = run.start_agent(0)

        # v1: a method's valid settings are applied.
        publish(frame(1, MethodSettings.of("streamclp", {"plugins": {"clp": {"lr_rule": "learned"}}})))
        run.wait_for(lambda: log_has("plug-in clp settings from global model v1 (method streamclp): "
                                     "lr_rule: 'paper' -> 'learned'"), 60, "the method's settings applied")
        trained_from(1)

        # v2: hostile keys are refused one by one, in one warning; the model is taken.
        publish(frame(2, MethodSettings.of("evil", HOSTILE)))
        run.wait_for(lambda: log_has("global model v2: settings of method evil not applied"), 30,
                     "the refusal warning")
        trained_from(2)
        text = agent.log_text()
        for needle in ("plugins.clp.lr_rule='bogus'", "plugins.clp.fisher_samples=-1", "out of range",
                       "plugins.clp.rest_rounds=1e+300", "plugins.clp.initial_lr='fast'",
                       "plugins.clp.no_such_key", "plugins.schedule.channel_snr_hz (this board's own",
                       "plugins.no_such_plugin (no such plug-in", "buffer_capacity (not a setting",
                       "mqtt (not a setting", "dvfs.backend (not a setting",
                       "dvfs.policy='powersave' (this board's own dvfs.policy is none"):
            assert needle in text, needle
        assert "lr_rule: 'learned' -> 'paper'" in text          # nothing valid left: its own settings
        assert "evil.example" not in text.split("not applied", 1)[0]

        # v3: a NaN in the settings; the codec refuses the whole frame (same length as 1.5).
        nan = frame(3, MethodSettings.of("evil", {"plugins": {"clp": {"rest_rounds": 1.5}}}))
        assert nan.count(b'"rest_rounds":1.5') == 1
        publish(nan.replace(b'"rest_rounds":1.5', b'"rest_rounds":NaN'))
        run.wait_for(lambda: log_has("non-finite number"), 30, "the NaN frame dropped")

        # v4: an oversize payload (built past MethodSettings.of's checks); refused by the codec.
        huge = {"plugins": {"p%02d" % i: {"k": "x" * 100} for i in range(40)}}
        publish(frame(4, MethodSettings("evil", json.dumps(huge))))
        run.wait_for(lambda: log_has("keys, at most 32"), 30, "the oversize frame dropped")

        # v5: settings of the wrong shape: refused, the warning held back (one a minute).
        publish(frame(5, MethodSettings.of("evil", {"plugins": [1, 2], "dvfs": "fast"})))
        trained_from(5)
        assert agent.log_text().count("not applied:") == 1, agent.tail()

        # v6: no settings: the board's own again, and still training.
        publish(frame(6))
        run.wait_for(lambda: log_has("global model v6 carries no method settings"), 30, "the fallback")
        trained_from(6)
        assert agent.alive
        for version in (3, 4):   # the refused frames never reached the agent's core
            assert "global model v%d" % version not in agent.log_text()
    finally:
        watcher.close()
        coordinator.close()
    code = run.agents[0].terminate()
    assert code == 0, run.diagnostics()
