"""The Transport contract suite (as test_dvfs_contract.py: one suite per interface, every
implementation): what ``protocol/transport/base.py`` promises, held against the in-memory transport
and against paho on a real broker (the ``mqtt_broker`` fixture).

Each implementation is driven through a harness that hides only what the interface leaves open:
how a connection is lost uncleanly (the memory broker's ``drop``; for paho a loopback proxy that
is cut like a pulled cable), whether the transport reconnects by itself (paho does, the memory
transport is connected again by its owner) and how long delivery takes (synchronous in memory,
a network round trip with paho). Negative checks ("nothing else arrived") publish a sentinel
after the messages that must not arrive and wait for it: a broker keeps one publisher's order.

Behaviour that only one implementation has (the memory broker's FIFO re-entrancy and counters,
paho's offline queue, back-off and PUBACK tracking) stays in test_memory_transport.py and
test_paho_transport.py.
"""
import os
import threading
import time

import pytest

from polling import wait_for

from netproxy import CuttableProxy
from streamfl.errors import TransportError
from streamfl.protocol.transport.base import MqttSettings, Transport
from streamfl.protocol.transport.memory import MemoryBroker, MemoryTransport
from streamfl.protocol.transport.paho import PahoTransport

pytestmark = pytest.mark.timeout(60)

#: Every Transport implementation; a new one is a harness class below and one entry here.
IMPLEMENTATIONS = [
    pytest.param("memory", id="memory"),
    pytest.param("paho", id="paho", marks=pytest.mark.integration),
]

SENTINEL = b"--sentinel--"
PROBE = b"--probe-"  # each ready() probes with its own payload: an old probe must not pass for new


class Peer:
    """One transport under test and what its callbacks saw, in order (thread-safe)."""

    def __init__(self, transport: Transport, client_id: str):
        self.t = transport
        self.client_id = client_id
        self._lock = threading.Lock()
        self._got = []
        self._events = []
        transport.on_message = self._message
        transport.on_connect = lambda present: self._event(("connect", present))
        transport.on_disconnect = lambda reason: self._event(("disconnect", reason))

    def _message(self, topic, payload):
        with self._lock:
            self._got.append((topic, payload))

    def _event(self, event):
        with self._lock:
            self._events.append(event)

    @property
    def got(self):
        """Messages received, sentinels and probes left out."""
        with self._lock:
            return [m for m in self._got if m[1] != SENTINEL and not m[1].startswith(PROBE)]

    @property
    def events(self):
        with self._lock:
            return list(self._events)

    def received(self, topic, payload):
        with self._lock:
            return (topic, payload) in self._got

    def connects(self):
        return sum(1 for e in self.events if e[0] == "connect")


class Harness:
    """Builds transports of one implementation on one broker; closes them all afterwards."""

    kind = ""
    #: Seconds to let a broker act on something that must NOT produce a message (a will after a
    #: clean close), where no sentinel can follow it.
    quiet_s = 0.0

    def __init__(self):
        self.peers = []
        self._probes = 0

    def client(self, client_id, persistent=True) -> Peer:
        peer = Peer(self._transport(client_id, persistent), client_id)
        self.peers.append(peer)
        return peer

    def start(self, peer) -> Peer:
        peer.t.connect()
        assert peer.t.wait_connected(10), "%s: %s did not connect" % (self.kind, peer.client_id)
        return peer

    def ready(self, sub, topic, pub):
        """Return once ``sub``'s subscription covering ``topic`` is in place at the broker.

        The probe payload is new on every call: a probe that arrived before a drop says nothing
        about the subscription restored after it."""
        self._probes += 1
        payload = PROBE + str(self._probes).encode()

        def probe():
            pub.t.publish(topic, payload, qos=1)
            return wait_for(lambda: sub.received(topic, payload), 0.2)
        assert wait_for(probe, 10), "%s: subscription to %s never took effect" % (self.kind, topic)

    def flush(self, sub, pub, topic):
        """Publish a sentinel on ``topic`` from ``pub`` and wait until ``sub`` has it: everything
        ``pub`` published before has been delivered (or never will be)."""
        assert pub.t.publish(topic, SENTINEL, qos=1)
        assert wait_for(lambda: sub.received(topic, SENTINEL)), "%s: sentinel lost" % self.kind

    def close(self):
        for peer in self.peers:
            peer.t.close()

    # -- what differs per implementation ---------------------------------------------------------

    def _transport(self, client_id, persistent) -> Transport:
        raise NotImplementedError

    def drop(self, peer):
        """Lose ``peer``'s connection without a DISCONNECT (the broker sends its will)."""
        raise NotImplementedError

    def resume(self, peer):
        """Let a dropped ``peer`` connect again and wait until it has."""
        raise NotImplementedError


