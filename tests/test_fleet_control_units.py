"""Fleet control's parts without a broker: the board's state file and answers, its log ring, the
coordinator's relay (targets, waits, the shapes of answers it keeps) and what the operator sees."""
import json
import logging

import pytest

from streamfl.agent.config import load_agent_config
from streamfl.agent.fleet_control import CONTROL_FILE, FleetControl, check_setting
from streamfl.agent.log_ring import LogRing
from streamfl.coordinator.fleet_control import FleetControlConfig, FleetRelay, targets_of
from streamfl.errors import ConfigError, ProtocolError
from streamfl.fleet_control_view import render_boards
from streamfl.protocol.codec import encode
from streamfl.protocol.control import MAX_REPLY_BYTES, check_result
from streamfl.protocol.messages import Command, DeviceReply
from streamfl.status import state


def _config(**over):
    return load_agent_config(None, dict({"device_id": "pi-01"}, **over))


def _set(control, name, value, seq=1):
    return control.handle(Command("set", {"name": name, "value": value}, run_id="r", seq=seq), "pi-01")


def test_settings_are_checked_like_the_yaml():
    cfg = _config()
    assert check_setting(cfg, "round_interval_s", 2).round_interval_s == 2.0
    for name, value, why in (("round_interval_s", 0, "out of range"), ("round_interval_s", True, "number"),
                             ("round_interval_s", float("nan"), "finite"), ("checkpoint_every_rounds", 1.5,
                                                                          "integer"),
                             ("lr", 0.1, "unknown setting 'lr'"), ("telemetry_interval_s", "5", "number")):
        with pytest.raises(ConfigError, match=why):
            check_setting(cfg, name, value)


def test_pause_and_settings_survive_a_restart_and_a_reset_goes_back_to_the_yaml(tmp_path):
    cfg = _config()
    control = FleetControl(tmp_path, cfg)
    reply, changed = _set(control, "round_interval_s", 7.5)
    assert reply.ok and changed and reply.result == {"name": "round_interval_s", "old": 5.0, "new": 7.5}
    reply, _ = control.handle(Command("pause", run_id="r", seq=2), "pi-01")
    assert reply.ok and reply.result == {"paused": True, "was_paused": False} and reply.seq == 2
    again = FleetControl(tmp_path, cfg)
    assert again.paused and again.config.round_interval_s == 7.5
    reply, changed = _set(again, "round_interval_s", None)
    assert reply.ok and changed and reply.result == {"name": "round_interval_s", "old": 7.5, "new": 5.0}
    assert json.loads((tmp_path / CONTROL_FILE).read_text())["settings"] == {}
    refused, changed = _set(again, "round_interval_s", -1)
    assert not refused.ok and not changed and "out of range" in refused.error and refused.result == {}


def test_a_damaged_or_hand_edited_state_file_is_not_believed(tmp_path, caplog):
    (tmp_path / CONTROL_FILE).write_text(json.dumps({"format": 1, "paused": "yes"}))
    assert not FleetControl(tmp_path, _config()).paused
    (tmp_path / CONTROL_FILE).write_text(json.dumps(
        {"format": 1, "paused": False, "settings": {"round_interval_s": -4, "lr": 1.0,
                                                    "telemetry_interval_s": 3}}))
    control = FleetControl(tmp_path, _config())
    assert control.settings == {"telemetry_interval_s": 3} and control.config.round_interval_s == 5.0
    assert "ignoring the setting" in caplog.text


def test_the_log_ring_is_bounded_and_a_logs_answer_fits_the_reply_bound(tmp_path):
    ring = LogRing(max_lines=200, max_chars=300)
    logger = logging.getLogger("streamfl.test.ring")
    logger.addHandler(ring)
    logger.setLevel(logging.INFO)
    try:
        for i in range(500):
            logger.info("line %d %s", i, "\u00e9\x1b" * 400)  # each escapes to 6 bytes in JSON
    finally:
        logger.removeHandler(ring)
    lines = ring.lines(1000)
    assert len(lines) == 200 and all(len(line) <= 300 for line in lines) and "line 499" in lines[-1]
    control = FleetControl(tmp_path, _config(), ring)
    reply, _ = control.handle(Command("logs", {"lines": 150}, run_id="r", seq=3), "pi-01",
                              encoded_size=lambda r: len(encode(r)))
    assert reply.ok and len(encode(reply)) <= MAX_REPLY_BYTES
    kept = reply.result["lines"]
    assert 0 < len(kept) < 150 and reply.result["dropped_lines"] == 150 - len(kept)
    assert kept[-1] == lines[-1]  # the newest are kept
    bad, _ = control.handle(Command("logs", {"lines": -1}, run_id="r", seq=4), "pi-01")
    assert not bad.ok and "count" in bad.error


class _Info:
    def __init__(self, online, reason=""):
        self.online, self.offline_reason = online, reason


