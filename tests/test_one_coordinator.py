"""One coordinator per fleet, with the real ``streamfl-coordinator`` command
(``python -m streamfl.coordinator``) against real mosquitto.

Before: a second coordinator of the fleet (another state folder, the same client id) ran without a
word; the two kicked each other off the broker in turn and the agents followed each run
alternately. And an embedded broker that could not bind its port logged a traceback.

Now: the second one exits 2 naming the first (run, client id, host, pid) without disturbing it;
``--take-over`` starts it anyway and the first steps down (exit 2, saying by whom) while the
retained status and model stay the newcomer's; a coordinator restarted right after ``kill -9`` on
its state folder (its retained status still says online until the broker fires its last will) is
not locked out by its own status; ``--embedded-broker`` on a taken port exits 2 in one line.

In process (a MemoryBroker), the connect gate: a coordinator publishes nothing on a connection
before it has read the retained status there, so one that finds an older coordinator online
steps down having said nothing, and a reconnect that finds an older one's offline status (the
sign of one sharing its client id) yields instead of fighting. The shipped broker config's side
(one account for both, ``use_username_as_clientid``) is ``tests/test_shipped_broker_restart.py``.
"""
import signal
import socket
import subprocess
import sys
import time

import pytest
import yaml

from fleet import ModelWatcher, Proc
from factories import SPEC
from polling import wait_until
from streamfl.protocol.messages import CoordinatorStatus, GlobalModel
from streamfl.protocol.topics import Topics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FLEET = "solo"
TOPICS = Topics(FLEET)
CONFIG = {"fleet": FLEET,
          "model": {"name": SPEC.name, "in_channels": SPEC.in_channels, "window_len": SPEC.window_len,
                    "num_classes": SPEC.num_classes, "hidden": SPEC.hidden},
          "persist_interval_s": 0.0,
          "mqtt": {"reconnect_min_s": 0.2, "reconnect_max_s": 1.0},
          "exclusive": {"probe_wait_s": 1.0, "connect_wait_s": 10.0}}


class Coordinators:
    """Coordinator processes on the test's broker, each with a state folder of its own name."""

    def __init__(self, root, broker):
        self.root = root
        self.broker = broker
        self.config = root / "coordinator.yaml"
        self.config.write_text(yaml.safe_dump(CONFIG))
        self.procs = []

    def argv(self, name: str, *extra: str):
        return [sys.executable, "-m", "streamfl.coordinator", "--config", str(self.config),
                "--broker", self.broker.host, "--port", str(self.broker.port),
                "--state-dir", str(self.root / ("state-" + name)),
                "--run-dir", str(self.root / ("run-" + name))] + list(extra)

    def start(self, name: str, *extra: str) -> Proc:
        n = sum(1 for p in self.procs if p.name == name)
        proc = Proc(name, self.argv(name, *extra), self.root / ("%s-%d.log" % (name, n)), self.root)
        self.procs.append(proc)
        return proc

    def run(self, name: str, *extra: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(name, *extra), capture_output=True, text=True,
                              timeout=timeout_s, cwd=str(self.root))

    def stop_all(self) -> None:
        for proc in self.procs:
            proc.terminate(timeout_s=20.0)


@pytest.fixture
def coordinators(tmp_path, mqtt_broker):
    made = Coordinators(tmp_path, mqtt_broker)
    try:
        yield made
    finally:
        made.stop_all()


@pytest.fixture
def watcher(mqtt_broker):
    w = ModelWatcher(mqtt_broker.host, mqtt_broker.port, FLEET, SPEC, client_id="test-status-watcher",
                     extra_topics=(TOPICS.coordinator_status,))
    try:
        yield w
    finally:
        w.close()


def _statuses(watcher):
    return [m for _, m in watcher.on_topic(TOPICS.coordinator_status) if isinstance(m, CoordinatorStatus)]


def _online(watcher, proc: Proc, timeout_s: float = 60.0) -> CoordinatorStatus:
    """The online status of ``proc`` (by pid), once it published it."""
    def found():
        if not proc.alive:
            raise AssertionError("%s exited with %s:\n%s" % (proc.name, proc.popen.returncode, proc.tail()))
        return next((s for s in _statuses(watcher) if s.online and s.pid == proc.pid), None)
    wait_until(found, timeout_s, "%s's online status" % proc.name)
    return found()


