"""PahoTransport against a real broker: what only it does (automatic reconnect with back-off, the
offline queue, PUBACK tracking, TLS and password settings, failure logging). The MQTT semantics it
shares with the memory transport are in test_transport_contract.py."""
import logging
import threading
import time

import pytest

from polling import wait_for

from streamfl.errors import ConfigError
from streamfl.protocol.transport.base import MqttSettings
from streamfl.protocol.transport.paho import PahoTransport, read_password

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


class Client:
    """A PahoTransport that records messages and callbacks; closed by the ``clients`` fixture."""

    def __init__(self, broker, client_id, persistent=True, **kw):
        settings = MqttSettings(host=broker.host, port=broker.port, client_id=client_id,
                                persistent_session=persistent, reconnect_min_s=0.1, reconnect_max_s=0.5,
                                keepalive_s=5)
        self.t = PahoTransport(settings, **kw)
        self.got, self.events = [], []
        self._lock = threading.Lock()
        self.t.on_message = self._message
        self.t.on_connect = lambda present: self.events.append(("connect", present))
        self.t.on_disconnect = lambda reason: self.events.append(("disconnect", reason))

    def _message(self, topic, payload):
        with self._lock:
            self.got.append((topic, payload))

    def start(self):
        self.t.connect()
        assert self.t.wait_connected(10), "no connection"
        return self

    def expect(self, n, timeout_s=10.0):
        assert wait_for(lambda: len(self.got) >= n, timeout_s), self.got
        return list(self.got)

    def ready(self, topic):
        """Round-trip a probe on ``topic`` so we know the broker has our subscription."""
        before = len(self.got)
        self.t.publish(topic, b"probe")
        self.expect(before + 1)
        with self._lock:
            self.got[:] = [m for m in self.got if m[1] != b"probe"]


@pytest.fixture
def clients(mqtt_broker):
    made = []

    def make(client_id, persistent=True, **kw):
        c = Client(mqtt_broker, client_id, persistent, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.t.close()


class SlowConnect(PahoTransport):
    """Widens the window between paho's "connected" and the transport's on_connect re-subscribe."""

    def _handle_connect(self, *args):
        time.sleep(0.3)
        super()._handle_connect(*args)


def test_subscribe_right_after_connect_gets_one_retained_copy(clients, mqtt_broker):
    pub = clients("pub").start()
    assert pub.t.publish("f/model", b"v1", qos=1, retain=True)
    late = SlowConnect(MqttSettings(host=mqtt_broker.host, port=mqtt_broker.port, client_id="late",
                                    persistent_session=False))
    got = []
    late.on_message = lambda topic, payload: got.append(payload)
    try:
        late.connect()
        assert late.wait_connected(10)
        late.subscribe("f/model")  # inside the window: must not subscribe twice
        assert wait_for(lambda: got)
        time.sleep(0.5)
        assert got == [b"v1"]
    finally:
        late.close()


def test_reconnect_and_resubscribe_after_broker_restart(clients, mqtt_broker):
    sub = clients("sub", persistent=False)  # clean session: only our re-subscribe restores the filter
    sub.t.subscribe("f/model")
    sub.start()
    pub = clients("pub", persistent=False)
    pub.t.subscribe("f/queued")  # its own publishes while down come back to it after the restart
    pub.start()
    sub.ready("f/model")
    pub.ready("f/queued")
    mqtt_broker.stop()
    assert wait_for(lambda: not sub.t.connected and not pub.t.connected)
    assert pub.t.publish("f/queued", b"while down", qos=1)  # paho keeps it and sends it later
    assert pub.t.publish("f/model", b"qos0 while down", qos=0) is False
    time.sleep(1.0)
    mqtt_broker.start()
    assert sub.t.wait_connected(15) and pub.t.wait_connected(15)
    # paho re-sends queued publishes after on_connect, where the transport re-subscribes
    assert pub.expect(1, timeout_s=15) == [("f/queued", b"while down")]
    assert wait_for(lambda: sub.events.count(("connect", False)) == 2)
    assert ("disconnect", "closed") not in sub.events and sub.events[1][0] == "disconnect"
    deadline = time.monotonic() + 10
    while not sub.got and time.monotonic() < deadline:  # until the re-subscription is in place
        pub.t.publish("f/model", b"after restart", qos=1)
        time.sleep(0.1)
    assert sub.got and set(sub.got) == {("f/model", b"after restart")}


def test_connect_while_broker_is_down_retries(clients, mqtt_broker):
    mqtt_broker.stop()
    c = clients("early", persistent=False)
    c.t.connect()  # must not raise or block
    time.sleep(0.5)
    assert not c.t.connected
    mqtt_broker.start()
    assert c.t.wait_connected(15)


def test_publish_refused_when_paho_queue_is_full(mqtt_broker, clients):
    c = clients("queue", persistent=False, max_queued_messages=2)
    mqtt_broker.stop()
    c.t.connect()
    assert c.t.publish("a", b"1", qos=1) and c.t.publish("a", b"2", qos=1)
    assert c.t.publish("a", b"3", qos=1) is False


def test_missing_tls_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError):
        PahoTransport(MqttSettings(client_id="x", tls_ca=tmp_path / "nope.pem"))


def test_read_password(tmp_path):
    path = tmp_path / "pw"
    path.write_text("s3cret\n")
    assert read_password(path) == "s3cret"
    assert read_password(None, environ={"STREAMFL_MQTT_PASSWORD": "fromenv"}) == "fromenv"
    assert read_password(None, environ={}) is None
    assert read_password(path, environ={"STREAMFL_MQTT_PASSWORD": "fromenv"}) == "s3cret"
    with pytest.raises(ConfigError) as info:
        read_password(tmp_path / "missing")
    assert "missing" in str(info.value)


def test_a_broker_that_stays_down_is_reported_once_with_the_reason(caplog):
    from streamfl.sim.brokers import free_port
    caplog.set_level(logging.DEBUG, logger="streamfl.protocol.transport.paho")
    settings = MqttSettings(host="127.0.0.1", port=free_port(), client_id="lonely",
                            reconnect_min_s=0.1, reconnect_max_s=0.2)
    t = PahoTransport(settings)
    try:
        t.connect()
        assert wait_for(lambda: sum("cannot connect" in r.getMessage() for r in caplog.records) >= 4,
                        timeout_s=10)
    finally:
        t.close()
    tries = [r for r in caplog.records if "cannot connect" in r.getMessage()]
    assert "ConnectionRefusedError" in tries[0].getMessage() and tries[0].levelname == "WARNING"
    assert {r.levelname for r in tries[1:]} == {"DEBUG"}          # retries do not flood the journal


def test_tracked_publish_reports_the_puback_and_refuses_while_offline(clients, mqtt_broker):
    c = clients("tracker").start()
    mqtt_broker.pause()                                   # no PUBACK while the broker is frozen
    try:
        acked = c.t.publish_tracked("f/device/tracker/update", b"x" * 100000, qos=1)
        assert acked is not None
        time.sleep(0.5)
        assert not acked()
    finally:
        mqtt_broker.resume()
    assert wait_for(acked, timeout_s=10)
    mqtt_broker.stop()
    assert wait_for(lambda: not c.t.connected, timeout_s=10)
    assert c.t.publish_tracked("f/device/tracker/update", b"y", qos=1) is None
    assert c.t.publish("f/device/tracker/update", b"y", qos=1)     # paho still queues it
