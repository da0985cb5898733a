"""sd_notify over a real AF_UNIX datagram socket, as systemd's would receive it."""
import os
import socket
import uuid

import pytest

from streamfl.notify import SystemdNotifier


@pytest.fixture
def listener(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify.sock")
    sock.bind(path)
    sock.settimeout(2.0)
    yield path, sock
    sock.close()


def test_ready_status_watchdog_stopping_reach_the_socket(listener):
    path, sock = listener
    notifier = SystemdNotifier.from_environ({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "4000000"})
    assert notifier.enabled
    assert notifier.watchdog_interval_s == 2.0
    assert notifier.ready()
    assert sock.recv(256) == b"READY=1"
    assert notifier.status("training round 3\nok")
    assert sock.recv(256) == b"STATUS=training round 3 ok"
    assert notifier.watchdog()
    assert sock.recv(256) == b"WATCHDOG=1"
    assert notifier.stopping()
    assert sock.recv(256) == b"STOPPING=1"
    assert notifier.sent == 4


def test_abstract_namespace_socket():
    name = "streamfl-test-%s" % uuid.uuid4().hex
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(2.0)
    try:
        assert SystemdNotifier("@" + name).ready()
        assert sock.recv(64) == b"READY=1"
    finally:
        sock.close()


def test_no_socket_is_a_noop():
    notifier = SystemdNotifier.from_environ({})
    assert not notifier.enabled
    assert notifier.watchdog_interval_s is None
    assert not notifier.ready() and not notifier.watchdog() and not notifier.stopping()


def test_watchdog_off_without_usec_or_for_another_pid(listener):
    path, sock = listener
    assert SystemdNotifier(path).watchdog_interval_s is None
    assert not SystemdNotifier(path).watchdog()
    other = SystemdNotifier.from_environ({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000",
                                          "WATCHDOG_PID": str(os.getpid() + 1)})
    assert other.watchdog_interval_s is None
    mine = SystemdNotifier.from_environ({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000",
                                         "WATCHDOG_PID": str(os.getpid())})
    assert mine.watchdog_interval_s == 0.5


def test_missing_socket_is_counted_not_raised(tmp_path):
    notifier = SystemdNotifier(str(tmp_path / "absent.sock"))
    assert not notifier.ready()
    assert notifier.errors == 1
