"""An agent that hears no global model says so: a WARNING naming the topic it waits on and the
fleet, repeated slowly; an agent on the wrong fleet no longer waits silently."""
import logging
import threading

import pytest

from factories import make_global_model
from polling import wait_until
from streamfl.agent.config import AgentConfig
from streamfl.agent.daemon import AgentDaemon
from streamfl.agent.model_wait import REPEAT_FACTOR, ModelWait
from streamfl.config import build
from streamfl.errors import ConfigError
from streamfl.models import ModelSpec
from streamfl.protocol.codec import encode
from streamfl.protocol.topics import Topics
from streamfl.protocol.transport.base import MqttSettings
from streamfl.protocol.transport.paho import PahoTransport
from streamfl.sensors import make_source

TOPIC = "streamfl/v1/ceo/model"


def warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "streamfl.agent.model_wait" and r.levelno == logging.WARNING]


def test_warns_after_the_wait_then_slowly(caplog):
    wait = ModelWait(60.0, TOPIC, "ceo", now=100.0)
    assert not wait.check(0, 159.0)
    assert wait.check(0, 160.0)
    assert TOPIC in warnings(caplog)[0] and "'ceo'" in warnings(caplog)[0]
    assert not wait.check(0, 161.0) and not wait.check(0, 160.0 + 60.0 * REPEAT_FACTOR - 1)
    assert wait.check(0, 160.0 + 60.0 * REPEAT_FACTOR)
    assert wait.warnings == 2 == len(warnings(caplog))


def test_a_model_restarts_the_wait():
    wait = ModelWait(60.0, TOPIC, "ceo", now=0.0)
    assert wait.check(0, 60.0)
    assert not wait.check(1, 100.0)            # a model came
    assert not wait.check(1, 159.0)
    assert wait.check(1, 160.0)                # and then none for 60 s


def test_zero_turns_it_off():
    wait = ModelWait(0.0, TOPIC, "ceo", now=0.0)
    assert not any(wait.check(0, t) for t in (0.0, 1.0, 1e9))


def test_agent_on_another_fleet_warns_naming_its_topic(mqtt_broker, tmp_path, caplog):
    spec = ModelSpec(name="mlp", hidden=16)
    coordinator = PahoTransport(MqttSettings(host=mqtt_broker.host, port=mqtt_broker.port,
                                             client_id="coordinator", persistent_session=False))
    coordinator.connect()
    assert coordinator.wait_connected(10)
    # The coordinator serves fleet "default"; the agent was started with fleet "ceo".
    coordinator.publish(Topics("default").model, encode(make_global_model(spec, version=3)),
                        qos=1, retain=True)
    cfg = build(AgentConfig, dict(fleet="ceo", device_id="dev-1", model=spec, model_wait_warn_s=0.2,
                                  telemetry_interval_s=0.0), "test")
    transport = PahoTransport(MqttSettings(
        host=mqtt_broker.host, port=mqtt_broker.port, client_id="dev-1", persistent_session=False))
    daemon = AgentDaemon(cfg, transport, make_source(cfg.sensor, "dev-1"), tmp_path / "state")
    thread = threading.Thread(target=daemon.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: warnings(caplog), what="the model-wait warning")
    finally:
        daemon.stop()
        thread.join(30)
        coordinator.close()
    assert not thread.is_alive()
    assert daemon.counters["models_received"] == 0
    message = warnings(caplog)[0]
    assert TOPIC in message and "'ceo'" in message and "no global model yet" in message


def test_negative_wait_is_a_config_error():
    with pytest.raises(ConfigError, match="model_wait_warn_s"):
        build(AgentConfig, {"model_wait_warn_s": -1.0}, "test")
