"""Nothing the broker acknowledged is lost across coordinator and broker restarts, under the SHIPPED
broker config, and a second coordinator on the coordinator's account disturbs nothing.

mosquitto runs from ``configs/mosquitto/streamfl.conf`` and ``acl`` as they ship (``field/broker.py``:
only paths, the listener and the device blocks rewritten): TLS, passwords, the ACL and
``use_username_as_clientid``. The coordinator is the real ``streamfl-coordinator`` process (TLS,
user name ``coordinator``, a password file); a raw paho client logged in as device ``pi-a`` plays
the board: it says Hello and sends encoded ``Update``s at QoS 1, and records each one the broker
acknowledged (PUBACK). An update counts as arrived once a line of the run's ``metrics.jsonl``
names its ``update_id`` with an outcome (aggregated, or a named reason).

Before: the coordinator's start-up probe connected as ``coordinator`` with a clean session; the
broker made that its client id, so the probe wiped the coordinator's persistent session and
every update queued while it was down was gone (``session present: False``), and a second
coordinator on the account kicked the live one off, saw its will and published a fresh v0. The
broker also kept at most 1000 queued messages for the session (mosquitto's default). Now the
probe has an account of its own (``coordinator-probe``), the coordinator publishes nothing on a
connection before it read the retained status there, and ``--take-over`` on the one account
settles in one change of run.
"""
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import paho.mqtt.client as mqtt
import pytest
import yaml
from paho.mqtt.enums import CallbackAPIVersion

from factories import SPEC, UNBOUNDED_ADMISSION, make_hello, make_update
from fleet import Proc
from polling import wait_until
from streamfl.coordinator.liveness import ExclusiveConfig, check_fleet
from streamfl.errors import StartupError
from streamfl.models import tensor_spec
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import CoordinatorStatus, GlobalModel
from streamfl.protocol.topics import Topics
from streamfl.protocol.transport.base import MqttSettings

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # appended: the root's streamfl/ folder is not the installed package
from field.broker import ShippedBroker  # noqa: E402

pytestmark = [
    pytest.mark.integration, pytest.mark.timeout(180),
    pytest.mark.skipif(not (shutil.which("mosquitto") and shutil.which("mosquitto_passwd")
                            and shutil.which("openssl")),
                       reason="needs mosquitto, mosquitto_passwd and openssl"),
]

FLEET = "field"
TOPICS = Topics(FLEET)
DEVICE, WATCHER = "pi-a", "pi-watch"
COORDINATOR = [str(Path(sys.executable).with_name("streamfl-coordinator"))]
if not Path(COORDINATOR[0]).exists():
    COORDINATOR = [sys.executable, "-m", "streamfl.coordinator"]
#: Past mosquitto's default max_queued_messages (1000): the shipped config must keep them all.
MANY = 1200