class MemoryHarness(Harness):
    kind = "memory"

    def __init__(self):
        super().__init__()
        self.broker = MemoryBroker()  # callback errors are logged, as with paho

    def _transport(self, client_id, persistent):
        return MemoryTransport(self.broker, client_id, persistent_session=persistent)

    def drop(self, peer):
        assert self.broker.drop(peer.client_id)

    def resume(self, peer):
        self.start(peer)  # no automatic reconnect: the owner connects again


class PahoHarness(Harness):
    kind = "paho"
    quiet_s = 0.3

    def __init__(self, broker):
        super().__init__()
        self.broker = broker
        self.proxies = {}

    def _transport(self, client_id, persistent):
        proxy = CuttableProxy(self.broker.host, self.broker.port)  # one per client: cut alone
        settings = MqttSettings(host="127.0.0.1", port=proxy.port, client_id=client_id,
                                persistent_session=persistent, keepalive_s=5,
                                reconnect_min_s=0.1, reconnect_max_s=0.3)
        transport = PahoTransport(settings)
        self.proxies[id(transport)] = proxy
        return transport

    def drop(self, peer):
        self.proxies[id(peer.t)].cut()
        assert wait_for(lambda: not peer.t.connected), "paho: %s still connected" % peer.client_id

    def resume(self, peer):
        before = peer.connects()
        self.proxies[id(peer.t)].restore()
        assert wait_for(lambda: peer.connects() > before), "paho: %s did not reconnect" % (
            peer.client_id)

    def close(self):
        super().close()
        for proxy in self.proxies.values():
            proxy.close()


@pytest.fixture(params=IMPLEMENTATIONS)
def net(request):
    if request.param == "memory":
        harness = MemoryHarness()
    else:
        harness = PahoHarness(request.getfixturevalue("mqtt_broker"))
    try:
        yield harness
    finally:
        harness.close()


def needs_persistent_sessions(net):
    broker = getattr(net, "broker", None)
    if getattr(broker, "kind", None) == "amqtt":
        pytest.skip("amqtt treats sessions of anonymous clients as clean (no offline queue)")


# --- connecting ----------------------------------------------------------------------------------

def test_connect_reports_once_through_on_connect(net):
    c = net.client("dev")
    assert not c.t.connected
    assert c.t.wait_connected(0.05) is False            # returns False once the time is up
    net.start(c)
    assert wait_for(lambda: c.events)
    assert c.events == [("connect", False)]              # a new client id has no session yet
    c.t.connect()                                        # already connected: nothing happens
    time.sleep(net.quiet_s)
    assert c.events == [("connect", False)] and c.t.connected


# --- publish and subscribe -----------------------------------------------------------------------

