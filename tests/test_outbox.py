"""The on-disk outbox: bounded, drops the oldest, drains in order, survives restarts and full disks."""
import errno
import os

import pytest

from streamfl.agent.outbox import Outbox, atomic_write


def frames(n, size=100):
    return [bytes([i % 256]) * size + b"#%d" % i for i in range(n)]


class Sink:
    """A ``send`` that records frames and can be told to fail after some successes."""

    def __init__(self, fail_after=None):
        self.got = []
        self.fail_after = fail_after

    def __call__(self, frame):
        if self.fail_after is not None and len(self.got) >= self.fail_after:
            return False
        self.got.append(frame)
        return True


def test_drain_sends_in_order_and_deletes_sent_files(tmp_path):
    box = Outbox(tmp_path / "outbox")
    data = frames(5)
    for f in data:
        assert box.put(f)
    assert len(box) == 5 and len(list((tmp_path / "outbox").glob("*.frame"))) == 5
    sink = Sink()
    assert box.drain(sink) == 5
    assert sink.got == data
    assert len(box) == 0 and box.size_bytes == 0
    assert list((tmp_path / "outbox").glob("*.frame")) == []


def test_failed_send_stops_the_drain_and_keeps_the_frame(tmp_path):
    box = Outbox(tmp_path)
    data = frames(4)
    for f in data:
        box.put(f)
    sink = Sink(fail_after=2)
    assert box.drain(sink) == 2
    assert sink.got == data[:2] and len(box) == 2

    def boom(frame):
        raise OSError("network down")
    assert box.drain(boom) == 0 and len(box) == 2
    rest = Sink()
    box.drain(rest)
    assert rest.got == data[2:]


def test_item_bound_drops_the_oldest(tmp_path, caplog):
    box = Outbox(tmp_path, max_items=3)
    data = frames(5)
    for f in data:
        box.put(f)
    assert len(box) == 3 and box.counters["dropped"] == 2
    assert "dropped the oldest" in caplog.text
    sink = Sink()
    box.drain(sink)
    assert sink.got == data[2:]
    assert len(list(tmp_path.glob("*.frame"))) == 0


def test_byte_bound_drops_the_oldest(tmp_path):
    box = Outbox(tmp_path, max_items=100, max_bytes=350)
    data = frames(5, size=100)  # ~103 bytes each: three fit
    for f in data:
        box.put(f)
    assert len(box) == 3 and box.size_bytes <= 350
    assert box.counters["dropped"] == 2
    assert not box.put(b"x" * 400)  # alone larger than the bound
    assert box.counters["dropped"] == 3
    sink = Sink()
    box.drain(sink)
    assert sink.got == data[2:]


def test_survives_restart_and_continues_numbering(tmp_path):
    data = frames(3)
    box = Outbox(tmp_path)
    for f in data[:2]:
        box.put(f)
    (tmp_path / ".0000000000000009.frame.tmp").write_bytes(b"half written")
    again = Outbox(tmp_path)
    assert len(again) == 2
    assert not (tmp_path / ".0000000000000009.frame.tmp").exists()
    again.put(data[2])
    sink = Sink()
    again.drain(sink)
    assert sink.got == data


def test_restart_enforces_smaller_bounds(tmp_path):
    box = Outbox(tmp_path)
    data = frames(5)
    for f in data:
        box.put(f)
    smaller = Outbox(tmp_path, max_items=2)
    sink = Sink()
    smaller.drain(sink)
    assert sink.got == data[3:]


def test_corrupt_and_foreign_entries_are_moved_aside(tmp_path):
    box = Outbox(tmp_path)
    data = frames(3)
    for f in data:
        box.put(f)
    names = sorted(p.name for p in tmp_path.glob("*.frame"))
    damaged = tmp_path / names[1]
    raw = bytearray(damaged.read_bytes())
    raw[-1] ^= 0xFF
    damaged.write_bytes(bytes(raw))
    (tmp_path / "notes.txt").write_text("not a frame")
    again = Outbox(tmp_path)
    sink = Sink()
    again.drain(sink)
    assert sink.got == [data[0], data[2]]
    assert again.counters["corrupt"] == 2
    aside = sorted(p.name for p in (tmp_path / "corrupt").iterdir())
    assert aside == sorted([names[1], "notes.txt"])


def test_full_disk_keeps_frames_in_memory_in_order(tmp_path, caplog):
    full = {"on": False}

    def writer(path, data):
        if full["on"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        atomic_write(path, data)

    box = Outbox(tmp_path, writer=writer)
    data = frames(4)
    box.put(data[0])
    full["on"] = True
    box.put(data[1])
    box.put(data[2])
    full["on"] = False
    box.put(data[3])
    assert len(box) == 4
    assert box.counters["write_errors"] == 2 and box.counters["in_memory"] == 2
    assert "disk is full" in caplog.text
    assert len(list(tmp_path.glob("*.frame"))) == 2
    sink = Sink()
    box.drain(sink)
    assert sink.got == data


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_unwritable_directory_never_crashes(tmp_path):
    box = Outbox(tmp_path / "outbox")
    (tmp_path / "outbox").chmod(0o500)
    try:
        data = frames(2)
        for f in data:
            assert box.put(f)
        assert box.counters["write_errors"] == 2
        sink = Sink()
        box.drain(sink)
        assert sink.got == data
    finally:
        (tmp_path / "outbox").chmod(0o700)


def test_memory_only_outbox(tmp_path):
    box = Outbox(None, max_items=2)
    for f in frames(3):
        box.put(f)
    sink = Sink()
    box.drain(sink)
    assert sink.got == frames(3)[1:]


class Probe:
    """An acknowledgement probe the test flips, like a PUBACK arriving."""

    def __init__(self):
        self.acked = False

    def __call__(self):
        return self.acked


def test_in_flight_files_stay_until_acknowledged_and_survive_a_crash(tmp_path):
    box = Outbox(tmp_path)
    data = frames(3)
    for f in data:
        box.put(f)
    probes, got = [], []

    def send(frame):
        got.append(frame)
        probes.append(Probe())
        return probes[-1]

    assert box.drain(send) == 3 and got == data
    assert len(box) == 0 and box.in_flight == 3 and box.size_bytes == 0
    assert len(list(tmp_path.glob("*.frame"))) == 3          # handed over, not yet acknowledged
    probes[0].acked = True
    assert box.reap() == 1 and box.in_flight == 2
    assert len(list(tmp_path.glob("*.frame"))) == 2
    # The agent dies before the other two PUBACKs: the next start sends them again, in order.
    again = Outbox(tmp_path)
    assert len(again) == 2
    sink = Sink()
    again.drain(sink)
    assert sink.got == data[1:] and list(tmp_path.glob("*.frame")) == []


def test_drain_reaps_first_and_counts_acknowledgements(tmp_path):
    box = Outbox(tmp_path)
    box.put(b"one")
    probe = Probe()
    box.drain(lambda f: probe)
    probe.acked = True
    box.put(b"two")
    assert box.drain(Sink()) == 1
    assert box.in_flight == 0 and box.counters["acked"] == 1 and box.counters["sent"] == 2
    assert list(tmp_path.glob("*.frame")) == []