def test_a_second_coordinator_of_the_fleet_exits_2_naming_the_first(coordinators, watcher):
    first = coordinators.start("first")
    status = _online(watcher, first)
    assert status.run_id and status.instance and status.host == socket.gethostname()
    assert status.client_id == "coordinator-" + FLEET and status.started_s > 0
    second = coordinators.run("second")
    assert second.returncode == 2, second
    message = second.stderr.strip().splitlines()[-1]
    assert "another coordinator of fleet %s is online" % FLEET in message, second.stderr
    for part in (status.run_id, status.client_id, status.host, "pid %d" % first.pid, "--take-over"):
        assert part in message, (part, message)
    assert "Traceback" not in second.stderr + second.stdout
    # The probe used a client id of its own: the first coordinator was never disconnected.
    time.sleep(1.0)
    assert first.alive and "lost connection" not in first.log_text(), first.tail()
    assert [s.pid for s in _statuses(watcher) if s.online] == [first.pid]
    assert first.terminate() == 0


def test_take_over_starts_the_second_and_the_first_steps_down(coordinators, watcher, mqtt_broker):
    first = coordinators.start("first")
    old = _online(watcher, first)
    wait_until(lambda: any(m.run_id == old.run_id for m in watcher.models()), 30, "the first's model")
    second = coordinators.start("second", "--take-over")
    new = _online(watcher, second)
    assert new.took_over == old.instance and new.run_id != old.run_id
    wait_until(lambda: not first.alive, 30, "the first coordinator to step down")
    assert first.popen.returncode == 2, first.tail()
    assert "another coordinator keeps fleet %s" % FLEET in first.log_text(), first.tail()
    assert new.run_id in first.log_text()
    assert "taking over fleet %s" % FLEET in second.log_text(), second.tail()
    # From now on the broker holds the newcomer's status and model, and nothing of the first's.
    stepped_down = time.monotonic()
    time.sleep(2.0)
    late = ModelWatcher(mqtt_broker.host, mqtt_broker.port, FLEET, SPEC, client_id="test-late-watcher",
                        extra_topics=(TOPICS.coordinator_status,))
    try:
        wait_until(lambda: late.models() and _statuses(late), 10, "the retained model and status")
        retained = _statuses(late)[-1]
        assert retained.online and retained.instance == new.instance, retained
        assert late.models()[-1].run_id == new.run_id
    finally:
        late.close()
    assert all(m.run_id == new.run_id for m in watcher.models(since_s=stepped_down))
    statuses = _statuses(watcher)
    since_new = statuses[[s.instance for s in statuses].index(new.instance):]
    assert not any(s.instance == old.instance for s in since_new), statuses
    # The first heard the newcomer's notice and stepped down before the newcomer connected with
    # the same client id: the models changed run once, as agents should see it.
    runs = [m.run_id for m in watcher.models()]
    assert sum(1 for a, b in zip(runs, runs[1:]) if a != b) == 1, runs
    assert second.alive
    assert second.terminate() == 0


def test_a_restart_after_kill_9_on_the_same_state_folder_is_not_refused(coordinators, watcher):
    first = coordinators.start("first")
    old = _online(watcher, first)
    first.kill()
    again = coordinators.start("first")
    new = _online(watcher, again)
    assert new.run_id == old.run_id and new.instance != old.instance
    assert again.terminate() == 0


def test_a_restart_while_the_broker_still_sees_the_old_process_online_is_not_refused(
        coordinators, watcher):
    """On one host the kernel closes a killed process's connection and the broker fires the last
    will at once; after a host crash or a network cut the broker keeps the old connection, and so
    the retained "online" status, for up to 1.5 keep-alives. A stopped (SIGSTOP) process stands
    for that: the coordinator restarted on its state folder sees its own run online and starts."""
    first = coordinators.start("first")
    old = _online(watcher, first)
    first.popen.send_signal(signal.SIGSTOP)
    try:
        again = coordinators.start("first")
        new = _online(watcher, again)
    finally:
        first.kill()
    assert new.run_id == old.run_id and new.instance != old.instance
    assert "this coordinator's own run %s is online" % old.run_id in again.log_text(), again.tail()
    time.sleep(1.0)
    assert again.alive
    assert again.terminate() == 0


def test_an_embedded_broker_on_a_taken_port_exits_2_in_one_line(coordinators, mqtt_broker):
    done = coordinators.run("embedded", "--embedded-broker")  # mosquitto holds the port
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stdout, done
    assert "cannot listen on %s:%d" % (mqtt_broker.host, mqtt_broker.port) in lines[0], lines
    assert "holds the port" in lines[0]


