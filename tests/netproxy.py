"""A loopback TCP forwarder that tests can cut and restore, to take one client off the network."""
import select
import socket
import threading
from typing import List, Tuple


class CuttableProxy:
    """Forwards ``127.0.0.1:port`` to ``target``; ``cut()`` drops every connection and refuses new ones."""

    def __init__(self, target_host: str, target_port: int):
        self.target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self._pairs: List[Tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._up = threading.Event()
        self._up.set()
        self._thread = threading.Thread(target=self._accept_loop, name="proxy-accept", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            if not self._up.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=2)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        socks = [a, b]
        try:
            while not self._stop.is_set():
                readable, _, _ = select.select(socks, [], [], 0.1)
                for s in readable:
                    data = s.recv(65536)
                    if not data:
                        return
                    (b if s is a else a).sendall(data)
        except (OSError, ValueError):
            # ValueError: cut() or stop() closed a socket from another thread (its fd is now -1).
            return
        finally:
            for s in socks:
                try:
                    s.close()
                except OSError:
                    pass

    def cut(self) -> None:
        """Drop all forwarded connections (like a pulled cable) and refuse new ones until restore()."""
        self._up.clear()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def restore(self) -> None:
        self._up.set()

    def close(self) -> None:
        self.cut()
        self._stop.set()
        self._listener.close()
        self._thread.join(2)
