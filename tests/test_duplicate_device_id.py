"""Cloned boards (one device id, two processes) and a silent coordinator, sans-I/O: the agent's
take-over watch and back-off, its coordinator-silence warning, the registry's and the core's
count of a second process under one id, and where the agent's id came from."""
import logging
import socket
import time

import pytest

from streamfl.agent.config import AgentConfig, derived_device_id_warning, device_id_origin
from streamfl.agent.coordinator_watch import CoordinatorWatch
from streamfl.agent.takeover import TakeoverWatch
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.core import CoordinatorCore
from streamfl.coordinator.registry import DeviceRegistry
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import Hello, Offline

from factories import SPEC


def hello(device="pi-01", instance="", online=True):
    return Hello(device_id=device, board="rpi5", software_version="0.1.0", arch_id="x",
                 buffer_capacity=100, online=online, instance=instance)


# ---- agent: the broker's take-over cycle ---------------------------------------------------------

def _cycle(watch, t, lasted_s, gap_s):
    """One connection that lasted ``lasted_s``, dropped, and ``gap_s`` before the next; returns
    (the time after it, the delay the watch asked for)."""
    watch.connected(t)
    delay = watch.dropped(t + lasted_s)
    return t + lasted_s + max(gap_s, delay), delay


def test_takeover_cycle_is_reported_counted_and_backed_off(caplog):
    watch = TakeoverWatch("pi-01", short_s=10.0, connections=3, window_s=60.0, backoff_max_s=300.0)
    t, delays = 0.0, []
    with caplog.at_level(logging.INFO, logger="streamfl.agent.takeover"):
        for _ in range(12):  # a clone takes the connection 1 s after every connect
            t, delay = _cycle(watch, t, 1.0, 1.0)
            delays.append(delay)
    assert delays[:2] == [0.0, 0.0]              # one or two drops are a hiccup
    assert delays[2] == 2.0 and watch.suspected and watch.detections == 1
    assert delays[2:] == [2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 300.0, 300.0]
    assert watch.takeovers == 12
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2                      # the first, then once the 10 minutes passed
    text = errors[0].getMessage()
    assert "another board is probably using device id pi-01" in text
    assert "use_username_as_clientid" in text and "device_id" in text
    assert "next reconnect in 2 s" in text
    assert watch.status() == {"duplicate_id_takeovers": 12, "duplicate_id_suspected": True,
                              "duplicate_id_backoff_s": 300.0}


def test_a_connection_that_holds_ends_the_back_off(caplog):
    watch = TakeoverWatch("pi-01", connections=3, backoff_max_s=30.0)
    t = 0.0
    for _ in range(4):
        t, _ = _cycle(watch, t, 0.5, 1.0)
    assert watch.suspected and watch.delay_s == 4.0
    watch.connected(t)
    assert not watch.check(t + 59.0)              # the clone could still come back at the cap
    with caplog.at_level(logging.INFO, logger="streamfl.agent.takeover"):
        assert watch.check(t + 60.0)
    assert not watch.suspected and watch.delay_s == 0.0
    assert "normal reconnects resume" in caplog.text
    # Counting starts afresh: one short drop later is a hiccup again.
    assert watch.dropped(t + 61.0) == 0.0 and watch.takeovers == 4


@pytest.mark.parametrize("lasted_s,gap_s", [
    (45.0, 1.0),      # a link that times out after the keep-alive, then comes back
    (120.0, 0.5),     # a broker restarted every two minutes
    (1.0, 30.0),      # short connections, but too far apart to be a take-over cycle
])
def test_drops_that_are_no_takeover_cycle_never_back_off(lasted_s, gap_s, caplog):
    watch = TakeoverWatch("pi-01", short_s=10.0, connections=3, window_s=60.0)
    t = 0.0
    with caplog.at_level(logging.ERROR):
        for _ in range(10):
            t, delay = _cycle(watch, t, lasted_s, gap_s)
            assert delay == 0.0
    assert watch.takeovers == 0 and not watch.suspected and not caplog.records


def test_attempts_the_broker_refused_are_not_takeovers():
    watch = TakeoverWatch("pi-01", connections=2)
    for t in range(10):  # connection refused: on_disconnect without an accepted connection
        assert watch.dropped(float(t)) == 0.0
    assert watch.takeovers == 0


# ---- agent: the coordinator is silent ------------------------------------------------------------