# ---- the connect gate, in process (coordinator/liveness.py, ConnectGate) ------------------------
# MemoryBroker delivers in order, like mosquitto: the retained status, then the coordinator's echo.

class _Watch:
    """Everything published on the fleet's model and coordinator status topics, in order."""

    def __init__(self, broker):
        from streamfl.protocol.transport.memory import MemoryTransport
        self.got = []
        self.transport = MemoryTransport(broker, "watch", persistent_session=False)
        self.transport.on_message = lambda topic, payload: self.got.append((topic, payload))
        self.transport.subscribe(TOPICS.model)
        self.transport.subscribe(TOPICS.coordinator_status)
        self.transport.connect()

    def retain_status(self, status: CoordinatorStatus) -> None:
        from streamfl.protocol.codec import encode
        assert self.transport.publish(TOPICS.coordinator_status, encode(status), qos=1, retain=True)

    def from_instance(self, instance: str):
        """What was published naming ``instance`` (its statuses), and every model."""
        from streamfl.models import tensor_spec
        from streamfl.protocol.codec import Decoder
        decoder = Decoder({SPEC.arch_id: tensor_spec(SPEC)})
        out = []
        for topic, payload in list(self.got):
            msg = decoder.try_decode(payload, source=topic)
            if topic == TOPICS.model or (isinstance(msg, CoordinatorStatus) and msg.instance == instance):
                out.append(msg)
        return out


def _server(broker, tmp_path):
    from streamfl.coordinator.config import CoordinatorConfig
    from streamfl.coordinator.server import CoordinatorServer
    from streamfl.protocol.transport.memory import MemoryTransport
    from streamfl.coordinator.monitor.config import MonitorConfig
    config = CoordinatorConfig(fleet=FLEET, model=SPEC, persist_interval_s=0.0,
                               monitor=MonitorConfig(enabled=False))
    return CoordinatorServer(config, MemoryTransport(broker, "coordinator-" + FLEET),
                             tmp_path / "state", tmp_path / "run")


@pytest.fixture
def memory_broker():
    from streamfl.protocol.transport.memory import MemoryBroker
    return MemoryBroker()


def _older(online: bool, run_id: str = "other-run") -> CoordinatorStatus:
    return CoordinatorStatus(online=online, run_id=run_id, client_id="coordinator-" + FLEET,
                             host="elsewhere", pid=1, started_s=1.0, instance="older")


def test_a_coordinator_publishes_nothing_where_an_older_one_is_online(memory_broker, tmp_path):
    """Before: it said online and republished its model the moment it connected, and stepped
    down only when the retained status reached it just after."""
    watch = _Watch(memory_broker)
    watch.retain_status(_older(online=True))
    server = _server(memory_broker, tmp_path)
    try:
        server.start()
        wait_until(lambda: server.taken_over_by is not None, 10, "the server to step down")
        time.sleep(0.3)
        assert watch.from_instance(server.instance) == []
    finally:
        server.stop()
    assert watch.from_instance(server.instance) == []  # not even offline over the other's status


def test_an_offline_status_does_not_hold_a_first_connection_but_yields_a_reconnect(
        memory_broker, tmp_path):
    """A previous coordinator's offline status at start is the normal case: go online. The same
    status at a reconnect means an older coordinator had the fleet while this one was away, and
    is offline because this connection took its client id: yield, instead of kicking it off in
    turn forever (one account under use_username_as_clientid)."""
    watch = _Watch(memory_broker)
    watch.retain_status(_older(online=False))
    server = _server(memory_broker, tmp_path)
    try:
        server.start()
        wait_until(lambda: any(isinstance(m, CoordinatorStatus) and m.online
                               for m in watch.from_instance(server.instance)), 10, "online")
        wait_until(lambda: any(isinstance(m, GlobalModel) for m in watch.from_instance(server.instance)),
                   10, "its model")
        memory_broker.drop(server.transport.client_id)    # its will: offline
        watch.retain_status(_older(online=False))         # the older one's will, as it was kicked
        seen = len(watch.got)
        server.transport.connect()
        wait_until(lambda: server.taken_over_by is not None, 10, "the reconnect to yield")
        assert server.taken_over_by.instance == "older"
        time.sleep(0.3)
        assert watch.got[seen:] == []  # no online status, no model
    finally:
        server.stop()
