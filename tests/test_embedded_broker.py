"""The embedded amqtt broker: the fallback when mosquitto is absent, in-process or as ``python -m``."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from polling import wait_for

from streamfl.coordinator.broker import EmbeddedBroker
from streamfl.errors import StartupError
from streamfl.protocol.transport.base import MqttSettings
from streamfl.protocol.transport.paho import PahoTransport
from streamfl.sim.brokers import BrokerProcess, free_port, wait_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def transport(port, client_id):
    t = PahoTransport(MqttSettings(host="127.0.0.1", port=port, client_id=client_id, persistent_session=False,
                                   reconnect_min_s=0.1, reconnect_max_s=0.5))
    t.connect()
    assert t.wait_connected(10)
    return t


def round_trip(port, log_path=None):
    got, retained = [], []
    sub = transport(port, "sub")
    pub = transport(port, "pub")
    late = None
    try:
        sub.on_message = lambda topic, payload: got.append((topic, payload))
        sub.subscribe("streamfl/v1/lab/#")
        payload = os.urandom(2 * 2 ** 20)  # a model-sized frame
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:  # until the subscription is in place
            pub.publish("streamfl/v1/lab/probe", b"p")
            time.sleep(0.05)
        assert got
        assert pub.publish("streamfl/v1/lab/model", payload, qos=1, retain=True)
        assert wait_for(lambda: ("streamfl/v1/lab/model", payload) in got)
        # A subscriber that comes later gets the retained model (with the publisher still
        # connected, as the coordinator is). Seen once in CI: no retained message within 10 s,
        # cause not found; the broker's log now comes with the failure. QoS 1 is at-least-once:
        # amqtt under CI load once delivered the 2 MiB retained copy twice (a redelivery before
        # our PUBACK reached it), which the protocol allows and agents absorb by version, so a
        # repeat is accepted here; a wrong or missing payload is not.
        late = transport(port, "late")
        late.on_message = lambda topic, payload: retained.append(payload)
        late.subscribe("streamfl/v1/lab/model")
        assert wait_for(lambda: bool(retained) and all(p == payload for p in retained)), (
            [len(p) for p in retained],
            log_path.read_text(errors="replace")[-3000:] if log_path else "(in-process broker)")
    finally:
        for t in (sub, pub, late):
            if t is not None:
                t.close()


def test_paho_transport_round_trips_through_the_embedded_broker():
    port = free_port()
    with EmbeddedBroker("127.0.0.1", port) as broker:
        assert broker.running
        round_trip(port)
    assert not broker.running
    with pytest.raises(OSError):  # nothing listens any more
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_port_in_use_is_a_startup_error():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(StartupError, match="holds the port") as caught:
            EmbeddedBroker("127.0.0.1", busy.getsockname()[1], start_timeout_s=10).start()
        assert caught.value.exit_code == 2


def test_module_runs_in_the_foreground_until_sigterm(tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "streamfl.coordinator.broker", "--host", "127.0.0.1",
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert wait_port("127.0.0.1", port, 20)
        round_trip(port)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_broker_process_falls_back_to_amqtt(tmp_path):
    with BrokerProcess(tmp_path, kind="amqtt") as broker:
        round_trip(broker.port, tmp_path / "broker.log")