class Paho:
    """A raw paho client logged in as ``account``: records what it receives and which QoS 1
    publishes the broker acknowledged."""

    def __init__(self, broker: ShippedBroker, account: str, filters=()):
        self.decoder = Decoder({SPEC.arch_id: tensor_spec(SPEC)})
        self.got: List = []
        #: Message ids the broker acknowledged, and the label of each id sent (no lock: paho calls
        #: on_publish holding its own, which publish() takes too).
        self._acked: set = set()
        self._sent: Dict[int, str] = {}
        self.filters = list(filters)
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=account, clean_session=True,
                                  protocol=mqtt.MQTTv311)
        self.client.tls_set(ca_certs=str(broker.ca_file))
        self.client.username_pw_set(account, broker.password(account))
        self.client.max_inflight_messages_set(100)
        self.client.max_queued_messages_set(0)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_publish = self._on_publish
        self.client.connect(broker.host, broker.port, 30)
        self.client.loop_start()
        wait_until(self.client.is_connected, 10, "%s to connect" % account)

    def _on_connect(self, client, userdata, flags, reason_code, properties):
        if self.filters:
            client.subscribe([(f, 1) for f in self.filters])

    def _on_message(self, client, userdata, message):
        self.got.append((time.monotonic(), message.topic,
                         self.decoder.try_decode(message.payload, source=message.topic)))

    def _on_publish(self, client, userdata, mid, reason_code, properties):
        self._acked.add(mid)

    def send(self, topic: str, frame: bytes, label: str, retain: bool = False) -> None:
        info = self.client.publish(topic, frame, qos=1, retain=retain)
        assert info.rc == mqtt.MQTT_ERR_SUCCESS, info.rc
        self._sent[info.mid] = label

    def acked_labels(self) -> List[str]:
        return [self._sent[mid] for mid in list(self._acked) if mid in self._sent]

    def statuses(self) -> List[CoordinatorStatus]:
        return [m for _, t, m in list(self.got) if isinstance(m, CoordinatorStatus)]

    def models(self, since: float = 0.0) -> List[GlobalModel]:
        return [m for at, t, m in list(self.got) if isinstance(m, GlobalModel) and at >= since]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class Field:
    """The shipped broker, the watcher and the device, and coordinator processes on them."""

    def __init__(self, root: Path):
        self.root = root
        self.broker = ShippedBroker(root / "broker", devices=[DEVICE, WATCHER]).start()
        self.config = root / "coordinator.yaml"
        self.config.write_text(yaml.safe_dump({
            "fleet": FLEET, "persist_interval_s": 0.0,
            "model": {"name": SPEC.name, "in_channels": SPEC.in_channels, "window_len": SPEC.window_len,
                      "num_classes": SPEC.num_classes, "hidden": SPEC.hidden},
            "admission": dict(UNBOUNDED_ADMISSION), "monitor": {"enabled": False},
            "mqtt": {"host": self.broker.host, "port": self.broker.port, "username": "coordinator",
                     "tls_ca": str(self.broker.ca_file),
                     "password_file": str(self.broker.password_file("coordinator")),
                     "reconnect_min_s": 0.2, "reconnect_max_s": 1.0},
            "exclusive": {"probe_wait_s": 2.0, "connect_wait_s": 1.0}}))
        self.procs: List[Proc] = []
        self.watcher = Paho(self.broker, WATCHER, [TOPICS.model, TOPICS.coordinator_status])
        self.device = Paho(self.broker, DEVICE)
        self.sent: List[str] = []

    def argv(self, name: str) -> List[str]:
        return COORDINATOR + ["--config", str(self.config), "--state-dir", str(self.root / ("state-" + name)),
                              "--run-dir", str(self.root / ("run-" + name))]

    def start(self, name: str = "c", *extra: str) -> Proc:
        proc = Proc(name, self.argv(name) + list(extra), self.root / ("%s-%d.log" % (name, len(self.procs))),
                    self.root)
        self.procs.append(proc)
        return proc

    def online(self, proc: Proc, timeout_s: float = 60.0) -> CoordinatorStatus:
        def found():
            assert proc.alive, "%s exited %s:\n%s" % (proc.name, proc.popen.returncode, proc.tail())
            return next((s for s in self.watcher.statuses() if s.online and s.pid == proc.pid), None)
        wait_until(found, timeout_s, "%s's online status" % proc.name)
        return found()

    def hello(self) -> None:
        self.device.send(TOPICS.device(DEVICE, "status"), encode(make_hello(DEVICE, SPEC)), "hello",
                         retain=True)

    def updates(self, n: int) -> List[str]:
        """Send ``n`` updates; the ids of those the broker acknowledged (all, or the test fails)."""
        ids = []
        for _ in range(n):
            update = make_update(SPEC, value=None, seed=len(self.sent), device_id=DEVICE,
                                 update_id="%s-%d" % (DEVICE, len(self.sent)))
            self.device.send(TOPICS.device(DEVICE, "update"), encode(update), update.update_id)
            self.sent.append(update.update_id)
            ids.append(update.update_id)
        wait_until(lambda: set(ids) <= set(self.device.acked_labels()), 30,
                   "the broker to acknowledge %d updates" % n)
        return ids

    def handled(self, name: str = "c") -> Dict[str, str]:
        """``{update_id: outcome}`` of every update line in the run's metrics.jsonl."""
        out = {}
        path = self.root / ("run-" + name) / "metrics.jsonl"
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # a line being written
                if event.get("event") == "update":
                    out[event["update_id"]] = event.get("reason") or event["outcome"]
        return out

    def wait_handled(self, ids: List[str], proc: Proc, timeout_s: float = 60.0) -> None:
        def done():
            assert proc.alive, "%s exited %s:\n%s" % (proc.name, proc.popen.returncode, proc.tail())
            return set(ids) <= set(self.handled())
        try:
            wait_until(done, timeout_s, "%d acknowledged updates in metrics.jsonl" % len(ids))
        except AssertionError:
            missing = sorted(set(ids) - set(self.handled()))
            raise AssertionError("%d of %d acknowledged updates never reached metrics.jsonl (e.g. %s):\n%s"
                                 % (len(missing), len(ids), missing[:5], proc.tail())) from None

    def close(self) -> None:
        for proc in self.procs:
            proc.terminate(timeout_s=20.0)
        self.device.close()
        self.watcher.close()
        self.broker.stop()


@pytest.fixture
def field(tmp_path):
    made = Field(tmp_path)
    try:
        yield made
    finally:
        made.close()


def _running_with_updates(field: Field) -> Proc:
    """A coordinator online that has handled the device's Hello and first updates."""
    first = field.start()
    field.online(first)
    field.hello()
    field.wait_handled(field.updates(3), first)
    return first


