"""PahoTransport against a real broker: round trip, retained, last will, persistent session, reconnect."""
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from streamfl.errors import ConfigError
from streamfl.protocol.transport.base import MqttSettings
from streamfl.protocol.transport.paho import PahoTransport, read_password

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def wait_for(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


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


def test_publish_subscribe_round_trip(clients):
    sub = clients("sub", persistent=False)
    sub.t.subscribe("f/device/+/update")
    sub.start()
    pub = clients("pub").start()
    sub.ready("f/device/probe/update")
    payload = os.urandom(300000)
    assert pub.t.publish("f/device/d1/update", payload, qos=1)
    assert pub.t.publish("f/device/d1/other", b"not for sub", qos=1)
    assert sub.expect(1) == [("f/device/d1/update", payload)]
    assert sub.events[0] == ("connect", False)


def test_retained_message_reaches_a_late_subscriber(clients):
    pub = clients("pub").start()
    assert pub.t.publish("f/model", b"v7", qos=1, retain=True)
    late = clients("late", persistent=False)
    late.t.subscribe("f/model")
    late.start()
    assert late.expect(1) == [("f/model", b"v7")]


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


CHILD = r"""
import sys, time
from streamfl.protocol.transport.base import MqttSettings
from streamfl.protocol.transport.paho import PahoTransport
t = PahoTransport(MqttSettings(host=sys.argv[1], port=int(sys.argv[2]), client_id="victim", keepalive_s=60))
t.set_will("f/device/victim/status", b"offline", qos=1, retain=True)
t.connect()
assert t.wait_connected(10)
print("ready", flush=True)
time.sleep(60)
"""


def test_last_will_is_delivered_when_a_client_is_killed(clients, mqtt_broker):
    watcher = clients("watcher", persistent=False)
    watcher.t.subscribe("f/device/+/status")
    watcher.start()
    watcher.ready("f/device/probe/status")
    child = subprocess.Popen([sys.executable, "-c", CHILD, mqtt_broker.host, str(mqtt_broker.port)],
                             stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"ready"
        time.sleep(0.2)
        assert watcher.got == []
        child.send_signal(signal.SIGKILL)  # no DISCONNECT: the OS just closes the socket
        child.wait(10)
    finally:
        child.kill()
        child.wait()
    assert watcher.expect(1, timeout_s=10) == [("f/device/victim/status", b"offline")]


def test_no_will_on_clean_close(clients):
    watcher = clients("watcher", persistent=False)
    watcher.t.subscribe("f/status")
    watcher.start()
    watcher.ready("f/status")
    dev = clients("dev")
    dev.t.set_will("f/status", b"offline", qos=1, retain=False)
    dev.start()
    dev.t.close()
    assert ("disconnect", "closed") in dev.events
    time.sleep(0.5)
    assert watcher.got == []


def test_persistent_session_gets_messages_sent_while_away(clients, mqtt_broker):
    if mqtt_broker.kind == "amqtt":
        pytest.skip("amqtt treats sessions of anonymous clients as clean (no offline queue)")
    sub = clients("agent-7", persistent=True)
    sub.t.subscribe("f/device/agent-7/command", qos=1)
    sub.start()
    sub.ready("f/device/agent-7/command")
    sub.t.close()
    pub = clients("coordinator").start()
    for i in range(3):
        assert pub.t.publish("f/device/agent-7/command", b"cmd%d" % i, qos=1)
    pub.t.close()  # DISCONNECT goes after the publishes: the broker has them all
    again = clients("agent-7", persistent=True)  # e.g. the daemon restarted
    again.start()
    assert again.expect(3) == [("f/device/agent-7/command", b"cmd%d" % i) for i in range(3)]
    assert again.events[0] == ("connect", True)


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


def test_callback_exception_does_not_kill_the_network_thread(clients):
    sub = clients("sub", persistent=False)
    calls = []

    def boom(topic, payload):
        calls.append(payload)
        raise RuntimeError("bug in a core")

    sub.t.subscribe("t")
    sub.start()
    sub.t.on_message = boom
    pub = clients("pub").start()
    pub.t.publish("t", b"1")
    assert wait_for(lambda: len(calls) == 1)
    pub.t.publish("t", b"2")
    assert wait_for(lambda: len(calls) == 2) and sub.t.connected


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
