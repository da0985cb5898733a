"""The lab's witness: a subscriber that records every update the broker took and every model.

It logs in with an account of its own (``field-witness``, read-only on the fleet's topics, a
block the lab adds to the deployed ACL: it is the lab's instrument, not part of a fleet) and a
persistent session (clean session off, QoS 1), so the broker queues for it whatever arrives while
it is away, across a broker restart too (mosquitto saves the queue in its persistence file).

Why it counts "acknowledged": mosquitto routes a QoS 1 PUBLISH to every matching subscription
before it sends the PUBACK, so every update the broker acknowledged to a board reaches the
witness's session. The witness also sees an update whose PUBACK was lost on the way back (the
board sends it again, with the same update id): the set it holds is a superset of the
acknowledged updates, which makes "lost" stricter, never laxer.

Frames are decoded with the real ``Decoder`` (no pickle) for the update id, the device and the
model's version and run.
"""
import logging
import ssl
import threading
import time
from typing import Dict, List, Optional, Tuple

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from streamfl.models import ModelSpec, tensor_spec
from streamfl.protocol.codec import Decoder
from streamfl.protocol.messages import GlobalModel, Update
from streamfl.protocol.topics import Topics

log = logging.getLogger(__name__)

ACCOUNT = "field-witness"
ACL_BLOCK = "\n# The field lab's witness (field/witness.py): reads the fleet, writes nothing.\n" \
            "user %s\ntopic read streamfl/v1/#\n" % ACCOUNT


class Witness:
    """Records ``updates[update_id] = (first seen monotonic s, device)`` and every global model."""

    def __init__(self, host: str, port: int, ca_file: str, password: str, fleet: str, spec: ModelSpec):
        self.topics = Topics(fleet)
        self.decoder = Decoder({spec.arch_id: tensor_spec(spec)})
        self.lock = threading.Lock()
        self.updates: Dict[str, Tuple[float, str]] = {}
        self.update_frames = 0
        self.undecodable = 0
        #: (monotonic s, version, run_id) of each global model received, in order.
        self.models: List[Tuple[float, int, str]] = []
        self.connects = 0
        self._subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=ACCOUNT,
                                  clean_session=False, protocol=mqtt.MQTTv311)
        self.client.username_pw_set(ACCOUNT, password)
        self.client.tls_set(ca_certs=str(ca_file), cert_reqs=ssl.CERT_REQUIRED)
        self.client.reconnect_delay_set(0.2, 2.0)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = lambda *a: self._subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect_async(host, port, 20)
        self.client.loop_start()
        if not self._subscribed.wait(20):
            self.close()
            raise RuntimeError("the witness could not subscribe on %s:%d" % (host, port))

    def _on_connect(self, client, userdata, flags, reason_code, properties):
        if reason_code.is_failure:
            log.warning("witness: connection refused: %s", reason_code)
            return
        self.connects += 1
        client.subscribe([(self.topics.all_devices("update"), 1), (self.topics.model, 1)])

    def _on_message(self, client, userdata, message):
        msg = self.decoder.try_decode(message.payload, source=message.topic)
        now = time.monotonic()
        with self.lock:
            if message.topic == self.topics.model:
                if isinstance(msg, GlobalModel):
                    self.models.append((now, int(msg.version), str(msg.run_id)))
                return
            self.update_frames += 1
            if isinstance(msg, Update):
                self.updates.setdefault(str(msg.update_id), (now, str(msg.device_id)))
            else:
                self.undecodable += 1

    def per_device(self, since: float = float("-inf")) -> Dict[str, int]:
        with self.lock:
            out: Dict[str, int] = {}
            for t, device in self.updates.values():
                if t >= since:
                    out[device] = out.get(device, 0) + 1
            return out

    def snapshot(self) -> Tuple[Dict[str, Tuple[float, str]], List[Tuple[float, int, str]]]:
        with self.lock:
            return dict(self.updates), list(self.models)

    def latest_version(self) -> Optional[int]:
        with self.lock:
            return self.models[-1][1] if self.models else None

    def close(self) -> None:
        try:
            self.client.disconnect()
        finally:
            self.client.loop_stop()
