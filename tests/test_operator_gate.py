"""``OperatorGate`` (coordinator/operator_gate.py) on its own, with clocks the test turns: which
operator commands pass (signature by any pinned key, a fresh stamp newer than the last one obeyed,
the rate), what is counted, and the saved stamp across a restart. The real-broker floods are
``tests/test_hostile_operator.py``."""
import json
import logging

import pytest

from streamfl.config import build
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.operator_gate import STAMP_FILE, OperatorConfig, OperatorGate
from streamfl.errors import ConfigError
from streamfl.operator import operator_payload
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import Command
from streamfl.protocol.signing import generate_key_pair
from streamfl.protocol.topics import Topics

FLEET = "gate"
TOPIC = Topics(FLEET).coordinator_command
T0 = 1_800_000_000.0  # the wall clock of the test, in seconds


class Clocks:
    def __init__(self):
        self.wall = T0
        self.mono = 100.0

    def advance(self, s: float) -> None:
        self.wall += s
        self.mono += s


def _gate(tmp_path, clocks, **settings) -> OperatorGate:
    return OperatorGate(OperatorConfig(**settings), tmp_path / STAMP_FILE,
                        wall_clock=lambda: clocks.wall, clock=lambda: clocks.mono)


def _command(at_s: float, kind: str = "new-session") -> Command:
    return Command(kind, seq=int(at_s * 1e6))


def test_stamps_must_be_new_fresh_and_present(tmp_path, caplog):
    clocks = Clocks()
    gate = _gate(tmp_path, clocks, max_age_s=60.0)
    assert gate.admit(_command(T0 - 1))
    assert not gate.admit(_command(T0 - 1))          # the same stamp again: a replay
    assert not gate.admit(_command(T0 - 2))          # older than the last obeyed
    assert not gate.admit(Command("new-session"))    # no stamp
    assert not gate.admit(_command(T0 - 61))         # too old (and older, too: replayed first)
    assert not gate.admit(_command(T0 + 61))         # from the future
    assert gate.admit(_command(T0 + 59))             # a fast clock within the window is fine
    counts = gate.counters()
    assert counts["operator_accepted"] == 2 and counts["operator_replayed"] == 3
    assert counts["operator_unstamped"] == 1 and counts["operator_future"] == 1
    clocks.advance(200)
    assert not gate.admit(_command(T0 + 60))         # newer than the last, but 140 s old now
    assert gate.counters()["operator_stale"] == 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING
                and r.name == "streamfl.coordinator.operator_gate"]
    assert any("replay" in r.getMessage() for r in warnings)


def test_at_most_max_per_minute_are_obeyed_in_any_60_s(tmp_path, caplog):
    clocks = Clocks()
    gate = _gate(tmp_path, clocks, max_per_minute=3)
    obeyed = []
    for i in range(130):                             # one command every 0.5 s for 65 s
        obeyed.append(gate.admit(_command(clocks.wall)))
        clocks.advance(0.5)
    # 3 in the first second, none for the rest of the minute, 3 more as the first ones age out
    assert [i for i, ok in enumerate(obeyed) if ok] == [0, 1, 2, 120, 121, 122]
    assert gate.counters()["operator_rate_limited"] == 124
    # warned about once per 10 s, not once per command
    limited = [r for r in caplog.records if "more than 3 a minute" in r.getMessage()
               and r.levelno == logging.WARNING]
    assert len(limited) == 7, len(limited)


def test_the_last_stamp_survives_a_restart_and_a_damaged_file_refuses_older_ones(tmp_path):
    clocks = Clocks()
    gate = _gate(tmp_path, clocks)
    assert gate.admit(_command(T0 - 5))
    assert json.loads((tmp_path / STAMP_FILE).read_text())["last_seq"] == int((T0 - 5) * 1e6)
    again = _gate(tmp_path, clocks)
    assert not again.admit(_command(T0 - 5)) and again.counters()["operator_replayed"] == 1
    assert again.admit(_command(T0 - 4))
    (tmp_path / STAMP_FILE).write_text("{not json")
    damaged = _gate(tmp_path, clocks)                # the floor is now: nothing earlier is obeyed
    assert not damaged.admit(_command(T0 - 3))
    assert damaged.admit(_command(T0 + 1))


def test_with_keys_only_commands_signed_by_one_of_them_open(tmp_path):
    keys = tmp_path / "keys"
    one, _, one_pub = generate_key_pair(keys, "one")
    two, _, two_pub = generate_key_pair(keys, "two")
    stranger, _, _ = generate_key_pair(keys, "stranger")
    clocks = Clocks()
    gate = _gate(tmp_path, clocks, public_keys=(one_pub, two_pub))
    decoder = Decoder({})
    for key in (one, two):
        frame = gate.open(TOPIC, operator_payload(FLEET, "new-session", {}, str(key)))
        assert isinstance(decoder.decode(frame), Command)
    assert gate.open(TOPIC, operator_payload(FLEET, "new-session", {}, str(stranger))) is None
    assert gate.open(TOPIC, encode(Command("new-session", seq=1))) is None
    # signed for another fleet's topic: the signature covers the topic
    assert gate.open(TOPIC, operator_payload("other", "new-session", {}, str(one))) is None
    counts = gate.counters()
    assert counts["operator_bad_signature"] == 2 and counts["operator_unsigned"] == 1


def test_without_keys_signed_and_plain_commands_open_unchecked(tmp_path):
    stranger, _, _ = generate_key_pair(tmp_path / "keys", "stranger")
    gate = _gate(tmp_path, Clocks())
    assert gate.open(TOPIC, operator_payload(FLEET, "new-session", {}, str(stranger))) is not None
    assert gate.open(TOPIC, encode(Command("new-session", seq=1))) is not None


def test_bad_operator_settings_name_the_key():
    with pytest.raises(ConfigError, match=r"operator.public_keys\[0\]"):
        build(CoordinatorConfig, {"operator": {"public_keys": ["ed25519:nope"]}}, "test")
    with pytest.raises(ConfigError, match="max_per_minute"):
        build(CoordinatorConfig, {"operator": {"max_per_minute": 0}}, "test")
