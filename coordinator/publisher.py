"""Publishes a global model only once it is durable, so a crash never makes one version name two models.

If version 61 were published and then lost in a crash (``kill -9`` before the next save), the
restarted coordinator would make a different 61 from its saved 59: two models under one name, and
agents would skip the second as "not newer". So the publisher thread does, for each version it
publishes: save the model and state (write, fsync, atomic rename: ``persistence.StateStore``), then
sign (``protocol/signing.py``), then publish retained. A restarted coordinator resumes from a
version at least as new as any it ever published, and its next one was never seen by anyone.

Aggregations faster than save + send are coalesced: the worker offers a snapshot (model message +
core state) only when the publisher has taken the previous one, so a burst of versions costs one
save and one publish of the newest. Saves are at least ``min_interval_s`` apart
(``persist_interval_s``), which bounds fsyncs on a board's SD card or a laptop's disk.

The worker also offers a snapshot of the version already published when only the state moved
(updates rejected or buffered since: the update journal, ``intake.py``, may drop their entries
once such a state is durable); that one is saved, not published again.
"""
import logging
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple

from streamfl.coordinator.persistence import Persister
from streamfl.protocol.codec import encode
from streamfl.protocol.messages import GlobalModel
from streamfl.protocol.signing import FrameSigner
from streamfl.protocol.transport.base import Transport

log = logging.getLogger(__name__)

Snapshot = Tuple[GlobalModel, Dict[str, Any]]


class DurablePublisher:
    """One thread: take the newest snapshot, save it durably, sign it, publish it retained."""

    def __init__(self, transport: Transport, topic: str, persister: Persister, signer: FrameSigner,
                 count: Callable[..., None], float16: bool = False, min_interval_s: float = 0.0,
                 on_idle: Callable[[], None] = lambda: None, model_encoding: Optional[str] = None):
        self.transport = transport
        self.topic = topic
        self.persister = persister
        self.signer = signer
        self.float16 = float16
        #: The codec's tensor encoding of each published model (``model_encoding``; None: float16
        #: or float32 by ``float16``).
        self.encoding = model_encoding or ("float16" if float16 else "float32")
        self.min_interval_s = float(min_interval_s)
        self._count = count
        self._on_idle = on_idle
        self._cond = threading.Condition()
        self._pending: Optional[Snapshot] = None
        self._republish = False
        self._exit = False
        self._last_save_s = float("-inf")
        #: The newest published (durable, signed) frame and its version, resent on reconnect.
        self._frame: Optional[bytes] = None
        self.published_version: Optional[int] = None
        self._thread = threading.Thread(target=self._loop, name="coordinator-publisher", daemon=True)

    # ---- called by other threads --------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def wants_snapshot(self) -> bool:
        """True when the previous snapshot was taken: offering a new one now costs no save twice."""
        with self._cond:
            return self._pending is None

    def offer(self, model: GlobalModel, state: Dict[str, Any]) -> None:
        """Hand over the newest version (replacing one not yet taken)."""
        with self._cond:
            self._pending = (model, state)
            self._cond.notify_all()

    def republish(self) -> None:
        """Send the newest published frame again (the broker may have lost the retained one)."""
        with self._cond:
            self._republish = True
            self._cond.notify_all()

    def stop(self) -> None:
        """Finish the snapshot in hand, then end the thread."""
        with self._cond:
            self._exit = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    # ---- the publisher thread -----------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._republish and not self._exit:
                    self._cond.wait()
                if self._pending is not None and not self._exit:  # wait out the save interval,
                    self._cond.wait_for(lambda: self._exit, timeout=max(  # taking the newest after
                        0.0, self._last_save_s + self.min_interval_s - time.monotonic()))
                snapshot, self._pending = self._pending, None
                republish, self._republish = self._republish, False
                if snapshot is None and not republish:
                    return
            try:
                if snapshot is not None:
                    self._save_and_publish(snapshot)
                    self._on_idle()
                # A republish asked for beside a snapshot is still owed: the snapshot may be a
                # state-only save of the version already out (sent while offline), which sends
                # nothing; dropping the request then left a fresh fleet without its v0.
                if republish and self._frame is not None:
                    self._send(self._frame, self.published_version)
            except Exception:
                self._count("publish_failures")
                log.exception("publishing the global model failed")

    def _save_and_publish(self, snapshot: Snapshot) -> bool:
        model, state = snapshot
        self._last_save_s = time.monotonic()
        if not self.persister.is_saved(model.version, state) and not self.persister.save(model.tensors, state):
            self._count("publish_not_durable")
            log.error("global model version %d not published: it could not be saved", model.version)
            return False
        if model.version == self.published_version:
            return True  # a state saved for the update journal's sake: the model is out already
        frame = self.signer.sign(self.topic, encode(model, encoding=self.encoding))
        previous = self.published_version
        self._frame = frame
        self.published_version = model.version
        if previous is not None and model.version > previous + 1:
            self._count("coalesced", model.version - previous - 1)
        return self._send(frame, model.version)

    def _send(self, frame: bytes, version: Optional[int]) -> bool:
        if not self.transport.connected:
            self._count("publish_offline")  # republished on the next connect
            return False
        if not self.transport.publish(self.topic, frame, qos=1, retain=True):
            self._count("publish_failures")
            log.warning("could not hand global model version %s to the transport", version)
            return False
        self._count("publishes")
        log.debug("published global model version %s (%d bytes)", version, len(frame))
        return True
