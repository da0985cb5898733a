"""A Unix domain socket that streams every prediction as a JSON line to each connected app.

One thread owns the socket and its clients (a ``selectors`` loop); ``broadcast`` only appends a
line to each client's bounded buffer and wakes that thread, so the caller never waits for a
client. A client whose buffer would overflow is disconnected (counted, logged), never waited for.
The kernel's send buffer of each client is set to the same bound, so a client that reads nothing
holds at most about twice that. The socket file is created with mode 0660 (``fchmod`` before
``bind`` where the kernel honours it, then ``chmod``; it is never wider than that at any moment)
and removed at stop if it is still the one this process made. Clients only read; what they send is
read and thrown away.
"""
import logging
import os
import selectors
import socket
import stat
import threading
from pathlib import Path
from typing import Dict, Optional

from streamfl.errors import ConfigError, StorageError

log = logging.getLogger(__name__)

#: The socket file's mode: the agent's user and group (apps join the agent's group).
SOCKET_MODE = 0o660
#: Linux's limit on a Unix socket path (sun_path is 108 bytes, one for the terminating NUL).
MAX_PATH_BYTES = 107
_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)


class _Client:
    """One connected app: its socket and the bytes not yet sent to it."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.out = bytearray()
        self.dead = False


class PredictionSocket:
    """Serves JSON lines on the Unix socket at ``path`` to up to ``max_clients`` apps."""

    def __init__(self, path: Path, client_buffer_bytes: int = 65536, max_clients: int = 16):
        self.path = Path(path)
        self.client_buffer_bytes = int(client_buffer_bytes)
        self.max_clients = int(max_clients)
        self._lock = threading.Lock()
        self._clients: Dict[int, _Client] = {}
        self._server: Optional[socket.socket] = None
        self._identity = None  # (st_dev, st_ino) of the socket file this process made
        self._selector: Optional[selectors.BaseSelector] = None
        self._wake_r = self._wake_w = -1
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.counters = {"clients": 0, "dropped_clients": 0, "refused_clients": 0, "lines": 0}

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Bind and listen (``ConfigError`` for an unusable path, ``StorageError`` if another
        process serves it), then start the serving thread."""
        path = self.path
        if len(os.fsencode(str(path))) > MAX_PATH_BYTES:
            raise ConfigError("predict.socket_path %s is %d bytes long; a Unix socket path may have "
                              "at most %d" % (path, len(os.fsencode(str(path))), MAX_PATH_BYTES))
        if not path.parent.is_dir():
            raise ConfigError("predict.socket_path %s: folder %s does not exist" % (path, path.parent))
        self._remove_stale(path)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            try:
                os.fchmod(server.fileno(), SOCKET_MODE)  # Linux: the mode bind() gives the file
            except OSError:
                pass
            server.bind(str(path))
            os.chmod(str(path), SOCKET_MODE)
            info = os.stat(str(path))
            self._identity = (info.st_dev, info.st_ino)
            server.listen(self.max_clients)
            server.setblocking(False)
        except OSError as exc:
            server.close()
            raise StorageError("cannot serve predictions on %s: %s" % (path, exc)) from exc
        self._server = server
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(server, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._serve, name="streamfl-predict-socket", daemon=True)
        self._thread.start()
        log.info("predictions served on %s (JSON lines)", path)

    @staticmethod
    def _remove_stale(path: Path) -> None:
        """Unlink a socket file nobody listens on (a crashed agent's); refuse a live one or a file
        that is not a socket."""
        try:
            mode = os.lstat(str(path)).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(mode):
            raise ConfigError("predict.socket_path %s exists and is not a socket" % path)
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            os.unlink(str(path))
            log.info("removed a stale prediction socket %s", path)
            return
        finally:
            probe.close()
        raise StorageError("another process serves predictions on %s" % path)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Disconnect every client, close the socket and remove its file (if still ours)."""
        if self._thread is None:
            return
        self._stop.set()
        with self._lock:
            self._wake()
        self._thread.join(timeout_s)
        self._thread = None

    # ---- the producer's side ------------------------------------------------------------------

    def broadcast(self, line: bytes) -> None:
        """Queue ``line`` (a JSON line ending in a newline) for every client; never blocks."""
        with self._lock:
            if self._server is None:
                return
            self.counters["lines"] += 1
            for client in self._clients.values():
                if client.dead:
                    continue
                if len(client.out) + len(line) > self.client_buffer_bytes:
                    client.dead = True
                    self.counters["dropped_clients"] += 1
                    log.warning("a prediction socket client fell %d bytes behind: disconnected",
                                len(client.out))
                    continue
                client.out += line
            self._wake()

    @property
    def client_count(self) -> int:
        """Clients connected now."""
        with self._lock:
            return sum(1 for c in self._clients.values() if not c.dead)

    def _wake(self) -> None:
        """Wake the serving thread (the caller holds the lock, so the pipe is still open)."""
        if self._wake_w < 0:
            return
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):  # the pipe is full (a wake is pending) or closed
            pass

    # ---- the serving thread -------------------------------------------------------------------

    def _serve(self) -> None:
        sel = self._selector
        assert sel is not None and self._server is not None
        try:
            while not self._stop.is_set():
                for key, mask in sel.select(timeout=1.0):
                    if key.fileobj is self._server:
                        self._accept()
                    elif key.fileobj == self._wake_r:
                        try:
                            os.read(self._wake_r, 4096)
                        except BlockingIOError:
                            pass
                    elif mask & selectors.EVENT_READ:
                        self._read(key.fd)
                self._flush()
        except Exception:
            log.exception("the prediction socket failed; apps get no more predictions")
        finally:
            self._close()

    def _accept(self) -> None:
        assert self._server is not None and self._selector is not None
        while True:
            try:
                conn, _ = self._server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("prediction socket: accept failed: %s", exc)
                return
            with self._lock:
                full = sum(1 for c in self._clients.values() if not c.dead) >= self.max_clients
            if full:
                conn.close()
                self.counters["refused_clients"] += 1
                log.warning("prediction socket: %d clients already; one more refused", self.max_clients)
                continue
            conn.setblocking(False)
            try:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.client_buffer_bytes)
            except OSError:
                pass
            with self._lock:
                self._clients[conn.fileno()] = _Client(conn)
                self.counters["clients"] += 1
            self._selector.register(conn, selectors.EVENT_READ, None)
            log.info("prediction socket: a client connected (%d now)", self.client_count)

    def _read(self, fd: int) -> None:
        client = self._clients.get(fd)
        if client is None:
            return
        try:
            data = client.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the app went away
            client.dead = True

    def _flush(self) -> None:
        """Send what each client can take now; close the dead; watch for writability where
        bytes are left."""
        assert self._selector is not None
        with self._lock:
            clients = list(self._clients.items())
        for fd, client in clients:
            if not client.dead:
                with self._lock:
                    pending = bytes(client.out)
                sent = 0
                if pending:
                    try:
                        sent = client.sock.send(pending, _NOSIGNAL)
                    except (BlockingIOError, InterruptedError):
                        sent = 0
                    except OSError:
                        client.dead = True
                with self._lock:
                    del client.out[:sent]
                    left = bool(client.out)
            if client.dead:
                self._drop(fd, client)
                continue
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if left else 0)
            self._selector.modify(client.sock, events, None)

    def _drop(self, fd: int, client: _Client) -> None:
        assert self._selector is not None
        with self._lock:
            self._clients.pop(fd, None)
        try:
            self._selector.unregister(client.sock)
        except (KeyError, ValueError):
            pass
        client.sock.close()
        log.info("prediction socket: a client left (%d now)", self.client_count)

    def _close(self) -> None:
        assert self._selector is not None and self._server is not None
        with self._lock:
            clients = list(self._clients.values())
            self._clients.clear()
        for client in clients:
            client.sock.close()
        self._selector.close()
        with self._lock:
            self._server.close()
            self._server = None
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
            self._wake_r = self._wake_w = -1
        try:
            info = os.stat(str(self.path))
            if (info.st_dev, info.st_ino) == self._identity:
                os.unlink(str(self.path))
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not remove the prediction socket %s: %s", self.path, exc)
