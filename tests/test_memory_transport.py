"""The in-memory broker: what only it promises (synchronous FIFO delivery, re-entrant publishes, its
test controls and counters). The MQTT semantics it shares with paho are in test_transport_contract.py."""
import threading

import pytest

from streamfl.protocol.transport.memory import MemoryBroker, MemoryTransport, topic_matches


class Client:
    """A MemoryTransport that records what it receives and its connect/disconnect callbacks."""

    def __init__(self, broker, client_id, persistent=True):
        self.t = MemoryTransport(broker, client_id, persistent_session=persistent)
        self.got, self.events = [], []
        self.t.on_message = lambda topic, payload: self.got.append((topic, payload))
        self.t.on_connect = lambda present: self.events.append(("connect", present))
        self.t.on_disconnect = lambda reason: self.events.append(("disconnect", reason))


@pytest.fixture
def broker():
    return MemoryBroker(propagate_errors=True)


@pytest.mark.parametrize("flt, topic, match", [
    ("a/b", "a/b", True), ("a/b", "a/c", False), ("a/+", "a/b", True), ("a/+", "a/b/c", False),
    ("a/#", "a", True), ("a/#", "a/b/c", True), ("#", "a/b", True), ("+/+", "a/b", True),
    ("+", "a/b", False), ("a/+/c", "a/x/c", True), ("a/+/c", "a/x/d", False),
    ("#", "$SYS/x", False), ("+/x", "$SYS/x", False), ("$SYS/#", "$SYS/x", True), ("a/b", "a/b/", False),
])
def test_topic_matching(flt, topic, match):
    assert topic_matches(flt, topic) is match


def test_publish_offline_returns_false(broker):
    """Even at QoS 1: the memory transport keeps no offline queue of its own (paho does)."""
    c = Client(broker, "c")
    assert c.t.publish("a", b"x", qos=1) is False
    c.t.connect()
    assert c.t.publish("a", b"x") is True


def test_drop_sends_the_will_and_reports_the_loss(broker):
    watcher = Client(broker, "watcher")
    watcher.t.connect()
    watcher.t.subscribe("f/device/+/status")
    dev = Client(broker, "dev")
    dev.t.set_will("f/device/dev/status", b"offline", qos=1, retain=True)
    assert broker.drop("dev") is False                  # not connected: nothing to drop
    dev.t.connect()
    assert broker.drop("dev") is True
    assert watcher.got == [("f/device/dev/status", b"offline")]   # synchronously
    assert dev.events == [("connect", False), ("disconnect", "connection lost")]
    assert not dev.t.connected and broker.clients() == ["watcher"]
    assert broker.retained["f/device/dev/status"] == b"offline"
    assert broker.drop("dev") is False


def test_offline_queue_holds_qos1_only_and_is_counted(broker):
    sub = Client(broker, "sub", persistent=True)
    sub.t.subscribe("f/cmd")
    sub.t.connect()
    sub.t.close()
    pub = Client(broker, "pub")
    pub.t.connect()
    pub.t.publish("f/cmd", b"one", qos=1)
    pub.t.publish("f/cmd", b"qos0 is dropped", qos=0)
    pub.t.publish("f/cmd", b"two", qos=1)
    assert broker.pending("sub") == 2 and sub.got == []
    sub.t.connect()                                     # the same object can connect again
    assert sub.got == [("f/cmd", b"one"), ("f/cmd", b"two")] and broker.pending("sub") == 0
    assert sub.events[-1] == ("connect", True)


def test_reentrant_publish_is_queued_not_recursive(broker):
    a, b = Client(broker, "a"), Client(broker, "b")
    order = []

    def on_a(topic, payload):
        order.append(("a-start", payload))
        if payload == b"ping":
            a.t.publish("b/in", b"pong")  # from inside a callback
        order.append(("a-end", payload))

    a.t.on_message = on_a
    b.t.on_message = lambda topic, payload: order.append(("b", payload))
    a.t.connect()
    b.t.connect()
    a.t.subscribe("a/in")
    b.t.subscribe("b/in")
    b.t.publish("a/in", b"ping")
    assert order == [("a-start", b"ping"), ("a-end", b"ping"), ("b", b"pong")]


def test_fifo_order_across_subscribers(broker):
    log = []
    clients = [Client(broker, "c%d" % i) for i in range(3)]
    for i, c in enumerate(clients):
        c.t.on_message = (lambda i: lambda topic, payload: log.append((i, payload)))(i)
        c.t.connect()
        c.t.subscribe("t")
    clients[0].t.publish("t", b"1")
    clients[0].t.publish("t", b"2")
    assert log == [(0, b"1"), (1, b"1"), (2, b"1"), (0, b"2"), (1, b"2"), (2, b"2")]


def test_callback_errors_are_logged_unless_propagated(caplog):
    quiet = MemoryBroker()
    c = Client(quiet, "c")
    c.t.on_message = lambda topic, payload: 1 / 0
    c.t.connect()
    c.t.subscribe("t")
    assert c.t.publish("t", b"x")  # logged, not raised
    assert "callback failed" in caplog.text
    loud = MemoryBroker(propagate_errors=True)
    d = Client(loud, "d")
    d.t.on_message = lambda topic, payload: 1 / 0
    d.t.connect()
    d.t.subscribe("t")
    with pytest.raises(ZeroDivisionError):
        d.t.publish("t", b"x")
    d.t.on_message = lambda topic, payload: None
    assert d.t.publish("t", b"y")  # the broker is not stuck in a draining state


def test_session_takeover(broker):
    first, second = Client(broker, "dev"), Client(broker, "dev")
    first.t.connect()
    second.t.connect()
    assert not first.t.connected and second.t.connected
    assert broker.clients() == ["dev"]


def test_thread_safety_under_concurrent_publishers(broker):
    sub = Client(broker, "sub")
    sub.t.connect()
    sub.t.subscribe("t/#")
    pubs = [Client(broker, "p%d" % i) for i in range(4)]
    for p in pubs:
        p.t.connect()

    def run(p, i):
        for k in range(300):
            p.t.publish("t/%d" % i, b"%d" % k)

    threads = [threading.Thread(target=run, args=(p, i)) for i, p in enumerate(pubs)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(sub.got) == 1200
    for i in range(4):  # per-publisher order is kept
        assert [p for t, p in sub.got if t == "t/%d" % i] == [b"%d" % k for k in range(300)]
