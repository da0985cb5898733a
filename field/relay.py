"""A TCP relay that delays each direction by a fixed time: link delay where the kernel has no netem.

One listener per board on the hub's address; every chunk read from one side is written to the
other ``delay_ms`` after it arrived, in order (a link's latency, not a throttle: the rate is
``tbf``'s job). It runs on its own thread with an asyncio loop; ``stop()`` closes everything.
"""
import asyncio
import logging
import threading
import time
from typing import Dict, Optional, Tuple

log = logging.getLogger(__name__)


class DelayRelay:
    """``listen(name, host, port, delay_ms)`` forwards to ``target`` with that one-way delay."""

    def __init__(self, target: Tuple[str, int]):
        self.target = target
        self.loop = asyncio.new_event_loop()
        self._servers: Dict[str, asyncio.AbstractServer] = {}
        self._thread = threading.Thread(target=self.loop.run_forever, name="field-relay", daemon=True)
        self._thread.start()
        self.connections = 0

    def listen(self, name: str, host: str, port: int, delay_ms: int) -> None:
        async def start():
            server = await asyncio.start_server(
                lambda r, w: self._pair(r, w, delay_ms / 1000.0), host, port)
            self._servers[name] = server
        asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)

    async def _pair(self, reader, writer, delay_s: float) -> None:
        self.connections += 1
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pump(reader, up_w, delay_s), self._pump(up_r, writer, delay_s),
                             return_exceptions=True)

    async def _pump(self, reader, writer, delay_s: float) -> None:
        queue: "asyncio.Queue[Tuple[float, Optional[bytes]]]" = asyncio.Queue()

        async def send():
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if data is None:
                    break
                writer.write(data)
                await writer.drain()
            writer.close()

        sender = asyncio.ensure_future(send())
        try:
            while True:
                data = await reader.read(65536)
                await queue.put((time.monotonic() + delay_s, data or None))
                if not data:
                    break
        except (OSError, asyncio.CancelledError):
            await queue.put((0.0, None))
        try:
            await sender
        except (OSError, ConnectionError):
            pass

    def stop(self) -> None:
        async def close():
            for server in self._servers.values():
                server.close()
            for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                task.cancel()
        try:
            asyncio.run_coroutine_threadsafe(close(), self.loop).result(5)
        except Exception:  # noqa: BLE001 - best effort at shutdown
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
