"""The intake journal (coordinator/intake.py): an update MQTT acknowledged survives a kill -9.

The journal alone (append, pending, drop, reopen, corrupt entries, the cap, disk errors), then a
``CoordinatorServer`` over the in-memory transport: bad frames are never journalled, a state-only
save drops rejected updates' entries, a clean stop leaves the journal empty, and a state folder
copied while updates were pending (what a kill leaves) is replayed into the next start, once.
The real kill -9 of the real CLI is tests/test_intake_kill.py.
"""
import json
import shutil

import numpy as np
import pytest

from factories import SPEC, UNBOUNDED_ADMISSION, make_hello, make_update
from polling import wait_for
from streamfl.coordinator.admission import AdmissionConfig
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.intake import (INTAKE_DIR, IntakeConfig, IntakeJournal, decode_entry,
                                         encode_entry, entries_on_disk, entry_name)
from streamfl.coordinator.server import CoordinatorServer
from streamfl.protocol.codec import encode
from streamfl.protocol.topics import Topics
from streamfl.protocol.transport.memory import MemoryBroker, MemoryTransport

FLEET = "t"
TOPICS = Topics(FLEET)
TOPIC = TOPICS.device("dev1", "update")


def _journal(tmp_path, covered=0, **config):
    journal = IntakeJournal(tmp_path, IntakeConfig(**config))
    return journal, journal.open(covered)


# ---- the journal --------------------------------------------------------------------------------

def test_entries_round_trip_and_a_reopen_replays_only_what_no_save_covers(tmp_path):
    journal, pending = _journal(tmp_path)
    assert pending == []
    seqs = [journal.append(TOPIC, b"frame-%d" % i) for i in range(5)]
    assert seqs == [1, 2, 3, 4, 5] and journal.pending() == seqs
    assert [p.name for p in entries_on_disk(tmp_path)] == [entry_name(s) for s in seqs]
    assert journal.read(3) == (TOPIC, b"frame-2")
    assert journal.drop_through(2) == 2 and journal.pending() == [3, 4, 5]
    assert [p.name for p in entries_on_disk(tmp_path)] == [entry_name(s) for s in (3, 4, 5)]
    journal.close()

    # A kill after a save that covered 4, before its drop: 3 and 4 go unread, 5 is replayed.
    again, pending = _journal(tmp_path, covered=4)
    assert pending == [5] and again.covered_at_open == 2
    assert again.read(5) == (TOPIC, b"frame-4")
    assert again.append(TOPIC, b"next") == 6  # numbering goes on past what was there
    c = again.counters()
    assert c["intake_pending"] == 2 and c["intake_pending_bytes"] > 0 and c["intake_corrupt"] == 0


def test_numbering_goes_on_past_a_saved_mark_even_with_an_empty_folder(tmp_path):
    journal, _ = _journal(tmp_path, covered=41)
    assert journal.append(TOPIC, b"x") == 42


def test_a_corrupt_entry_is_skipped_counted_and_moved_aside_and_a_torn_write_deleted(tmp_path):
    journal, _ = _journal(tmp_path)
    for i in range(3):
        journal.append(TOPIC, b"frame-%d" % i)
    journal.close()
    folder = tmp_path / INTAKE_DIR
    data = (folder / entry_name(2)).read_bytes()
    (folder / entry_name(2)).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # a flipped bit
    (folder / entry_name(3)).write_bytes(data[:7])                           # cut short
    (folder / (".%s.tmp" % entry_name(4))).write_bytes(b"half")             # a kill mid-write
    again, pending = _journal(tmp_path)
    assert pending == [1, 2, 3]
    assert not (folder / (".%s.tmp" % entry_name(4))).exists()
    assert again.read(1) == (TOPIC, b"frame-0")
    assert again.read(2) is None and again.read(3) is None
    assert again.counters()["intake_corrupt"] == 2
    assert (folder / (entry_name(2) + ".corrupt")).exists()
    assert again.append(TOPIC, b"on") == 4  # and it goes on


@pytest.mark.parametrize("data", [b"", b"SFLX" + bytes(20), encode_entry(TOPIC, b"abc")[:-1]])
def test_decode_entry_refuses_what_it_did_not_write(data):
    from streamfl.coordinator.intake import CorruptEntry
    with pytest.raises(CorruptEntry):
        decode_entry(data)