def test_coordinator_silence_is_warned_once_then_its_return_logged_once(caplog):
    watch = CoordinatorWatch(120.0, "plant", now=0.0, round_interval_s=5.0)
    with caplog.at_level(logging.INFO, logger="streamfl.agent.coordinator_watch"):
        watch.heard(10.0, "global model v7")
        watch.status(True, "c1", "run-a", 11.0)       # its status turning online: heard
        watch.status(False, "c1", "run-a", 20.0)      # the coordinator's will
        assert not watch.check(130.0, "keeps training from v7 of run run-a")
        assert watch.check(131.0, "keeps training from v7 of run run-a; its updates wait in the "
                                  "broker for the coordinator")
        for t in (131.0, 500.0, 5000.0):
            assert not watch.check(t, "x")              # once
        watch.status(False, "c1", "run-a", 5001.0)      # a replay of the same: nothing heard
        assert watch.silent
        assert watch.status(True, "c2", "run-a", 5002.0)  # a coordinator came back
        assert not watch.heard(5003.0, "global model v8")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(warnings) == 1 and watch.warnings == 1
    assert "nothing heard from the coordinator of fleet 'plant' for 120 s" in warnings[0]
    assert "last: its status says online, run run-a" in warnings[0]
    assert "retained status says offline (for 111 s)" in warnings[0]
    assert "keeps training from v7 of run run-a" in warnings[0]
    assert len(infos) == 1 and "heard again" in infos[0] and "4991 s" in infos[0]


def test_coordinator_silence_counts_from_the_last_word_and_is_off_at_zero():
    watch = CoordinatorWatch(60.0, "f", now=0.0, round_interval_s=1.0)
    for t in range(0, 300, 30):        # a new model every 30 s: never silent for 60 s
        watch.heard(float(t), "global model")
        assert not watch.check(float(t) + 29.0, "x")
    assert watch.warnings == 0
    off = CoordinatorWatch(0.0, "f", now=0.0)
    assert not off.check(1e6, "x")
    # A round interval longer than the setting: a model per round is all the board can hear.
    slow = CoordinatorWatch(60.0, "f", now=0.0, round_interval_s=100.0)
    assert slow.warn_after_s == 300.0 and not slow.check(299.0, "x") and slow.check(300.0, "x")


# ---- agent: where the device id came from --------------------------------------------------------

def test_a_derived_device_id_says_so_and_a_configured_one_does_not():
    derived = AgentConfig()
    text = derived_device_id_warning(derived)
    assert text is not None and socket.gethostname() in text and "flashed from one image" in text
    assert "derived from the hostname" in device_id_origin(derived)
    configured = AgentConfig(device_id="pi-01")
    assert derived_device_id_warning(configured) is None
    assert device_id_origin(configured).startswith("configured")


# ---- coordinator: a second process under one id --------------------------------------------------

def test_registry_counts_hellos_that_alternate_between_two_instances():
    reg = DeviceRegistry()
    assert not reg.on_hello(hello(instance="a"), 0.0)
    assert not reg.on_hello(hello(instance="a"), 1.0)    # the same process reconnecting
    assert not reg.on_hello(hello(instance="b"), 2.0)    # a restart, or the clone's first hello
    reg.on_offline(Offline("pi-01", "lost"), 2.5)         # the will between them changes nothing
    assert reg.on_hello(hello(instance="a"), 3.0)        # back to the first: two processes
    assert reg.on_hello(hello(instance="b"), 4.0)
    info = reg.get("pi-01")
    assert info.duplicate_id == 2 and info.duplicate_id_last_s == 4.0
    assert info.duplicate_id_instances == 2
    assert reg.duplicate_ids() == {"pi-01": 2}


@pytest.mark.parametrize("instances", [
    ["a", "b", "c", "d"],        # restarted three times (clean, crash, upgrade)
    ["", "", ""],                # an older agent that says no instance
    ["a", "a", "a"],             # one process, many reconnects
])
def test_restarts_and_older_agents_are_no_duplicate(instances):
    reg = DeviceRegistry()
    for t, instance in enumerate(instances):
        assert not reg.on_hello(hello(instance=instance), float(t))
    assert reg.get("pi-01").duplicate_id == 0 and reg.duplicate_ids() == {}


def test_an_instance_back_after_the_window_is_no_duplicate():
    reg = DeviceRegistry(duplicate_window_s=100.0)
    reg.on_hello(hello(instance="a"), 0.0)
    reg.on_hello(hello(instance="b"), 10.0)
    assert not reg.on_hello(hello(instance="a"), 200.0)