def test_the_relay_targets_online_boards_and_reports_the_others():
    relay = FleetRelay(FleetControlConfig(wait_s=2.0), clock=lambda: 0.0)
    devices = {"a": _Info(True), "b": _Info(False, "lost"), "c": _Info(True)}
    op, sends, error = relay.begin(Command("pause", {"devices": "a,b,zz"}, seq=9), devices, 0.0)
    assert error == "" and [d for d, _ in sends] == ["a"]
    assert op.targets["b"] == {"state": "offline", "reason": "offline (lost): not sent"}
    assert op.targets["zz"]["state"] == "offline"
    relay.expect(op, "a", 101)
    assert relay.finished(1.0) == []  # still waiting for a
    relay.on_reply(DeviceReply("a", "pause", 101, True, result={"paused": True, "was_paused": False}))
    (answer,) = relay.finished(1.0)
    assert not answer.ok and answer.seq == 9 and "2 of 3 board(s) did not answer" in answer.error
    assert answer.result["devices"]["a"] == {"state": "answered", "answer": {"paused": True, "was_paused": False}}
    # Everyone, with the wait over: a board that did not answer timed out.
    op, sends, _ = relay.begin(Command("resume", {}, seq=10), devices, 5.0)
    assert [d for d, _ in sends] == ["a", "c"]
    relay.expect(op, "a", 102)
    relay.expect(op, "c", 103)
    relay.not_sent(op, "c", 103)
    (answer,) = relay.finished(5.0 + 2.0)
    assert answer.result["devices"]["a"]["state"] == "timed_out"
    assert "broker is unreachable" in answer.result["devices"]["c"]["reason"]
    late = DeviceReply("a", "resume", 102, True, result={})
    assert not relay.expects(late) and relay.counters()["control_reply_late"] == 1
    assert not relay.expects(DeviceReply("a", "resume", 103, True)) and relay.counters()[
        "control_reply_unsolicited"] == 1


@pytest.mark.parametrize("params, why", [
    ({"devices": []}, "at least one board"), ({"devices": "a/b"}, "not a device id"),
    ({"wait_s": -1}, "wait_s"), ({"wait_s": True}, "wait_s")])
def test_the_relay_refuses_parameters_that_make_no_sense(params, why):
    relay = FleetRelay(FleetControlConfig(), clock=lambda: 0.0)
    op, sends, error = relay.begin(Command("pause", params), {"a": _Info(True)}, 0.0)
    assert op is None and sends == [] and why in error


def test_set_needs_a_name_and_logs_a_bounded_number_of_boards():
    relay = FleetRelay(FleetControlConfig(max_log_boards=2), clock=lambda: 0.0)
    devices = {d: _Info(True) for d in "abc"}
    assert "set needs name" in relay.begin(Command("set", {"value": 1}), devices, 0.0)[2]
    assert "at most 2 boards" in relay.begin(Command("logs", {}), devices, 0.0)[2]
    op, sends, error = relay.begin(Command("set", {"name": "round_interval_s", "value": 3, "wait_s": 1,
                                                  "devices": ["a"]}), devices, 0.0)
    assert sends[0][1].params == {"name": "round_interval_s", "value": 3}  # only the board's part
    assert targets_of({"devices": ["a", "a", "b"]}) == ["a", "b"] and targets_of({}) is None


@pytest.mark.parametrize("kind, result", [
    ("pause", {"paused": 1}), ("logs", {"lines": ["x" * 301]}), ("logs", {"lines": ["a"] * 201}),
    ("logs", {"lines": [{"a": 1}]}), ("set", {"name": "x", "old": "5"}), ("set", {"name": "x", "new": True}),
    ("resume", {"paused": False, "extra": 1}), ("skip", {})])
def test_answers_of_the_wrong_shape_are_refused(kind, result):
    with pytest.raises(ProtocolError):
        check_result(kind, result)


def test_what_the_operator_sees_escapes_what_boards_wrote():
    text = render_boards("logs", {"devices": {
        "a": {"state": "answered", "answer": {"lines": ["\x1b[31mred\x1b[0m"], "dropped_lines": 0}},
        "b": {"state": "refused", "reason": "no\nway"}, "c": {"state": "timed_out", "reason": "no answer"}},
        "states": {"answered": 1, "refused": 1, "timed_out": 1}})
    assert "\x1b" not in text and "\\x1b[31mred" in text and "no\\x0away" in text
    assert "TIMED OUT" in text and "REFUSED" in text
    assert state({"state": "online", "paused": True}) == "paused"
    assert state({"state": "offline", "paused": True}) == "offline"


def test_devices_is_refused_for_a_kind_that_does_not_go_to_boards(capsys):
    from streamfl.cli import main
    from streamfl.sim.brokers import free_port
    code = main(["operator", "new-session", "--devices", "pi-01", "--port", str(free_port()),
                 "--timeout", "1"])
    assert code == 2 and "--devices is for pause, resume, logs, set" in capsys.readouterr().err
