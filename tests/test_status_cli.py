"""``streamfl status`` against a real fleet view server: the header and device table fitted to the
terminal, --json, --run-dir (and a stale monitor.url that names another coordinator), whose fleet
it shows, a coordinator that lost its broker, modelled watts, the token, a coordinator that is not
there, and --watch until Ctrl-C."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from fleet_snapshots import GrowingFleet, snapshot
from streamfl.cli import main
from streamfl.coordinator.monitor.config import MonitorConfig
from streamfl.coordinator.monitor.http import MonitorServer


@pytest.fixture
def serve(tmp_path):
    started: List[MonitorServer] = []

    def make(snap_fn, run_dir: Path = tmp_path, **config: Any) -> MonitorServer:
        server = MonitorServer(MonitorConfig(**dict({"port": 0}, **config)), snap_fn,
                               lambda since: {}, run_dir=run_dir)
        assert server.start()
        started.append(server)
        return server
    yield make
    for server in started:
        server.stop()


def status(capsys, monkeypatch, *argv: str, columns: int = 200):
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setenv("LINES", "50")
    code = main(["status"] + list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_header_and_every_device(serve, capsys, monkeypatch):
    snap = snapshot(5, version=10, online=4)
    server = serve(lambda: snap)
    code, out, err = status(capsys, monkeypatch, "--url", server.url)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith("fleet lab · run run-test · method fedasync+clp")
    assert lines[1] == "from %s" % server.url.rstrip("/")  # whose fleet: the URL it read
    assert lines[2].startswith("broker connected since ") and lines[2].endswith("0 disconnect(s) so far")
    assert "version 10 · 5.00 versions/s · accuracy 40.0 % (version 10) · devices 4/5 online" in lines[3]
    assert "updates: 30 received, 10 aggregated, 4 rejected (norm 1, unknown_device 3)" in lines[4]
    assert "stale 1" in lines[5] and "duplicate 1" in lines[5]
    head = next(i for i, text in enumerate(lines) if text.startswith("DEVICE"))
    titles = lines[head].split()
    for title in ("STATE", "SEEN", "VERSION", "STALE", "ROUNDS", "ACCEPTED", "REJECTED", "CPU_MHZ",
                  "GPU_MHZ", "POWER_W", "ENERGY_J", "TEMP_C", "BUFFER", "BOARD", "METHODS"):
        assert title in titles
    rows = {text.split()[0]: text.split() for text in lines[head + 1:] if text.startswith("dev-")}
    assert set(rows) == {"dev-%04d" % i for i in range(1, 6)}
    assert lines[-1].startswith("POWER_W: ~ modelled")  # the fleet's Jetson Nanos run on a model
    assert rows["dev-0001"][1] == "online" and rows["dev-0005"][1] == "offline"
    cpu = titles.index("CPU_MHZ")
    assert rows["dev-0002"][cpu] == "%.0f" % snap["devices"][1]["clocks_mhz"]["cpu"]
    assert "clp critical=yes lr=0.02" in out


def test_a_narrow_terminal_keeps_the_columns_that_matter(serve, capsys, monkeypatch):
    server = serve(lambda: snapshot(3))
    code, out, _ = status(capsys, monkeypatch, "--url", server.url, columns=64)
    assert code == 0
    assert max(len(text) for text in out.splitlines()) <= 64
    head = next(text for text in out.splitlines() if text.startswith("DEVICE"))
    assert head.split()[:4] == ["DEVICE", "STATE", "SEEN", "VERSION"]
    assert "METHODS" not in head and "SOFTWARE" not in head


def test_json_and_the_run_folder(serve, capsys, monkeypatch, tmp_path):
    snap = snapshot(2)
    (tmp_path / "run").mkdir()
    serve(lambda: snap, run_dir=tmp_path / "run")
    code, out, _ = status(capsys, monkeypatch, "--run-dir", str(tmp_path / "run"), "--json")
    assert code == 0 and {k: v for k, v in json.loads(out).items() if k != "monitor"} == snap
    code, out, err = status(capsys, monkeypatch, "--run-dir", str(tmp_path / "elsewhere"))
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1
    assert "no monitor.url in" in err


def test_a_token_the_view_needs(serve, capsys, monkeypatch, tmp_path):
    (tmp_path / "token").write_text("tok-123\n")
    (tmp_path / "wrong").write_text("tok-999\n")
    server = serve(lambda: snapshot(1), token_file=str(tmp_path / "token"))
    code, out, err = status(capsys, monkeypatch, "--url", server.url)
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1
    assert "401" in err and "--token-file" in err
    code, _, err = status(capsys, monkeypatch, "--url", server.url, "--token-file", str(tmp_path / "wrong"))
    assert code == 1 and "401" in err and "refused" in err
    code, out, _ = status(capsys, monkeypatch, "--url", server.url, "--token-file", str(tmp_path / "token"))
    assert code == 0 and "dev-0001" in out


def test_no_coordinator_is_one_line_and_exit_1(capsys, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: nobody listens there
    code, out, err = status(capsys, monkeypatch, "--url", "http://127.0.0.1:%d" % port, "--timeout", "2")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "cannot reach the coordinator's fleet view" in err
    code, _, err = status(capsys, monkeypatch, "--url", "ftp://x")
    assert code == 1 and "not an http" in err
    assert status(capsys, monkeypatch, "--watch", "0")[0] == 2


def test_watch_redraws_until_ctrl_c(serve, tmp_path):
    fleet = GrowingFleet(devices=3, join_every_s=0.3, versions_per_s=20.0)
    server = serve(fleet.snapshot)
    env = dict(os.environ, COLUMNS="160", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "streamfl.cli", "status", "--url", server.url,
                             "--watch", "0.3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, cwd=str(tmp_path))
    try:
        deadline = time.monotonic() + 20
        while fleet.calls < 4:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.1)
        time.sleep(0.4)  # the last answer is drawn
    finally:
        proc.send_signal(signal.SIGINT)
        # 60 s: in CI the full suite's last minutes run the field lab's seven torch processes
        # beside this one, and the child's exit twice took longer than 20 s there.
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    versions = [int(line.split()[1]) for line in out.decode().splitlines() if line.startswith("version ")]
    assert len(versions) >= 3 and versions == sorted(versions) and versions[-1] > versions[0]
    assert "dev-0003" in out.decode().split("fleet lab")[-1]  # the last frame has every device


def _served_by(snap: Dict[str, Any], run_dir: Path) -> Dict[str, Any]:
    return dict(snap, coordinator={"host": "lab-server", "pid": 4242, "run_dir": str(run_dir.resolve())})


def test_it_says_whose_fleet_it_shows_and_refuses_a_stale_monitor_url(serve, capsys, monkeypatch, tmp_path):
    mine, other = tmp_path / "runs" / "mine", tmp_path / "runs" / "other"
    other_snap = _served_by(snapshot(2, run_id="run-of-other"), other)
    server = serve(lambda: other_snap, run_dir=other)
    code, out, _ = status(capsys, monkeypatch, "--run-dir", str(other), columns=400)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("fleet lab · run run-of-other")
    assert lines[1] == "from %s (%s/monitor.url) · coordinator pid 4242 on lab-server, run folder %s" % (
        server.url.rstrip("/"), other, other.resolve())
    # mine's coordinator was killed: its monitor.url outlived it, and the other one listens there now.
    mine.mkdir(parents=True)
    (mine / "monitor.url").write_text(server.url + "\n")
    code, out, err = status(capsys, monkeypatch, "--run-dir", str(mine))
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1
    assert "the coordinator there is the one of run folder %s" % other.resolve() in err
    assert "the coordinator of %s is not running" % mine in err
    # --url asks no such question: it shows whoever listens there, and says who that is.
    code, out, _ = status(capsys, monkeypatch, "--url", server.url, columns=400)
    assert code == 0 and "run folder %s" % other.resolve() in out


def test_a_lost_broker_a_moved_port_and_modelled_watts_are_said(serve, capsys, monkeypatch, tmp_path):
    snap = snapshot(4, online=3)
    snap.update(broker={"connected": False, "since_wall_s": time.mktime((2026, 12, 3, 4, 5, 6, 0, 0, -1)),
                        "disconnects": 3, "connects": 3, "reason": "connection lost"},
                devices_unknown=0, power_w_by_source={"measured": 5.0, "modelled": 4.5, "unknown": 0.0},
                devices_powered_by_source={"measured": 1, "modelled": 1, "unknown": 0},
                energy_j_by_source={"measured": 300.0, "modelled": 110.0, "unknown": 0.0})
    snap["devices"][3]["last_heard"] = {"power_w": 5.5, "power_source": "measured"}
    snap["devices"][3]["power_w"] = None
    server = serve(lambda: snap)
    server.port_taken = 8470  # as if monitor.port 8470 had been taken
    code, out, _ = status(capsys, monkeypatch, "--url", server.url, columns=400)
    assert code == 0
    snap["broker"]["connects"] = 0  # never had it: not "lost", and not live either
    assert "NO BROKER YET since 04:05:06" in status(capsys, monkeypatch, "--url", server.url, columns=400)[1]
    snap["broker"]["connects"] = 3
    assert ("BROKER LOST since 04:05:06 (connection lost) · 3 disconnect(s): the coordinator hears "
            "nothing, so the devices' states are unknown") in out
    assert "its monitor.port 8470 was taken: it listens on %s" % server.url in out
    assert ("power now (online devices): 5.00 W measured (1 device(s)), 4.50 W modelled (1 device(s))"
            " · energy 410 J (measured 300, modelled 110, unknown 0)") in out
    head = next(i for i, text in enumerate(out.splitlines()) if text.startswith("DEVICE"))
    titles = out.splitlines()[head].split()
    rows = {text.split()[0]: text.split() for text in out.splitlines()[head + 1:] if text.startswith("dev-")}
    power = titles.index("POWER_W")
    assert rows["dev-0001"][power] == "~4.50"   # a Jetson Nano on its board profile's model
    assert rows["dev-0002"][power] == "5.00"    # an Orin's INA3221
    assert rows["dev-0003"][power] == "-"       # a Raspberry Pi 4 without a meter
    assert rows["dev-0004"][power] == "(5.50)"  # offline: its last watts, not a figure of now
    assert "POWER_W: ~ modelled" in out
