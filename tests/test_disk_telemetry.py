"""A board's free disk and temperature, end to end: the agent's telemetry carries its state
folder's free and total bytes and its thermal zones (a fake board's sysfs tree), the wire rejects
negative or non-integer byte counts, the coordinator's fleet table keeps only plausible ones (a
size within ``fleet_view.max_disk_bytes``, no more free than the size) and /metrics exports them as
gauges while the board is online, none once it is offline."""
import shutil

import pytest

from factories import make_hello
from polling import wait_until
from streamfl.agent.disk import state_disk
from streamfl.coordinator.fleet import FleetTable, FleetTableConfig
from streamfl.coordinator.registry import DeviceRegistry
from streamfl.errors import ProtocolError
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import Offline, Telemetry
from streamfl.protocol.transport.memory import MemoryBroker
from test_agent_daemon import DEV, FakeCoordinator, Running
from test_agent_dvfs import board_dvfs

GIB = 2 ** 30


def _scraped(body: bytes):
    """``(metric, device) -> value`` of a /metrics body, as Prometheus' parser reads it."""
    from prometheus_client.parser import text_string_to_metric_families
    return {(s.name, s.labels.get("device")): s.value
            for f in text_string_to_metric_families(body.decode()) for s in f.samples}


def test_state_disk_is_the_filesystem_of_the_folder_or_nothing(tmp_path):
    disk = state_disk(tmp_path)
    usage = shutil.disk_usage(str(tmp_path))
    assert disk["state_disk_size_bytes"] == usage.total
    assert 0 < disk["state_disk_free_bytes"] <= usage.total
    assert abs(disk["state_disk_free_bytes"] - usage.free) < 64 * 2 ** 20  # other writers meanwhile
    assert state_disk(tmp_path / "not-there") == {"state_disk_free_bytes": None,
                                                  "state_disk_size_bytes": None}


def test_a_running_agent_reports_its_state_folder_s_disk_and_its_board_s_temperatures(tmp_path):
    dvfs, _root = board_dvfs(tmp_path)
    broker = MemoryBroker()
    coord = FakeCoordinator(broker)
    coord.publish_model(1)
    with Running(broker, tmp_path / "state", agent_dvfs=dvfs, telemetry_interval_s=0.1):
        wait_until(lambda: any(t.state_disk_size_bytes for t in coord.telemetry), what="telemetry")
    tel = [t for t in coord.telemetry if t.state_disk_size_bytes][-1]
    usage = shutil.disk_usage(str(tmp_path / "state"))
    assert tel.state_disk_size_bytes == usage.total
    assert 0 < tel.state_disk_free_bytes <= usage.total
    assert tel.temperatures_c and all(0 < c < 150 for c in tel.temperatures_c.values())

    # What the coordinator makes of it: the gauges while the board is online, none once it is not.
    pytest.importorskip("prometheus_client")
    from streamfl.coordinator.monitor.prometheus import render
    table, registry = FleetTable(FleetTableConfig(), "lab", "fedasync", "fedasync", []), DeviceRegistry()
    registry.on_hello(make_hello(DEV), 0.0)
    table.on_message(make_hello(DEV), 0.0)
    table.on_message(tel, 1.0)
    values = _scraped(render(table.refresh(2.0, 2.0, 1, registry.devices(), {}), 100))
    assert values[("streamfl_device_disk_free_bytes", DEV)] == tel.state_disk_free_bytes
    assert values[("streamfl_device_disk_size_bytes", DEV)] == tel.state_disk_size_bytes
    assert values[("streamfl_device_temperature_celsius", DEV)] == max(tel.temperatures_c.values())
    registry.on_offline(Offline(DEV, reason="stopped"), 3.0)
    table.on_message(Offline(DEV, reason="stopped"), 3.0)
    snap = table.refresh(4.0, 4.0, 1, registry.devices(), {})
    values = _scraped(render(snap, 100))
    assert values[("streamfl_device_online", DEV)] == 0
    for gone in ("streamfl_device_disk_free_bytes", "streamfl_device_disk_size_bytes",
                 "streamfl_device_temperature_celsius"):
        assert (gone, DEV) not in values
    row = snap["devices"][0]
    assert row["disk_free_bytes"] is None
    assert row["last_heard"]["disk_free_bytes"] == tel.state_disk_free_bytes


@pytest.mark.parametrize("value", [-1, 1.5, True, "12"])
def test_the_wire_takes_only_non_negative_integer_byte_counts(value):
    frame = bytearray(encode(Telemetry("pi-1", 1.0, 0, 10, state_disk_free_bytes=7, state_disk_size_bytes=9)))
    good = Decoder({}).decode(bytes(frame))
    assert (good.state_disk_free_bytes, good.state_disk_size_bytes) == (7, 9)
    forged = bytes(frame).replace(b'"state_disk_free_bytes":7', b'"state_disk_free_bytes":'
                                  + (b'"12"' if value == "12" else str(value).lower().encode()))
    assert forged != bytes(frame)
    with pytest.raises(ProtocolError):
        Decoder({}).decode(forged)


def _row(**disk):
    table = FleetTable(FleetTableConfig(max_disk_bytes=float(64 * GIB)), "lab", "fedasync", "fedasync", [])
    table.on_message(Telemetry("pi-1", 1.0, 0, 10, **disk), 1.0)
    snap = table.refresh(2.0, 2.0, 1, {"pi-1": type("Info", (), {"online": True, "last_seen_s": 2.0})()}, {})
    row = snap["devices"][0]
    return (row["disk_free_bytes"], row["disk_size_bytes"]), snap["implausible"]


@pytest.mark.parametrize("disk, shown, implausible", [
    ({"state_disk_free_bytes": 3 * GIB, "state_disk_size_bytes": 32 * GIB}, (3 * GIB, 32 * GIB), {}),
    ({"state_disk_free_bytes": 0, "state_disk_size_bytes": 32 * GIB}, (0, 32 * GIB), {}),
    ({}, (None, None), {}),                                                    # an older agent
    ({"state_disk_free_bytes": 33 * GIB, "state_disk_size_bytes": 32 * GIB}, (None, None), {"disk_bytes": 1}),
    ({"state_disk_free_bytes": GIB, "state_disk_size_bytes": 65 * GIB}, (None, None), {"disk_bytes": 1}),
    ({"state_disk_free_bytes": GIB, "state_disk_size_bytes": 0}, (None, None), {"disk_bytes": 1}),
    ({"state_disk_free_bytes": GIB}, (None, None), {}),                        # half a report
])
def test_the_fleet_table_keeps_only_a_plausible_disk(disk, shown, implausible):
    assert _row(**disk) == (shown, implausible)
