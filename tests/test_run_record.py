"""One run, one record: a coordinator run restarted twice over a real mosquitto broker keeps one
``metrics.jsonl`` on one time axis (each process's start marked) and one ``summary.json`` of the
whole run, and ``streamfl report`` reads it right; a run folder from before process lines still
loads; the run's folder is the state folder's, not each process's."""
import json
import time

import numpy as np
import pytest

from factories import UNBOUNDED_ADMISSION, make_hello, make_update
from polling import updates_handled, wait_for
from streamfl.cli import main as streamfl_main
from streamfl.coordinator.admission import AdmissionConfig
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.monitor.config import MonitorConfig
from streamfl.coordinator.run_record import NO_STOP, RUN_FILE
from streamfl.coordinator.server import _STOP, CoordinatorServer
from streamfl.models import ModelSpec
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import GlobalModel
from streamfl.protocol.topics import Topics
from streamfl.protocol.transport.base import MqttSettings
from streamfl.protocol.transport.paho import PahoTransport
from streamfl.sensors.datasets import save_npz
from streamfl.sim.report_html import render_report
from streamfl.sim.tables import fmt_value

SPEC = ModelSpec(name="mlp", in_channels=2, window_len=4, num_classes=3, hidden=4)
FLEET = "rec"
TOPICS = Topics(FLEET)
UPDATES_PER_PROCESS = 2


def config(tmp_path, **kw):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((30, SPEC.window_len, SPEC.in_channels)).astype(np.float32)
    y = rng.integers(0, SPEC.num_classes, 30).astype(np.int64)
    eval_path = save_npz(tmp_path / "eval.npz", x, y, np.zeros(30, dtype=np.int64), ["a", "b", "c"])
    kw.setdefault("eval_path", str(eval_path))
    return CoordinatorConfig(model=SPEC, fleet=FLEET, persist_interval_s=0.0, eval_every_versions=1,
                             admission=AdmissionConfig(**UNBOUNDED_ADMISSION),
                             monitor=MonitorConfig(enabled=False), **kw)


class FakeDevice:
    """A board on the broker: hello, then updates trained from the newest model it got."""

    def __init__(self, broker, device_id):
        self.device_id = device_id
        self.models = []
        decoder = Decoder({SPEC.arch_id: _spec()})
        self.transport = PahoTransport(MqttSettings(host=broker.host, port=broker.port,
                                                    client_id=device_id))
        self.transport.on_message = lambda topic, payload: self.models.append(
            decoder.try_decode(payload, topic))
        self.transport.subscribe(TOPICS.model, qos=1)
        self.transport.connect()
        assert self.transport.wait_connected(10)

    def newest(self):
        got = [m for m in self.models if isinstance(m, GlobalModel)]
        return got[-1] if got else None

    def train_and_send(self):
        base = self.newest()
        self.transport.publish(TOPICS.device(self.device_id, "status"),
                               encode(make_hello(self.device_id, SPEC)), qos=1)
        update = make_update(SPEC, device_id=self.device_id, base_version=base.version,
                             tensors={k: v + np.float32(0.01) for k, v in base.tensors.items()})
        assert self.transport.publish(TOPICS.device(self.device_id, "update"), encode(update), qos=1)


def _spec():
    from streamfl.models import tensor_spec
    return tensor_spec(SPEC)


def start(tmp_path, broker, run_dir="default"):
    transport = PahoTransport(MqttSettings(host=broker.host, port=broker.port,
                                           client_id="coordinator-%s" % FLEET))
    server = CoordinatorServer(config(tmp_path), transport, tmp_path / "state",
                               tmp_path / "run" if run_dir == "default" else run_dir)
    server.start()
    assert transport.wait_connected(10)
    return server


