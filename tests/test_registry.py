"""Device registry: Hello -> online, last will -> offline, any message refreshes last seen."""
import pytest

from streamfl.coordinator.registry import DeviceRegistry
from streamfl.protocol.messages import Hello, Offline


def hello(device, online=True):
    return Hello(device_id=device, board="rpi5", software_version="0.1.0", arch_id="x",
                 buffer_capacity=100, online=online)


def test_hello_registers_online_device():
    reg = DeviceRegistry()
    reg.on_hello(hello("pi1"), now=10.0)
    assert reg.online() == ["pi1"]
    info = reg.devices()["pi1"]
    assert info.online and info.first_seen_s == 10.0 and info.last_seen_s == 10.0
    assert info.hello.board == "rpi5"


def test_last_will_marks_offline_until_next_hello():
    reg = DeviceRegistry()
    reg.on_hello(hello("pi1"), now=0.0)
    reg.on_hello(hello("pi2"), now=0.0)
    reg.on_offline(Offline(device_id="pi1", reason="lost"), now=5.0)
    assert reg.online() == ["pi2"]
    info = reg.get("pi1")
    assert not info.online and info.offline_reason == "lost"
    assert info.last_seen_s == 0.0          # the will comes from the broker, not the device
    reg.on_hello(hello("pi1"), now=9.0)
    assert reg.online() == ["pi1", "pi2"]


def test_any_message_refreshes_last_seen():
    reg = DeviceRegistry()
    reg.on_hello(hello("pi1"), now=0.0)
    reg.seen("pi1", now=42.0)
    assert reg.get("pi1").last_seen_s == 42.0
    reg.seen("pi1", now=41.0)               # out-of-order times never move it back
    assert reg.get("pi1").last_seen_s == 42.0


def test_unknown_sender_registered_online_but_offline_device_stays_offline():
    reg = DeviceRegistry()
    reg.seen("ghost", now=1.0)
    assert reg.online() == ["ghost"]
    reg.on_offline(Offline(device_id="ghost"), now=2.0)
    reg.seen("ghost", now=3.0)              # a late queued message does not resurrect it
    assert reg.online() == []
    assert reg.get("ghost").last_seen_s == 3.0


def test_hello_with_online_false_is_offline():
    reg = DeviceRegistry()
    reg.on_hello(hello("pi1", online=False), now=0.0)
    assert reg.online() == []


def test_devices_view_is_a_copy_and_availability():
    reg = DeviceRegistry()
    reg.on_hello(hello("pi1"), now=0.0)
    reg.on_offline(Offline(device_id="pi1"), now=30.0)
    reg.on_hello(hello("pi1"), now=90.0)
    snapshot = reg.devices()
    snapshot["pi1"].online = False
    assert reg.online() == ["pi1"]
    assert reg.get("pi1").availability(now=100.0) == pytest.approx(0.4)   # 40 s of 100
    assert len(reg) == 1


def test_the_online_count_follows_every_transition():
    reg = DeviceRegistry()
    events = [("hello", "a"), ("hello", "b"), ("seen", "c"), ("offline", "a"), ("offline", "a"),
              ("hello-off", "b"), ("hello", "a"), ("offline", "d"), ("seen", "d"), ("hello", "c")]
    for t, (kind, device) in enumerate(events):
        if kind == "hello":
            reg.on_hello(hello(device), now=float(t))
        elif kind == "hello-off":
            reg.on_hello(hello(device, online=False), now=float(t))
        elif kind == "offline":
            reg.on_offline(Offline(device_id=device, reason="lost"), now=float(t))
        else:
            reg.seen(device, now=float(t))
        assert reg.online_count() == len(reg.online()), (t, kind, device)
    assert reg.online_count() == 2   # a and c; b said it is offline; d was offline when seen


def test_online_ids_is_a_live_read_only_view_that_follows_every_transition():
    reg = DeviceRegistry()
    view = reg.online_ids()
    reg.on_hello(hello("pi1"), now=0.0)
    reg.on_hello(hello("pi2", online=False), now=0.0)
    reg.seen("pi3", now=1.0)                # an unknown sender is registered online
    assert set(view) == {"pi1", "pi3"} and "pi2" not in view and len(view) == reg.online_count() == 2
    reg.on_offline(Offline(device_id="pi1", reason="lost"), now=2.0)
    reg.on_hello(hello("pi2"), now=3.0)
    assert sorted(view) == reg.online() == ["pi2", "pi3"]
    with pytest.raises(AttributeError):
        view.add("pi9")                     # no way to change the registry through it
