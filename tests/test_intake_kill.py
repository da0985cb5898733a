"""A kill -9 of the real coordinator mid-stream loses no update the broker acknowledged.

mosquitto, the real ``streamfl-coordinator`` process (saves at most every 30 s, so the kill lands
while every update since the start is unsaved) and a paho board sending updates at QoS 1 as fast
as they are taken. The coordinator is SIGKILLed mid-stream and started again on the same state
folder. Every PUBACKed update id must then be in the saved model's effect: aggregated by the
first process into a version at or below the one the second resumed from, or aggregated by the
second (from the intake journal, or redelivered by the broker). Before the journal, the second
process never saw the updates the first had taken but not saved.
"""
import json
import shutil
import sys
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
import yaml
from paho.mqtt.enums import CallbackAPIVersion

from factories import SPEC, UNBOUNDED_ADMISSION, make_hello, make_update
from fleet import Proc
from polling import wait_until
from streamfl.coordinator.intake import entries_on_disk
from streamfl.protocol.codec import encode
from streamfl.protocol.topics import Topics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120),
              pytest.mark.skipif(not shutil.which("mosquitto"), reason="needs mosquitto")]

FLEET = "kill"
TOPICS = Topics(FLEET)
DEVICE = "pi-k"
N = 150
COORDINATOR = [str(Path(sys.executable).with_name("streamfl-coordinator"))]
if not Path(COORDINATOR[0]).exists():
    COORDINATOR = [sys.executable, "-m", "streamfl.coordinator"]


def _events(run_dir: Path):
    out = []
    path = run_dir / "metrics.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass  # a line the kill cut
    return out


def test_a_sigkill_mid_stream_loses_no_acknowledged_update(tmp_path, mqtt_broker):
    config = tmp_path / "coordinator.yaml"
    config.write_text(yaml.safe_dump({
        "fleet": FLEET, "persist_interval_s": 30.0,
        "model": {"name": SPEC.name, "in_channels": SPEC.in_channels, "window_len": SPEC.window_len,
                  "num_classes": SPEC.num_classes, "hidden": SPEC.hidden},
        "admission": dict(UNBOUNDED_ADMISSION, max_updates_per_s=1e5), "monitor": {"enabled": False},
        "mqtt": {"host": mqtt_broker.host, "port": mqtt_broker.port,
                 "reconnect_min_s": 0.2, "reconnect_max_s": 1.0},
        "exclusive": {"probe_wait_s": 2.0, "connect_wait_s": 1.0}}))
    state, run = tmp_path / "state", tmp_path / "run"
    argv = COORDINATOR + ["--config", str(config), "--state-dir", str(state), "--run-dir", str(run)]

    def start(name):
        proc = Proc(name, argv, tmp_path / ("%s.log" % name), tmp_path)
        wait_until(lambda: "holds fleet %s" % FLEET in proc.log_text() or not proc.alive, 60,
                   "%s to publish" % name)
        assert proc.alive, proc.tail()
        return proc

    first = start("first")
    acked, sent = set(), {}
    board = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=DEVICE, clean_session=True,
                        protocol=mqtt.MQTTv311)
    board.max_inflight_messages_set(20)
    board.max_queued_messages_set(0)
    board.on_publish = lambda c, u, mid, rc, p: acked.add(mid)
    board.connect(mqtt_broker.host, mqtt_broker.port, 30)
    board.loop_start()
    second = None
    try:
        wait_until(board.is_connected, 10, "the board to connect")
        board.publish(TOPICS.device(DEVICE, "status"), encode(make_hello(DEVICE, SPEC)), qos=1, retain=True)
        for i in range(N):
            update = make_update(SPEC, value=None, seed=i, device_id=DEVICE, update_id="u%d" % i)
            sent[board.publish(TOPICS.device(DEVICE, "update"), encode(update), qos=1).mid] = update.update_id
        wait_until(lambda: len(acked) >= N // 3, 30, "a third of the updates acknowledged")
        first.kill()  # mid-stream: the rest wait in the broker for the coordinator's session
        wait_until(lambda: len(acked) >= N + 1, 30, "every update acknowledged")
        ids = {sent[mid] for mid in acked if mid in sent}
        assert len(ids) == N

        second = start("second")

        def accounted(missing=False):
            events = _events(run)
            starts = [i for i, e in enumerate(events) if e.get("event") == "process_start"]
            if len(starts) < 2:
                return ids if missing else None
            resumed = events[starts[1]]["resumed_version"]
            saved = {e["update_id"] for e in events[:starts[1]] if e.get("event") == "update"
                     and e["aggregated"] and e["version"] <= resumed}
            again = {e["update_id"] for e in events[starts[1]:] if e.get("event") == "update"
                     and e["outcome"] != "duplicate"}  # aggregated, or counted under a reason
            if missing:
                return ids - saved - again
            return (saved, again) if ids <= saved | again else None

        try:
            wait_until(accounted, 40, "every acknowledged update saved or aggregated again")
        except AssertionError:
            lost = accounted(missing=True)
            raise AssertionError("%d acknowledged update(s) lost, e.g. %s:\n%s" % (
                len(lost), sorted(lost)[:5], second.tail())) from None
        saved, again = accounted()
        assert not saved & again, "applied twice: %s" % sorted(saved & again)[:5]
        log = second.log_text()
        line = next(l for l in log.splitlines() if "intake journal:" in l)
        replayed = int(line.split("intake journal: ")[1].split()[0])
        assert replayed > 0, line  # the kill landed with updates taken but not saved
        assert second.terminate() == 0, second.tail()
        assert list(entries_on_disk(state)) == []  # a clean stop leaves the journal empty
    finally:
        board.disconnect()
        board.loop_stop()
        for proc in (first, second):
            if proc is not None:
                proc.terminate(timeout_s=20.0)