def test_updates_sent_while_the_coordinator_is_down_all_arrive_after_sigterm_and_sigkill(field):
    proc = _running_with_updates(field)
    for stop in ("sigterm", "sigkill"):
        if stop == "sigterm":
            assert proc.terminate() == 0, proc.tail()
        else:
            proc.kill()  # the broker fires its will at once: the socket closed
        while_down = field.updates(30)
        proc = field.start()
        field.online(proc)
        field.wait_handled(while_down, proc)
        assert "session present: True" in proc.log_text(), (stop, proc.tail())
        outcomes = field.handled()
        assert all(outcomes[i] for i in while_down)
    assert proc.terminate() == 0, proc.tail()


def test_a_broker_restart_while_the_coordinator_is_down_keeps_more_than_1000_updates(field):
    first = _running_with_updates(field)
    assert first.terminate() == 0, first.tail()
    while_down = field.updates(MANY)
    field.device.close()
    field.watcher.close()
    field.broker.stop()           # SIGTERM: mosquitto writes its database
    again = field.start()         # the broker is down: it waits, publishing nothing
    wait_until(lambda: "cannot reach the broker" in again.log_text(), 30, "the wait warning")
    assert again.alive, again.tail()
    field.broker.start()
    field.watcher = Paho(field.broker, WATCHER, [TOPICS.model, TOPICS.coordinator_status])
    field.online(again)
    field.wait_handled(while_down, again, timeout_s=90.0)
    assert again.terminate() == 0, again.tail()


def test_a_second_coordinator_on_the_same_account_exits_2_and_disturbs_nothing(field):
    """Then one with --take-over: on one account the broker hands it the client id and cuts the
    live one off (its will says offline); the live one, reconnecting, cuts the newcomer off in
    turn and finds the newcomer's status (online, or its will) naming it as taken over: it steps
    down without a word instead of fighting, and the fleet changes run once."""
    first = _running_with_updates(field)
    live = field.online(first)
    wait_until(lambda: any(m.run_id == live.run_id for m in field.watcher.models()), 30, "its model")
    newest = max(m.version for m in field.watcher.models())
    since = time.monotonic()
    second = subprocess.run(field.argv("second"), capture_output=True, text=True, timeout=90,
                            cwd=str(field.root))
    assert second.returncode == 2, (second.returncode, second.stderr[-3000:], second.stdout[-3000:])
    message = second.stderr.strip().splitlines()[-1]
    assert "another coordinator of fleet %s is online" % FLEET in message, second.stderr
    for part in (live.run_id, "pid %d" % first.pid):
        assert part in message, (part, message)
    # The live one never lost its connection, and the fleet never saw another run's model.
    after = field.updates(3)
    field.wait_handled(after, first)
    log = first.log_text()
    assert "lost connection" not in log and "disconnected from the broker" not in log, first.tail()
    assert [m for m in field.watcher.models(since) if m.run_id != live.run_id or m.version < newest] == []
    assert [s for s in field.watcher.statuses() if s.run_id != live.run_id] == []

    taking = field.start("taking", "--take-over")
    new = field.online(taking)
    wait_until(lambda: not first.alive, 30, "the live one to step down")
    assert first.popen.returncode == 2, first.tail()
    assert "another coordinator keeps fleet %s" % FLEET in first.log_text(), first.tail()
    assert new.took_over == live.instance and new.run_id != live.run_id
    time.sleep(2.0)  # the newcomer's reconnect after the old one's: it must hold the fleet then
    assert taking.alive, taking.tail()
    wait_until(lambda: field.watcher.statuses()[-1].instance == new.instance
               and field.watcher.statuses()[-1].online, 10, "the newcomer's status, retained last")
    runs = [m.run_id for m in field.watcher.models(since)]
    assert sum(1 for x, y in zip(runs, runs[1:]) if x != y) <= 1 and runs[-1] == new.run_id, runs
    assert taking.terminate() == 0, taking.tail()


def test_a_probe_account_the_broker_refuses_stops_the_start_naming_it(field):
    """In process (the CLI turns this StartupError into exit code 2, as for the live one above)."""
    settings = MqttSettings(host=field.broker.host, port=field.broker.port, client_id="coordinator-x",
                            tls_ca=field.broker.ca_file, username="coordinator",
                            password=field.broker.password("coordinator"),
                            reconnect_min_s=0.2, reconnect_max_s=0.5)
    mine = CoordinatorStatus(online=True, run_id="mine", instance="i")
    started = time.monotonic()
    with pytest.raises(StartupError) as caught:
        check_fleet(settings, FLEET, mine, ExclusiveConfig(probe_username="nobody-probe",
                                                            connect_wait_s=30.0))
    message = str(caught.value)
    assert "refused the start-up probe's account nobody-probe" in message, message
    assert "exclusive.probe_username" in message and "configs/mosquitto/acl" in message
    assert time.monotonic() - started < 10  # at the broker's answer, not after a wait
    assert caught.value.exit_code == 2