def test_messages_reach_matching_subscribers_byte_for_byte(net):
    sub, pub = net.start(net.client("sub")), net.start(net.client("pub"))
    sub.t.subscribe("f/device/+/update", qos=1)
    net.ready(sub, "f/device/probe/update", pub)
    big = os.urandom(300000)
    assert pub.t.publish("f/device/d1/update", big, qos=1) is True
    assert pub.t.publish("f/device/d1/status", b"not for sub", qos=1) is True
    assert pub.t.publish("f/device/d2/update", b"", qos=0) is True          # empty payload, QoS 0
    assert pub.t.publish("f/device/d3/update", bytearray(b"\x00\xff"), qos=1) is True
    net.flush(sub, pub, "f/device/end/update")
    assert sorted(sub.got) == [("f/device/d1/update", big), ("f/device/d2/update", b""),
                               ("f/device/d3/update", b"\x00\xff")]   # QoS 0 may overtake QoS 1
    assert all(type(payload) is bytes for _, payload in sub.got)


#: (filter, topics it matches among WILDCARD_TOPICS), written out by hand from MQTT 3.1.1 s4.7.
WILDCARD_CASES = [
    ("w/a/b", ["w/a/b"]),
    ("w/a/+", ["w/a/b", "w/a/c", "w/a/"]),
    ("w/+/b", ["w/a/b", "w/x/b"]),
    ("w/+", ["w/a"]),
    ("w/a/#", ["w/a", "w/a/b", "w/a/c", "w/a/b/c", "w/a/"]),   # '#' includes the parent level
    ("w/#", ["w/a", "w/a/b", "w/a/c", "w/x/b", "w/a/b/c", "w/a/"]),
    ("w/+/+/c", ["w/a/b/c"]),
]
WILDCARD_TOPICS = ["w/a", "w/a/b", "w/a/c", "w/x/b", "w/a/b/c", "w/a/"]


def test_wildcard_filters_follow_the_mqtt_rules(net):
    pub = net.start(net.client("pub"))
    subs = []
    for i, (flt, _) in enumerate(WILDCARD_CASES):
        sub = net.start(net.client("sub%d" % i))
        sub.t.subscribe(flt)
        sub.t.subscribe("end")
        net.ready(sub, "end", pub)
        subs.append(sub)
    for topic in WILDCARD_TOPICS:
        assert pub.t.publish(topic, topic.encode(), qos=1)
    for sub in subs:
        net.flush(sub, pub, "end")
    for sub, (flt, matches) in zip(subs, WILDCARD_CASES):
        assert sorted(t for t, _ in sub.got) == sorted(matches), flt
        assert all(p == t.encode() for t, p in sub.got)


@pytest.mark.parametrize("topic", ["a/+", "a/#", "#", "+", ""])
def test_publishing_to_a_wildcard_or_empty_topic_is_refused(net, topic):
    c = net.client("c")
    with pytest.raises(TransportError):                 # not connected yet
        c.t.publish(topic, b"x", qos=1)
    net.start(c)
    with pytest.raises(TransportError):
        c.t.publish(topic, b"x", qos=1)
    assert c.t.connected


BAD_FILTERS = ["a/b+", "a/#/b", "a#", "a/+b/c", ""]


def test_an_invalid_filter_is_refused_while_connected(net):
    c = net.start(net.client("c"))
    for flt in BAD_FILTERS:
        with pytest.raises(TransportError):
            c.t.subscribe(flt)
    assert c.t.connected


def test_an_invalid_filter_is_refused_before_connecting_too(net):
    c = net.client("c")
    for flt in BAD_FILTERS:
        with pytest.raises(TransportError):
            c.t.subscribe(flt)
    c.t.subscribe("ok")
    pub = net.start(net.client("pub"))
    net.start(c)
    net.ready(c, "ok", pub)                              # the valid filter still works


def test_subscribing_before_connect_takes_effect_on_connect(net):
    sub = net.client("sub", persistent=False)
    sub.t.subscribe("f/model")
    pub = net.start(net.client("pub"))
    net.start(sub)
    net.ready(sub, "f/model", pub)
    assert pub.t.publish("f/model", b"v1", qos=1)
    assert wait_for(lambda: sub.got == [("f/model", b"v1")]), sub.got


