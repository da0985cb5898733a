"""Shared fixtures: a real MQTT broker process on a free port (mosquitto, or amqtt where absent)
and a factory of fleets of real coordinator and agent processes on it."""
import logging

import pytest

from fleet import FleetRun
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


@pytest.fixture(autouse=True)
def _no_leaked_log_handlers():
    """Take off the root handlers a test installed (a CLI run in-process calls ``setup_logging``),
    so later tests' captured stdout does not fill with its log lines; pytest's own are its own."""
    root = logging.getLogger()
    before, level = set(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in before and not type(handler).__module__.startswith("_pytest"):
            root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture
def fleet(tmp_path, mqtt_broker):
    """Factory for ``FleetRun``s on the test's broker; every process is stopped afterwards."""
    runs = []

    def make(**kwargs):
        run = FleetRun(tmp_path / ("fleet%d" % len(runs)), mqtt_broker.host, mqtt_broker.port,
                       **kwargs)
        runs.append(run)
        return run

    try:
        yield make
    finally:
        for run in runs:
            run.stop_all()


@pytest.fixture
def open_folder():
    """A fresh folder under /tmp that other users may enter: mosquitto started as root drops to
    the ``mosquitto`` user, which must reach its config there (pytest's own folders are 0700)."""
    import os
    import shutil
    import tempfile
    from pathlib import Path
    path = Path(tempfile.mkdtemp(prefix="sfl-open-", dir="/tmp"))
    os.chmod(str(path), 0o755)
    yield path
    shutil.rmtree(str(path), ignore_errors=True)
