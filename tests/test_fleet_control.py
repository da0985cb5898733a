"""Fleet control end to end under the SHIPPED broker config (TLS, passwords, ACL): a real
``streamfl-coordinator`` process with a signing key, two real ``streamfl-agent`` processes that pin
its public key, and ``streamfl operator pause|resume|logs|set`` run as an operator would, on the
``operator`` account.

- ``pause`` of one board stops its rounds (the other's go on), its telemetry says paused and
  ``streamfl operator status`` shows it; the pause survives the agent's restart; ``resume``
  restarts its rounds;
- ``logs`` brings the board's recent log lines back;
- ``set round_interval_s`` answers with the old and new value and survives a restart; an
  out-of-range value and an unknown name are refused with the reason (exit 1);
- a board that stopped is reported offline, one that hangs (SIGSTOP) times out; both exit 1.
"""
import json
import signal
import sys
import time
from pathlib import Path

import pytest

from fleet import FleetRun
from streamfl.cli import main as streamfl_main
from streamfl.protocol.signing import generate_key_pair
from streamfl.sim.demo import FLEET, DemoOptions

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the repository root, for field/
from field.broker import ShippedBroker  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

A, B = "demo-01", "demo-02"


@pytest.fixture
def lab(tmp_path):
    """(run, broker, operator argv tail, coordinator key folder) with both agents training."""
    broker = ShippedBroker(tmp_path / "broker", devices=[A, B]).start()
    keys = tmp_path / "keys"
    _, _, public = generate_key_pair(keys)
    run = FleetRun(tmp_path / "fleet", broker.host, broker.port, opts=DemoOptions(seed=0, model="mlp"),
                   agent_overrides={"round_interval_s": 0.5, "telemetry_interval_s": 1.0,
                                    "predict": {"enabled": False}, "coordinator_public_key": public})

    def mqtt(account):
        return {"tls_ca": str(broker.ca_file), "username": account,
                "password_file": str(broker.password_file(account)),
                "reconnect_min_s": 0.2, "reconnect_max_s": 1.0}

    run.mqtt = mqtt
    try:
        run.start_coordinator(mqtt=mqtt("coordinator"), signing_key_file=str(keys / "coordinator-signing.key"),
                              operator={"max_per_minute": 120},
                              exclusive={"probe_password_file": str(broker.password_file("coordinator-probe"))})
        for i, device in enumerate((A, B)):
            run.start_agent(i, mqtt=mqtt(device))
        run.wait_for(lambda: {A, B} <= {u["device"] for u in run.updates()}, 60,
                     "updates from both boards")
        tail = ["--broker", broker.host, "--port", str(broker.port), "--fleet", FLEET,
                "--username", "operator", "--password-file", str(broker.password_file("operator")),
                "--tls-ca", str(broker.ca_file)]
        yield run, broker, tail, keys
    finally:
        run.stop_all()
        broker.stop()


def _operator(capsys, tail, *argv):
    """``streamfl operator ...`` in-process: (exit code, stdout, the --json answer or None)."""
    capsys.readouterr()
    code = streamfl_main(["operator"] + list(argv) + tail)
    out = capsys.readouterr().out
    assert "--json" not in argv or "{\n" in out, (code, out)
    answer = json.loads(out[out.index("{\n"):]) if "--json" in argv else None
    return code, out, answer


def _rounds(run, device, since_s):
    return [u for u in run.updates() if u["device"] == device and u["wall_s"] >= since_s]