def one_process(tmp_path, broker, devices, **kw):
    """A coordinator process that gets ``UPDATES_PER_PROCESS`` updates from the devices."""
    server = start(tmp_path, broker, **kw)
    for _ in range(UPDATES_PER_PROCESS):
        version = server.core.version
        assert wait_for(lambda: all(d.newest() is not None and d.newest().version == version
                                    for d in devices), timeout_s=15)
        before = updates_handled(server.core)
        devices[0].train_and_send()
        assert wait_for(lambda: updates_handled(server.core) == before + 1, timeout_s=15)
        assert wait_for(lambda: server.persister.saved_version == server.core.version, timeout_s=10)
    return server


def die(server):
    """What a kill -9 leaves of a process in its run's record: its lines so far, no stop line, no
    summary (its threads are ended, so that they write nothing more)."""
    server._accepting = False
    server._queue.put(_STOP)
    server._worker.join()
    server.publisher.stop()
    server.transport.close()
    server.metrics.close()


def lines(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_run_restarted_twice_is_one_record(tmp_path, mqtt_broker):
    device = FakeDevice(mqtt_broker, "board1")
    try:
        t0 = time.time()
        first = one_process(tmp_path, mqtt_broker, [device])
        first.stop()                                            # a clean stop
        second = one_process(tmp_path, mqtt_broker, [device], run_dir=None)   # as systemd restarts it
        die(second)                                             # killed: no stop line, no summary
        third = one_process(tmp_path, mqtt_broker, [device], run_dir=None)
        third.stop()
        wall = time.time() - t0
    finally:
        device.transport.close()
    run_dir = tmp_path / "run"
    assert third.run_dir == run_dir and not (tmp_path / "runs").exists()   # no folder per process
    record = lines(run_dir)
    times = [r["time_s"] for r in record]
    assert all(b >= a for a, b in zip(times, times[1:])), times      # never restarts at 0
    starts = [i for i, r in enumerate(record) if r["event"] == "process_start"]
    assert len(starts) == 3 and starts[0] == 0
    for i in starts[1:]:
        assert record[i]["time_s"] > record[i - 1]["time_s"]            # strictly after the last line
    assert [record[i]["previous_ended"] for i in starts] == [None, "stopped", NO_STOP]
    assert [record[i]["resumed_version"] for i in starts] == [0, 2, 4]
    assert len({record[i]["instance"] for i in starts}) == 3
    assert [r["ended"] for r in record if r["event"] == "process_stop"] == ["stopped", "stopped"]

    summary = json.loads((run_dir / "summary.json").read_text())
    assert wall - 5 < summary["duration_s"] <= wall + 1 and summary["duration_s"] >= times[-1] - 0.01
    assert summary["restarts"] == 2
    assert [p["ended"] for p in summary["processes"]] == ["stopped", NO_STOP, "stopped"]
    (method, entry), = summary["methods"].items()
    figures = entry["runs"][0]
    assert figures["updates"] == 3 * UPDATES_PER_PROCESS
    assert figures["updates_by_outcome"]["aggregated"] == 3 * UPDATES_PER_PROCESS
    evals = [r for r in record if r["event"] == "eval"]
    assert figures["evaluations"] == len(evals) and figures["final_accuracy"] == evals[-1]["accuracy"]
    assert figures["initial_accuracy"] == evals[0]["accuracy"]
    counters = summary["counters"]
    assert counters["updates_received"] == counters["aggregated"] == counters["version"] == 6
    # The server's own counters are the processes' that said them (the killed one could not).
    assert counters["evaluations"] == sum(p["counters"]["evaluations"] for p in summary["processes"]
                                          if "counters" in p) == len(evals) - 3

    assert streamfl_main(["report", str(run_dir)]) == 0
    page = (run_dir / "report.html").read_text()
    assert "3 coordinator processes" in page and NO_STOP.split(" (")[0] in page
    assert "duration %s s" % fmt_value(summary["duration_s"]) in page
    assert "accuracy_vs_time.png" in page


def test_a_run_folder_from_before_process_lines_still_loads_and_continues(tmp_path, mqtt_broker):
    """Two processes of the old code: times restarting at 0, no process lines, the last one's
    summary; the report puts them on one axis, and a coordinator continuing the run goes on
    after them."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    t0 = time.time() - 100.0
    old = []
    for start_wall, n in ((t0, 3), (t0 + 50.0, 2)):
        for i in range(n):
            old.append({"event": "eval", "method": "fedasync", "seed": 0, "time_s": 10.0 * i,
                        "wall_s": start_wall + 10.0 * i, "version": i, "accuracy": 0.3 + 0.1 * i,
                        "loss": 1.0, "updates": i, "devices_online": 1, "energy_j": 0.0})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    (run_dir / "summary.json").write_text(json.dumps({
        "kind": "fleet", "scenario": "fleet rec", "duration_s": 10.0, "seeds": [0], "thresholds": [],
        "methods": {"fedasync": {"seeds": 1, "runs": [{"final_accuracy": 0.4, "updates": 1}]}}}))
    out = render_report(run_dir)
    page = out.read_text()
    assert "2 coordinator processes, started at 0.0, 50.0 s" in page

    # The old code's state folder (no run.json) continues the run: times go on after the record.
    start(tmp_path, mqtt_broker, run_dir=tmp_path / "scratch").stop()
    (tmp_path / "state" / RUN_FILE).unlink()
    server = start(tmp_path, mqtt_broker)
    server.stop()
    assert (tmp_path / "state" / RUN_FILE).is_file()
    record = lines(run_dir)
    new = record[len(old):]
    assert new[0]["event"] == "process_start" and new[0]["time_s"] >= 99.0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"] == 2 and summary["duration_s"] >= 99.0
    assert summary["methods"]["fedasync"]["runs"][0]["evaluations"] == len(old) + 1
    assert "3 coordinator processes: " in render_report(run_dir).read_text()


def test_a_new_run_never_appends_to_another_runs_record(tmp_path, mqtt_broker):
    """A fresh state folder over a folder holding another run's record moves that record aside (and
    the other run, started there again, moves its own back); a run moved to another --run-dir
    takes its record along."""
    first = start(tmp_path, mqtt_broker)
    first.stop()
    old_run = first.core.run_id
    (tmp_path / "state").rename(tmp_path / "state-old")
    second = start(tmp_path, mqtt_broker)                       # a new run, the same folder
    second.stop()
    run_dir = tmp_path / "run"
    assert (run_dir / ("metrics.%s.jsonl" % old_run)).is_file()
    assert (run_dir / ("metrics.%s.jsonl" % old_run)).read_text().count("process_start") == 1
    assert {r.get("run_id") for r in lines(run_dir) if r["event"] == "process_start"} == {
        second.core.run_id}
    for state, run, processes in (("state-old", old_run, 2), ("state-new", second.core.run_id, 2)):
        (tmp_path / "state").rename(tmp_path / ("state-old" if state == "state-new" else "state-new"))
        (tmp_path / state).rename(tmp_path / "state")           # swap the state folders: each run
        back = start(tmp_path, mqtt_broker)                      # gets its own record back
        back.stop()
        starts = [r for r in lines(run_dir) if r["event"] == "process_start"]
        assert {r["run_id"] for r in starts} == {run} and len(starts) == processes
    moved = start(tmp_path, mqtt_broker, run_dir=tmp_path / "elsewhere")
    moved.stop()
    record = lines(tmp_path / "elsewhere")
    assert [r["event"] for r in record].count("process_start") == 3
    again = start(tmp_path, mqtt_broker, run_dir=None)          # the state folder remembers it
    again.stop()
    assert again.run_dir == tmp_path / "elsewhere"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a default runs/<timestamp> would land here


@pytest.mark.integration
@pytest.mark.slow
def test_the_cli_restarted_without_run_dir_goes_on_in_the_runs_folder(tmp_path, mqtt_broker):
    """As systemd restarts it: the same command line, no --run-dir; the first process is killed
    (-9), the second stops on SIGTERM: one folder, one axis, the kill told by the second's start."""
    import signal
    import subprocess
    import sys

    (tmp_path / "c.yaml").write_text(
        "model: {name: mlp, in_channels: 2, window_len: 4, num_classes: 3, hidden: 4}\n"
        "monitor: {enabled: false}\npersist_interval_s: 0.0\n")
    cmd = [sys.executable, "-m", "streamfl.coordinator", "--config", "c.yaml", "--broker",
           mqtt_broker.host, "--port", str(mqtt_broker.port), "--fleet", FLEET, "--state-dir", "state"]
    device = FakeDevice(mqtt_broker, "board1")
    procs = []
    try:
        for n, sig in ((1, signal.SIGKILL), (2, signal.SIGTERM)):
            procs.append(subprocess.Popen(cmd, cwd=str(tmp_path), stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
            assert wait_for(lambda: device.newest() is not None and device.newest().version == n - 1,
                            timeout_s=30), procs[-1].poll()
            device.train_and_send()
            folders = list((tmp_path / "runs").iterdir())
            assert len(folders) == 1, folders                   # never a new folder per process
            assert wait_for(lambda: sum('"event": "update"' in line for line in (
                folders[0] / "metrics.jsonl").read_text().splitlines()) == n, timeout_s=15)
            assert wait_for(lambda: json.loads((tmp_path / "state" / "state.json").read_text())[
                "version"] == n, timeout_s=10)
            procs[-1].send_signal(sig)
            out, _ = procs[-1].communicate(timeout=30)
    finally:
        device.transport.close()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    record = lines(folders[0])
    times = [r["time_s"] for r in record]
    assert all(b >= a for a, b in zip(times, times[1:])), times
    starts = [r for r in record if r["event"] == "process_start"]
    assert [s["previous_ended"] for s in starts] == [None, NO_STOP]
    assert starts[1]["resumed_version"] == starts[1]["record_version"] == 1
    summary = json.loads((folders[0] / "summary.json").read_text())
    assert summary["methods"]["fedasync"]["runs"][0]["updates"] == 2 and summary["restarts"] == 1
    assert "2 coordinator processes" in out


def test_a_wall_clock_set_back_never_sends_the_times_backwards(tmp_path):
    """The wall clock says 10 s since the run started, the record already reaches 500 s: the new
    process's times go on after the record's last line, and its start line says so."""
    from streamfl.coordinator.run_record import open_run
    run_dir, state = tmp_path / "run", tmp_path / "state"
    run_dir.mkdir()
    state.mkdir()
    now = time.time()
    (state / RUN_FILE).write_text(json.dumps({"run_id": "r1", "run_dir": str(run_dir),
                                              "started_wall_s": now}))
    (run_dir / "metrics.jsonl").write_text(
        json.dumps({"event": "process_start", "run_id": "r1", "instance": "a", "time_s": 0.0,
                    "wall_s": now}) + "\n"
        + json.dumps({"event": "update", "outcome": "aggregated", "device": "d", "version": 7,
                      "time_s": 500.0, "wall_s": now + 500}) + "\n"
        + '{"event": "upda')                                     # the half line a kill leaves
    record = open_run(state, "r1", None, fresh=False, wall_now=now + 10.0)
    assert record.run_dir == run_dir and record.offset_s > 500.0
    assert record.time_from == "after the record's last line" and record.record_version == 7
    assert [p["ended"] for p in record.earlier] == [NO_STOP]
    line = record.start_line(instance="b", software="x", resumed_version=5, fresh=False)
    assert line["previous_ended"] == NO_STOP and line["previous_last_t_s"] == 500.0
    from streamfl.coordinator.metrics import MetricsWriter, read_metrics
    writer = MetricsWriter.in_run_dir(run_dir)
    assert writer.write(dict(line, time_s=record.offset_s))
    writer.close()
    assert read_metrics(run_dir / "metrics.jsonl")[-1]["instance"] == "b"   # not glued to the half line