def test_subscriptions_come_back_after_an_unclean_drop(net):
    sub = net.client("sub", persistent=False)            # clean session: the broker forgets the
    sub.t.subscribe("f/x")                               # filter; only the transport restores it
    net.start(sub)
    pub = net.start(net.client("pub"))
    net.ready(sub, "f/x", pub)
    assert pub.t.publish("f/x", b"1", qos=1)
    assert wait_for(lambda: sub.got == [("f/x", b"1")])
    net.drop(sub)
    assert wait_for(lambda: sub.events[-1][0] == "disconnect"), sub.events
    assert pub.t.publish("f/x", b"missed", qos=1)        # nobody is subscribed now
    net.resume(sub)
    net.ready(sub, "f/x", pub)
    assert pub.t.publish("f/x", b"2", qos=1)
    net.flush(sub, pub, "f/x")
    assert sub.got == [("f/x", b"1"), ("f/x", b"2")]
    # One reconnect (paho also reports each failed attempt during the outage as a disconnect).
    kinds = [e[0] for e in sub.events]
    assert kinds[:2] == ["connect", "disconnect"] and kinds[-1] == "connect"
    assert kinds.count("connect") == 2


def test_a_failing_message_handler_does_not_stop_delivery(net):
    sub, pub = net.start(net.client("sub")), net.start(net.client("pub"))
    calls = []

    def boom(topic, payload):
        calls.append(payload)
        raise RuntimeError("bug in a core")

    sub.t.subscribe("t")
    net.ready(sub, "t", pub)
    sub.t.on_message = boom
    assert pub.t.publish("t", b"1", qos=1)
    assert wait_for(lambda: calls == [b"1"])
    assert pub.t.publish("t", b"2", qos=1)
    assert wait_for(lambda: calls == [b"1", b"2"]) and sub.t.connected


# --- QoS 1 and sessions --------------------------------------------------------------------------

def test_qos1_messages_wait_for_a_persistent_session(net):
    needs_persistent_sessions(net)
    sub = net.start(net.client("agent-7", persistent=True))
    sub.t.subscribe("f/device/agent-7/command", qos=1)
    pub = net.start(net.client("coordinator"))
    net.ready(sub, "f/device/agent-7/command", pub)
    sub.t.close()
    for i in range(3):
        assert pub.t.publish("f/device/agent-7/command", b"cmd%d" % i, qos=1)
    again = net.start(net.client("agent-7", persistent=True))   # e.g. the daemon restarted
    assert wait_for(lambda: len(again.got) >= 3), again.got
    assert again.got == [("f/device/agent-7/command", b"cmd%d" % i) for i in range(3)]
    assert again.events[0] == ("connect", True)          # the broker kept the session


def test_a_clean_session_forgets_subscriptions_and_messages(net):
    sub = net.start(net.client("sub", persistent=False))
    sub.t.subscribe("f/cmd", qos=1)
    pub = net.start(net.client("pub"))
    net.ready(sub, "f/cmd", pub)
    sub.t.close()
    assert pub.t.publish("f/cmd", b"lost", qos=1)
    fresh = net.start(net.client("sub", persistent=False))      # subscribes to nothing itself
    fresh.t.subscribe("end")
    net.ready(fresh, "end", pub)
    assert pub.t.publish("f/cmd", b"not subscribed", qos=1)
    net.flush(fresh, pub, "end")
    assert fresh.got == [] and fresh.events[0] == ("connect", False)


# --- retained messages ---------------------------------------------------------------------------