def test_at_the_cap_an_update_is_not_journalled_counted_and_logged_once(tmp_path, caplog):
    journal, _ = _journal(tmp_path, max_bytes=2 ** 16)
    frame = bytes(30000)
    assert journal.append(TOPIC, frame) == 1 and journal.append(TOPIC, frame) == 2
    assert journal.append(TOPIC, frame) is None and journal.append(TOPIC, frame) is None
    c = journal.counters()
    assert c["intake_not_durable"] == 2 and c["intake_journalled"] == 2 and c["intake_pending"] == 2
    full = [r for r in caplog.records if "is full" in r.getMessage() and r.levelname == "ERROR"]
    assert len(full) == 1 and "intake.max_bytes" in full[0].getMessage()
    journal.drop_through(2)
    assert journal.append(TOPIC, frame) == 3  # room again once a save covered them


def test_a_disk_error_never_raises_and_leaves_no_temp_file(tmp_path, monkeypatch):
    journal, _ = _journal(tmp_path)

    def refuse(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("streamfl.coordinator.intake.os.fsync", refuse)
    assert journal.append(TOPIC, b"frame") is None
    assert journal.counters()["intake_not_durable"] == 1 and journal.pending() == []
    assert list((tmp_path / INTAKE_DIR).iterdir()) == []


def test_durable_off_journals_nothing_but_still_replays_what_is_there(tmp_path):
    journal, _ = _journal(tmp_path)
    journal.append(TOPIC, b"kept")
    journal.close()
    off, pending = _journal(tmp_path, durable=False)
    assert pending == [1] and off.append(TOPIC, b"x") is None
    assert off.counters()["intake_not_durable"] == 0  # off is a choice, not a failure


def test_a_fresh_state_folder_moves_another_runs_entries_aside(tmp_path):
    journal, _ = _journal(tmp_path)
    journal.append(TOPIC, b"old run")
    journal.close()
    fresh = IntakeJournal(tmp_path, IntakeConfig())
    assert fresh.open(0, fresh=True) == []
    assert list(entries_on_disk(tmp_path)) == []
    assert len(list(tmp_path.glob(INTAKE_DIR + ".orphaned-*"))) == 1


def test_the_config_section_is_bounded_and_on_by_default():
    assert CoordinatorConfig().intake == IntakeConfig(durable=True, max_bytes=2 ** 30)
    with pytest.raises(ValueError, match="intake.max_bytes"):
        IntakeConfig(max_bytes=10)


# ---- the server ---------------------------------------------------------------------------------

def _server(broker, state_dir, run_dir, **kw):
    kw.setdefault("model", SPEC)
    kw.setdefault("fleet", FLEET)
    kw.setdefault("persist_interval_s", 0.0)
    kw.setdefault("admission", AdmissionConfig(**UNBOUNDED_ADMISSION))
    kw.setdefault("monitor", {"enabled": False})
    from streamfl.config import build
    config = build(CoordinatorConfig, kw, "test")
    transport = MemoryTransport(broker, "coordinator-%s" % FLEET)
    server = CoordinatorServer(config, transport, state_dir, run_dir)
    server.start()
    assert transport.wait_connected(5)
    return server


class _Device:
    def __init__(self, broker, device_id="dev1"):
        self.device_id = device_id
        self.transport = MemoryTransport(broker, device_id)
        self.transport.connect()
        assert self.transport.wait_connected(5)
        self.publish("status", encode(make_hello(device_id, SPEC)))

    def publish(self, kind, frame):
        return self.transport.publish(TOPICS.device(self.device_id, kind), frame, qos=1)

    def update(self, uid, **kw):
        self.publish("update", encode(make_update(SPEC, None, seed=len(uid), device_id=self.device_id,
                                                  update_id=uid, **kw)))


def _updates(tmp_path, run="run"):
    """The update lines the run's last process wrote (the record holds the earlier ones too)."""
    events = list(map(json.loads, (tmp_path / run / "metrics.jsonl").read_text().splitlines()))
    last = max(i for i, e in enumerate(events) if e["event"] == "process_start")
    return [e for e in events[last:] if e["event"] == "update"]


def test_bad_frames_are_never_journalled_and_a_clean_stop_empties_the_journal(tmp_path):
    broker = MemoryBroker()
    server = _server(broker, tmp_path / "state", tmp_path / "run", persist_interval_s=60.0)
    try:
        dev = _Device(broker)
        dev.publish("update", b"not a frame")
        dev.publish("update", encode(make_update(SPEC, device_id="impostor")))  # topic mismatch
        for i in range(4):
            dev.update("u%d" % i)
        assert wait_for(lambda: server.core.counters["aggregated"] == 4)
        c = server.counters()
        # The Hello and 4 updates, saved at most every 60 s.
        assert c["intake_journalled"] == 5 and c["intake_pending"] == 5
        assert c["rejected_malformed"] == 1 and c["topic_mismatch"] == 1
    finally:
        server.stop()
    assert list(entries_on_disk(tmp_path / "state")) == []
    assert json.loads((tmp_path / "state" / "state.json").read_text())["intake_seq"] == 5


def test_updates_that_only_move_the_state_are_saved_and_dropped_without_a_publish(tmp_path):
    broker = MemoryBroker()
    server = _server(broker, tmp_path / "state", tmp_path / "run")
    try:
        dev = _Device(broker)
        assert wait_for(lambda: server.counters()["publishes"] == 1)  # the retained v0
        for i in range(3):
            dev.update("bad%d" % i, class_counts={7: 8})  # a class the model has not: rejected
        assert wait_for(lambda: server.core.counters["rejected"] == 3)
        assert wait_for(lambda: server.counters()["intake_pending"] == 0)
        assert server.core.version == 0 and server.counters()["publishes"] == 1
        assert json.loads((tmp_path / "state" / "state.json").read_text())["intake_seq"] == 4  # Hello + 3
    finally:
        server.stop()


def test_what_a_kill_leaves_in_the_journal_is_replayed_once_at_the_next_start(tmp_path):
    """The state folder copied while saves wait (persist_interval_s 60): what a kill -9 then
    leaves on disk. The copy's next start hands the core every journalled update again."""
    broker = MemoryBroker()
    live = _server(broker, tmp_path / "state", tmp_path / "run", persist_interval_s=60.0)
    try:
        dev = _Device(broker)
        for i in range(6):
            dev.update("u%d" % i)
        assert wait_for(lambda: live.core.counters["aggregated"] == 6)
        model = {k: v.copy() for k, v in live.core.model.items()}
        shutil.copytree(str(tmp_path / "state"), str(tmp_path / "killed"))
    finally:
        live.stop()
        dev.transport.close()
    assert json.loads((tmp_path / "killed" / "state.json").read_text())["version"] == 0
    assert len(list(entries_on_disk(tmp_path / "killed"))) == 7  # the Hello too: admission needs it

    broker = MemoryBroker()
    again = _server(broker, tmp_path / "killed", tmp_path / "run2", persist_interval_s=60.0)
    try:
        assert wait_for(lambda: again.counters()["intake_replayed"] == 6)
        assert again.core.version == 6 and again.counters()["intake_duplicates"] == 0
        for k, v in model.items():  # the same updates in the same order: the same model
            np.testing.assert_allclose(again.core.model[k], v, rtol=1e-6)
        dev = _Device(broker)
        dev.update("u5")      # the broker redelivers one whose PUBACK the kill took: a duplicate
        dev.update("u6")
        assert wait_for(lambda: again.core.version == 7 and again.core.counters["duplicates"] == 1)
    finally:
        again.stop()
    assert [e["update_id"] for e in _updates(tmp_path, "run2") if e["aggregated"]] == [
        "u%d" % i for i in range(7)]
    assert list(entries_on_disk(tmp_path / "killed")) == []


def test_entries_a_save_covered_before_the_kill_are_not_applied_twice(tmp_path):
    """A kill between the save and the journal's drop: the saved intake_seq says they are in."""
    broker = MemoryBroker()
    live = _server(broker, tmp_path / "state", tmp_path / "run", persist_interval_s=0.0)
    live.persister.on_saved = None  # the drop never happens
    try:
        dev = _Device(broker)
        for i in range(3):
            dev.update("u%d" % i)
        assert wait_for(lambda: live.persister.saved_version == 3)
    finally:
        live.stop()
    assert len(list(entries_on_disk(tmp_path / "state"))) == 4
    again = _server(broker, tmp_path / "state", tmp_path / "run")
    try:
        assert again.core.version == 3
        assert wait_for(lambda: again.counters()["intake_duplicates"] == 4)
        assert again.counters()["intake_replayed"] == 0 and again.core.version == 3
    finally:
        again.stop()
    assert list(entries_on_disk(tmp_path / "state")) == []
