"""Windows published to the device's ``sensor`` topic by another process (a phone, a gateway, a test).

The transport's network thread decodes and queues; the consumer pulls from ``windows()``. The
queue is bounded so a fast publisher cannot exhaust a Pi's memory: when full, the oldest window
is dropped and counted. Bad payloads are logged, counted in ``rejected`` and never raise.
"""
import collections
import logging
import threading
from typing import Iterator, Optional

from streamfl.errors import SensorError
from streamfl.protocol.transport.base import Transport
from streamfl.sensors.base import SensorSource
from streamfl.sensors.config import SensorConfig
from streamfl.sensors.encoding import decode_window
from streamfl.sensors.window import Window

log = logging.getLogger(__name__)


class MqttSensorSource(SensorSource):
    """Decoded windows from ``topic`` on ``transport``, at the publisher's pace.

    The source chains itself in front of the transport's existing ``on_message`` (messages on
    other topics go on to it). An owner that replaces ``transport.on_message`` afterwards must
    route this topic to ``source.on_message`` itself.
    """

    def __init__(self, transport: Transport, topic: str, cfg: Optional[SensorConfig] = None,
                 clock=None, sleep=None, qos: int = 1, attach: bool = True):
        cfg = cfg or SensorConfig(kind="mqtt")
        super().__init__(0.0, clock, sleep)  # paced by whoever publishes
        self.cfg = cfg
        self.topic = topic
        self.transport = transport
        self._queue = collections.deque()
        self._cond = threading.Condition()
        #: Windows accepted from the network / dropped because the queue was full.
        self.received = 0
        self.dropped = 0
        #: Payloads refused, and why the latest one was.
        self.rejected = 0
        self.last_rejection = ""
        if attach:
            previous = transport.on_message

            def route(topic_name: str, payload: bytes) -> None:
                if topic_name == self.topic:
                    self.on_message(topic_name, payload)
                elif previous is not None:
                    previous(topic_name, payload)

            transport.on_message = route
        transport.subscribe(topic, qos=qos)

    @property
    def queued(self) -> int:
        """Windows waiting for the consumer."""
        with self._cond:
            return len(self._queue)

    def on_message(self, topic: str, payload: bytes) -> None:
        """Decode and queue one payload; called from the transport thread, never raises."""
        try:
            window = decode_window(payload, default_t_s=self.clock.now(),
                                   expected_shape=(self.cfg.window_len, self.cfg.channels),
                                   num_classes=self.cfg.num_classes)
        except SensorError as exc:
            self.rejected += 1
            self.last_rejection = str(exc)
            level = logging.WARNING if self.rejected == 1 or self.rejected % 100 == 0 else logging.DEBUG
            log.log(level, "rejected sensor window on %s (%d bytes, %d rejected so far): %s",
                    topic, len(payload), self.rejected, exc)
            return
        except Exception:  # a decoder bug must not kill the network thread
            self.rejected += 1
            self.last_rejection = "internal error"
            log.exception("could not decode sensor window on %s", topic)
            return
        with self._cond:
            if len(self._queue) >= self.cfg.queue_len:
                self._queue.popleft()
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 100 == 0:
                    log.warning("sensor queue full (%d windows): dropped %d oldest so far",
                                self.cfg.queue_len, self.dropped)
            self._queue.append(window)
            self.received += 1
            self._cond.notify()

    def _on_close(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _generate(self) -> Iterator[Window]:
        while True:
            with self._cond:
                while not self._queue and not self.closed:
                    self._cond.wait(1.0)
                if self.closed:
                    return
                window = self._queue.popleft()
            yield window