def test_the_last_retained_message_reaches_a_late_subscriber(net):
    pub = net.start(net.client("pub"))
    assert pub.t.publish("f/model", b"v1", qos=1, retain=True)
    assert pub.t.publish("f/model", b"v2", qos=1, retain=True)
    assert pub.t.publish("f/other", b"not retained", qos=1)
    late = net.start(net.client("late", persistent=False))
    late.t.subscribe("f/#")
    assert wait_for(lambda: late.got)
    net.ready(late, "f/probe", pub)                      # anything retained has arrived by now
    assert late.got == [("f/model", b"v2")]
    assert pub.t.publish("f/model", b"", qos=1, retain=True)    # clears it (delivered as usual)
    assert wait_for(lambda: late.got[-1:] == [("f/model", b"")]), late.got
    later = net.start(net.client("later", persistent=False))
    later.t.subscribe("f/#")
    net.ready(later, "f/probe", pub)
    assert later.got == []


def settle(peer, topic, mark):
    """Return once the broker has handled what ``peer`` sent before (its packets keep their order):
    ``peer`` publishes ``mark`` to ``topic``, which it is subscribed to, and waits for it."""
    assert peer.t.publish(topic, mark, qos=1)
    assert wait_for(lambda: peer.received(topic, mark)), "%s: own mark lost" % peer.client_id


def test_each_subscribe_sends_the_retained_message_again_and_unsubscribe_stops_delivery(net):
    pub = net.start(net.client("pub"))
    assert pub.t.publish("f/model", b"v1", qos=1, retain=True)
    sub = net.start(net.client("sub", persistent=False))
    sub.t.subscribe("f/end")
    net.ready(sub, "f/end", pub)
    sub.t.subscribe("f/model", qos=0)
    assert wait_for(lambda: sub.got == [("f/model", b"v1")]), sub.got
    sub.t.unsubscribe("f/model")
    settle(sub, "f/end", b"m1")
    assert pub.t.publish("f/model", b"v2", qos=1, retain=True)
    net.flush(sub, pub, "f/end")                         # after the UNSUBSCRIBE, in one order
    assert [m for m in sub.got if m[0] == "f/model"] == [("f/model", b"v1")]
    sub.t.subscribe("f/model", qos=0)                    # a fetch: the newest, once
    assert wait_for(lambda: sub.received("f/model", b"v2")), sub.got
    sub.t.unsubscribe("f/model")
    sub.t.unsubscribe("f/never-subscribed")              # harmless
    settle(sub, "f/end", b"m2")
    assert pub.t.publish("f/model", b"v3", qos=1, retain=True)
    net.flush(sub, pub, "f/end")
    assert [m for m in sub.got if m[0] == "f/model"] == [("f/model", b"v1"), ("f/model", b"v2")]


def away_subscriber(net, client_id, model_qos):
    """A persistent session subscribed to ``f/end`` (QoS 1) and ``f/model`` (``model_qos``), and a
    publisher; the subscriber's link is then cut (its session at the broker keeps both filters)."""
    needs_persistent_sessions(net)
    sub = net.start(net.client(client_id, persistent=True))
    sub.t.subscribe("f/end", qos=1)
    sub.t.subscribe("f/model", qos=model_qos)
    pub = net.start(net.client("coordinator"))
    net.ready(sub, "f/model", pub)
    net.drop(sub)
    return sub, pub


def test_an_unsubscribe_while_offline_reaches_a_persistent_session_at_the_next_connect(net):
    sub, pub = away_subscriber(net, "agent-3", model_qos=1)
    sub.t.unsubscribe("f/model")
    for i in range(3):
        assert pub.t.publish("f/model", b"v%d" % i, qos=1)
    net.resume(sub)
    settle(sub, "f/end", b"m1")                          # its UNSUBSCRIBE went first
    assert pub.t.publish("f/model", b"after", qos=1)
    net.flush(sub, pub, "f/end")
    # What was queued while away may arrive (the session held the filter then); nothing after.
    assert ("f/model", b"after") not in sub.got, sub.got


def test_a_qos0_subscription_queues_nothing_for_an_away_persistent_session(net):
    sub, pub = away_subscriber(net, "agent-4", model_qos=0)
    for i in range(5):
        assert pub.t.publish("f/model", b"v%d" % i, qos=1, retain=True)
    net.resume(sub)                                      # re-subscribes: the retained one only
    net.flush(sub, pub, "f/end")
    models = [p for t, p in sub.got if t == "f/model"]
    assert models == [b"v4"], models


