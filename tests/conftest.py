"""Shared fixtures: a real MQTT broker process on a free port (mosquitto, or amqtt where absent)."""
import logging

import pytest

from streamfl.sim.brokers import BrokerProcess


@pytest.fixture
def mqtt_broker(tmp_path):
    """A running broker; ``.host``, ``.port``, ``.restart(down_s)``, ``.stop()``, ``.start()``."""
    broker = BrokerProcess(tmp_path / "broker").start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(autouse=True)
def _debug_logs(caplog):
    caplog.set_level(logging.INFO, logger="streamfl")