def test_core_counts_logs_once_and_records_a_duplicate_device_id(caplog):
    core = CoordinatorCore(CoordinatorConfig(model=SPEC))
    events = []
    with caplog.at_level(logging.ERROR, logger="streamfl.coordinator.core"):
        for t, instance in enumerate("ababab"):
            events += [e for e in core.on_message(hello(instance=instance), float(t)).events]
    assert core.counters["duplicate_device_id"] == 4
    assert [e["event"] for e in events] == ["duplicate_device_id"] * 4
    assert events[-1]["device"] == "pi-01" and events[-1]["count"] == 4
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1                               # rate-limited per device
    assert "device id pi-01 is used by 2 agent processes" in errors[0]
    assert "flashed from one image" in errors[0]


def test_hello_instance_is_optional_on_the_wire():
    decoder = Decoder({})
    frame = encode(hello(instance="9f2c"))
    assert decoder.decode(frame).instance == "9f2c"
    # An older agent's Hello has no instance field at all (blanked, so the header keeps its
    # length): it still parses, as "".
    field = b',"instance":"9f2c"'
    old = frame.replace(field, b" " * len(field))
    assert old != frame
    assert decoder.decode(old).instance == ""


# ---- the daemon and the CLI ----------------------------------------------------------------------

def test_daemon_warns_once_while_the_coordinator_is_silent_and_says_when_it_is_back(tmp_path, caplog):
    """Over the in-memory broker: a model, then the coordinator's will; the agent warns once,
    naming what it does meanwhile, and logs once when a newer model comes."""
    import threading

    from polling import wait_until
    from test_agent_daemon import DEV, FLEET, FakeCoordinator, make_config

    from streamfl.agent.daemon import AgentDaemon
    from streamfl.protocol.messages import CoordinatorStatus
    from streamfl.protocol.topics import Topics
    from streamfl.protocol.transport.memory import MemoryBroker, MemoryTransport
    from streamfl.sensors import make_source

    broker = MemoryBroker()
    coord = FakeCoordinator(broker)
    coord.publish_model(3)
    status = Topics(FLEET).coordinator_status
    coord.t.publish(status, encode(CoordinatorStatus(online=False, run_id="")), qos=1, retain=True)
    config = make_config(coordinator_silence_warn_s=0.6)
    transport = MemoryTransport(broker, DEV)
    daemon = AgentDaemon(config, transport, make_source(config.sensor, DEV), tmp_path / "state")
    thread = threading.Thread(target=daemon.run, daemon=True)
    silent = "nothing heard from the coordinator of fleet %r" % FLEET
    with caplog.at_level(logging.INFO, logger="streamfl.agent.coordinator_watch"):
        thread.start()
        try:
            wait_until(lambda: silent in caplog.text, timeout_s=20, what="the silence warning")
            time.sleep(1.5)   # still silent: no second warning
            coord.publish_model(4)
            wait_until(lambda: "is heard again (global model v4)" in caplog.text, timeout_s=30,
                       what="the coordinator back")
        finally:
            daemon.stop()
            thread.join(30)
    warnings = [r.getMessage() for r in caplog.records if silent in r.getMessage()]
    assert len(warnings) == 1 and daemon.counters["coordinator_silences"] == 1
    assert "keeps training from v3 of run (unnamed)" in warnings[0]
    assert "its updates wait in the broker" in warnings[0]
    assert "retained status says offline" in warnings[0]
    assert caplog.text.count("is heard again (") == 1


def _check_config(*flags):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "streamfl.agent", "--check-config"] + list(flags),
                          capture_output=True, text=True, timeout=120)


def test_check_config_says_where_the_device_id_came_from():
    derived = _check_config()
    assert derived.returncode == 0, derived.stderr
    host = socket.gethostname()
    first = derived.stdout.splitlines()[0]
    assert first.startswith("# device_id ") and "derived from the hostname %r" % host in first
    assert "flashed from one image" in derived.stderr and "set device_id" in derived.stderr
    given = _check_config("--device-id", "pi-07")
    assert given.returncode == 0, given.stderr
    assert given.stdout.splitlines()[0] == "# device_id pi-07: from --device-id"
    assert "flashed from one image" not in given.stderr


def test_the_fleet_table_marks_the_row_of_a_shared_id():
    from streamfl.coordinator.fleet import FleetTable, FleetTableConfig
    table, registry = FleetTable(FleetTableConfig(), "lab", "fedasync", "fedasync", []), DeviceRegistry()
    for t, instance in enumerate("aba"):
        registry.on_hello(hello(instance=instance), float(t))
    registry.on_hello(hello("pi-02", instance="c"), 0.0)
    snap = table.refresh(now=4.0, t_s=4.0, version=0, devices=registry.devices(), methods={})
    rows = {row["device"]: row for row in snap["devices"]}
    assert rows["pi-01"]["duplicate_device_id"] == 1 and rows["pi-02"]["duplicate_device_id"] == 0