# --- last will and closing -----------------------------------------------------------------------

def test_the_will_is_sent_on_an_unclean_drop_and_not_on_a_clean_close(net):
    watcher = net.start(net.client("watcher", persistent=False))
    watcher.t.subscribe("f/device/+/status")
    helper = net.start(net.client("helper"))
    net.ready(watcher, "f/device/probe/status", helper)
    dev = net.client("dev")
    dev.t.set_will("f/device/dev/status", b"offline", qos=1, retain=True)
    net.start(dev)
    dev.t.close()
    time.sleep(net.quiet_s)
    net.flush(watcher, helper, "f/device/helper/status")
    assert watcher.got == []                             # a clean close sends no will
    again = net.client("dev")                            # the daemon again, a new process
    again.t.set_will("f/device/dev/status", b"offline", qos=1, retain=True)
    net.start(again)
    net.drop(again)
    assert wait_for(lambda: watcher.got), "no will after an unclean drop"
    assert watcher.got == [("f/device/dev/status", b"offline")]
    late = net.start(net.client("late", persistent=False))
    late.t.subscribe("f/device/dev/status")              # the will was retained
    assert wait_for(lambda: late.got == [("f/device/dev/status", b"offline")]), late.got


def test_close_disconnects_once_and_stops_delivery(net):
    sub, pub = net.start(net.client("sub", persistent=False)), net.start(net.client("pub"))
    sub.t.subscribe("t")
    net.ready(sub, "t", pub)
    sub.t.close()
    assert not sub.t.connected
    assert wait_for(lambda: sub.events[-1][0] == "disconnect"), sub.events
    assert pub.t.publish("t", b"after close", qos=1)
    time.sleep(net.quiet_s)
    sub.t.close()                                        # idempotent
    time.sleep(net.quiet_s)
    assert sub.got == []
    assert [e[0] for e in sub.events] == ["connect", "disconnect"]


# --- publishing while disconnected ---------------------------------------------------------------

def test_publishing_before_connect_refuses_qos0_and_keeps_any_accepted_qos1(net):
    """base.py: ``publish`` is False when the message could not be handed over (e.g. offline).
    QoS 0 offline has nowhere to go; a QoS 1 message may be refused (memory) or kept and sent on
    connect (paho), and True must mean the latter."""
    sub, pub = net.start(net.client("sub")), net.start(net.client("pub"))
    sub.t.subscribe("f/#")
    net.ready(sub, "f/probe", pub)
    early = net.client("early")
    assert early.t.publish("f/q0", b"qos0", qos=0) is False
    assert early.t.publish_tracked("f/q0", b"qos0", qos=0) is None
    accepted = early.t.publish("f/q1", b"qos1", qos=1)
    assert isinstance(accepted, bool)
    net.start(early)
    if accepted:
        assert wait_for(lambda: sub.received("f/q1", b"qos1")), "accepted QoS 1 message lost"
    net.flush(sub, early, "f/end")
    assert sub.got == ([("f/q1", b"qos1")] if accepted else [])


def test_a_tracked_publish_is_acknowledged_while_connected(net):
    sub, pub = net.start(net.client("sub")), net.start(net.client("pub"))
    sub.t.subscribe("f/u")
    net.ready(sub, "f/u", pub)
    acked = pub.t.publish_tracked("f/u", b"update", qos=1)
    assert acked is not None
    assert wait_for(acked), "never acknowledged"
    assert wait_for(lambda: sub.got == [("f/u", b"update")])


def test_publishing_after_close_is_refused(net):
    c = net.start(net.client("c"))
    c.t.close()
    assert c.t.publish("t", b"x", qos=0) is False
    assert c.t.publish_tracked("t", b"x", qos=1) is None
    assert c.t.publish("t", b"x", qos=1) is False
