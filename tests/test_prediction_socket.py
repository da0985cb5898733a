"""The prediction socket with real Unix sockets: every client gets every line, a slow client is
dropped without delaying the other or the producer, the file is 0660 and removed at stop, bad
paths are clear errors, and the client example of docs/predictions.md works as printed."""
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from lifecycle import started_by
from polling import wait_until
from streamfl.agent.predict_config import PredictConfig
from streamfl.agent.prediction_socket import PredictionSocket
from streamfl.agent.predictor import Predictor
from streamfl.config import build
from streamfl.errors import ConfigError, StorageError
from streamfl.models import ModelSpec, build_model, model_to_arrays
from streamfl.sensors.config import SensorConfig
from streamfl.sensors.synthetic import synthetic_dataset
from streamfl.sensors.window import Window

DOC = Path(__file__).resolve().parents[1] / "docs" / "predictions.md"
SPEC = ModelSpec(name="mlp", hidden=16)


@pytest.fixture
def short_dir():
    """A folder with a short path: pytest's tmp_path can exceed a socket path's 107 bytes."""
    d = tempfile.mkdtemp(prefix="sfl-")
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def server(short_dir):
    yield from started_by(lambda **kwargs: PredictionSocket(short_dir / "p.sock", **kwargs))


class Reader:
    """A client reading lines on a thread of its own."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(path))
        self.lines, self.ended = [], threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.sock.makefile("rb"):
            self.lines.append(line)
        self.ended.set()

    def close(self):
        self.sock.close()


def test_two_clients_get_every_line_and_the_file_is_0660_and_removed_at_stop(server, short_dir):
    s = server()
    path = short_dir / "p.sock"
    info = os.stat(str(path))
    assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o660
    a, b = Reader(path), Reader(path)
    wait_until(lambda: s.client_count == 2, 10, "two clients")
    lines = [b'{"seq":%d}\n' % i for i in range(100)]
    for line in lines:
        s.broadcast(line)
    wait_until(lambda: len(a.lines) == 100 and len(b.lines) == 100, 10, "every line at both")
    assert a.lines == lines and b.lines == lines
    s.stop()
    assert not path.exists()
    assert a.ended.wait(5) and b.ended.wait(5)        # the apps read the end of the stream
    a.close(), b.close()


def test_a_slow_client_is_dropped_without_blocking_the_other(server, short_dir):
    s = server(client_buffer_bytes=4096)
    slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    slow.connect(str(short_dir / "p.sock"))          # connects and never reads
    fast = Reader(short_dir / "p.sock")
    wait_until(lambda: s.client_count == 2, 10, "two clients")
    line = b'{"pad":"' + b"x" * 200 + b'"}\n'
    t0 = time.perf_counter()
    worst_s = 0.0
    for i in range(500):                               # ~100 kB: far beyond what the slow one holds
        t = time.perf_counter()
        s.broadcast(line)
        worst_s = max(worst_s, time.perf_counter() - t)
        if i % 10 == 9:                                # a reader as fast as lines come (2 kB apart)
            wait_until(lambda: len(fast.lines) >= i + 1, 10, "the fast client's line %d" % i)
    wait_until(lambda: len(fast.lines) == 500, 10, "all lines at the fast client")
    assert worst_s < 0.1, "one broadcast took %.3f s" % worst_s
    assert time.perf_counter() - t0 < 10
    assert s.counters["dropped_clients"] == 1 and s.client_count == 1
    slow.settimeout(5)
    got = b""
    while True:                                        # what was already sent, then the end
        chunk = slow.recv(65536)
        if not chunk:
            break
        got += chunk
    assert 0 < len(got) < 500 * len(line) and got.endswith(b"\n")
    slow.close()
    fast.close()


def test_clients_beyond_the_limit_are_refused(server, short_dir):
    s = server(max_clients=1)
    first = Reader(short_dir / "p.sock")
    wait_until(lambda: s.client_count == 1, 10, "the first client")
    second = Reader(short_dir / "p.sock")
    assert second.ended.wait(5)                       # closed as soon as it connected
    wait_until(lambda: s.counters["refused_clients"] == 1, 5, "the refusal counted")
    s.broadcast(b"{}\n")
    wait_until(lambda: first.lines == [b"{}\n"], 5, "the first client's line")
    first.close(), second.close()


def test_a_stale_socket_is_replaced_and_a_live_one_or_another_file_refused(short_dir):
    path = short_dir / "p.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()                                      # the file stays; nobody listens
    s = PredictionSocket(path)
    s.start()
    try:
        with pytest.raises(StorageError, match="another process serves predictions"):
            PredictionSocket(path).start()
    finally:
        s.stop()
    assert not path.exists()
    path.write_text("not a socket")
    with pytest.raises(ConfigError, match="not a socket"):
        PredictionSocket(path).start()
    with pytest.raises(ConfigError, match="at most 107"):
        PredictionSocket(short_dir / ("x" * 120)).start()
    with pytest.raises(ConfigError, match="does not exist"):
        PredictionSocket(short_dir / "missing" / "p.sock").start()


def _doc_example() -> str:
    """The Python block of docs/predictions.md that talks to the socket, as printed."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    found = [b for b in blocks if "AF_UNIX" in b]
    assert len(found) == 1, "docs/predictions.md should hold one socket client example"
    code = found[0]
    assert len(code.strip().splitlines()) <= 10, "the example is no longer ten lines"
    return code


def test_the_documented_client_reads_live_predictions(short_dir):
    code = _doc_example()
    default = '"/var/lib/streamfl-agent/predictions.sock"'
    assert default in code
    path = short_dir / "p.sock"
    cfg = build(PredictConfig, dict(enabled=True, max_per_s=1000.0, socket_path=str(path),
                                    class_names=["walk", "run", "sit", "stand", "up", "down"]))
    p = Predictor(cfg, SPEC, "pi-07", socket=PredictionSocket(path))
    p.start()
    proc = subprocess.Popen([sys.executable, "-c", code.replace(default, json.dumps(str(path)))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: p.socket.client_count == 1, 10, "the example to connect")
        X, y, _ = synthetic_dataset(12, users=1, seed=1, cfg=SensorConfig())
        p.set_model(4, model_to_arrays(build_model(SPEC, seed=1)), "global", run_id="r")
        for i in range(3):
            p.offer(Window(X[i], int(y[i]), t_s=float(i)))
        assert p.wait_idle(10)
        p.set_model(5, model_to_arrays(build_model(SPEC, seed=2)), "global", run_id="r")
        for i in range(3, 6):
            p.offer(Window(X[i], int(y[i]), t_s=float(i)))
        assert p.wait_idle(10)
    finally:
        p.stop()                                       # the stream ends: the example exits
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err.decode()
    rows = [line.split() for line in out.decode().splitlines()]
    assert [r[0] for r in rows] == ["0", "1", "2", "3", "4", "5"]
    assert all(r[1] in cfg.class_names and 0 <= float(r[2]) <= 1 and r[3] == "global" for r in rows)
    assert [r[4] for r in rows] == ["4", "4", "4", "5", "5", "5"]