def test_pause_logs_set_resume_offline_and_what_is_refused(lab, capsys):
    run, _, tail, _ = lab
    # pause one board: answered, and its rounds stop while the other's go on.
    code, out, _ = _operator(capsys, tail, "pause", "--devices", A, "--timeout", "10")
    assert code == 0, out
    assert A in out and "answered" in out and "paused" in out and B not in out.split("pause:")[0], out
    paused_at = time.time() + 3.0  # a round already training may still finish and send its update
    time.sleep(4.0)
    assert _rounds(run, A, paused_at) == [], "a paused board went on training"
    run.wait_for(lambda: _rounds(run, B, paused_at), 20, "rounds of the board not paused")
    # Its telemetry says so: the fleet table (streamfl operator status) shows it paused.
    run.wait_for(lambda: {r["device"]: r["paused"] for r in _operator(
        capsys, tail, "status", "--json", "--timeout", "10")[2]["result"]["devices"]} == {A: True, B: False},
        20, "status showing demo-01 paused")
    code, out, _ = _operator(capsys, tail, "status", "--timeout", "10")
    assert code == 0 and "paused" in out, out

    # set: the old and the new value; refused values say why and exit 1.
    code, out, answer = _operator(capsys, tail, "set", "--devices", B, "--param", "name=round_interval_s",
                                  "--param", "value=0.8", "--json", "--timeout", "10")
    assert code == 0, out
    assert answer["result"]["devices"][B] == {
        "state": "answered", "answer": {"name": "round_interval_s", "old": 0.5, "new": 0.8}}, answer
    code, out, _ = _operator(capsys, tail, "set", "--devices", B, "--param", "name=round_interval_s",
                             "--param", "value=-3", "--timeout", "10")
    assert code == 1 and "REFUSED" in out and "out of range" in out, out
    code, out, _ = _operator(capsys, tail, "set", "--param", "name=lr", "--param", "value=1", "--timeout", "10")
    assert code == 1 and out.count("REFUSED") == 2 and "unknown setting 'lr'" in out, out

    # logs: the board's recent lines come back.
    code, out, answer = _operator(capsys, tail, "logs", "--devices", B, "--param", "lines=50",
                                  "--json", "--timeout", "10")
    assert code == 0, out
    lines = answer["result"]["devices"][B]["answer"]["lines"]
    assert 0 < len(lines) <= 50, lines
    assert any("set round_interval_s from 0.5 to 0.8" in line for line in lines), lines
    assert not json.loads((run.agent_state(1) / "control.json").read_text())["paused"]

    # Restarts: the pause and the setting are kept.
    for i in (0, 1):
        run.agents[i].terminate(timeout_s=20)
        run.start_agent(i, mqtt=run.mqtt((A, B)[i]))
    restarted = time.time()
    run.wait_for(lambda: len(_rounds(run, B, restarted)) >= 2, 40, "B training after its restart")
    assert _rounds(run, A, restarted) == []
    assert "paused by the operator" in run.agents[0].log_text()
    assert "round_interval_s=0.8" in run.agents[1].log_text()
    code, out, answer = _operator(capsys, tail, "set", "--devices", B, "--param", "name=round_interval_s",
                                  "--param", "value=null", "--json", "--timeout", "10")
    assert code == 0 and answer["result"]["devices"][B]["answer"] == {
        "name": "round_interval_s", "old": 0.8, "new": 0.5}, answer

    # resume: A trains again.
    code, out, _ = _operator(capsys, tail, "resume", "--devices", A, "--timeout", "10")
    assert code == 0 and "running" in out, out
    resumed = time.time()
    run.wait_for(lambda: _rounds(run, A, resumed), 30, "A's rounds after resume")

    # A board that stopped is offline (not sent), one that hangs times out: both fail the command.
    run.agents[1].terminate(timeout_s=20)  # a clean exit: the registry says offline
    time.sleep(1.0)
    hung = run.agents[0]
    hung.popen.send_signal(signal.SIGSTOP)  # connected, but not answering
    try:
        code, out, answer = _operator(capsys, tail, "pause", "--json", "--timeout", "4")
        assert code == 1, out
        devices = answer["result"]["devices"]
        assert devices[B]["state"] == "offline" and "not sent" in devices[B]["reason"], devices
        assert devices[A]["state"] == "timed_out", devices
        code, out, _ = _operator(capsys, tail, "resume", "--timeout", "4")
        assert code == 1 and "TIMED OUT" in out and "OFFLINE" in out, out
    finally:
        hung.popen.send_signal(signal.SIGCONT)
    # The board that hung answers late: the coordinator drops and counts those answers.
    code, out, _ = _operator(capsys, tail, "resume", "--devices", A, "--timeout", "10")
    assert code == 0, out
    run.coordinator.terminate(timeout_s=20)
    stop = [m for m in run.metrics() if m.get("event") == "process_stop"][-1]
    assert stop["counters"]["control_reply_late"] >= 1, stop["counters"]
    assert stop["counters"]["control_replies_accepted"] >= 8, stop["counters"]
    # The run's record says what became of each command, board by board.
    done = [m for m in run.metrics() if m.get("event") == "fleet_control"]
    assert [(m["kind"], m["ok"]) for m in done][:2] == [("pause", True), ("set", True)], done
    assert done[1]["params"] == {"name": "round_interval_s", "value": 0.8} and done[1]["devices"] == {B: "answered"}
    assert done[-1]["devices"] == {A: "answered"} and done[-2]["devices"] == {A: "timed_out", B: "offline"}
