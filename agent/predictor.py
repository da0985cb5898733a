"""Predictions on live windows: the board's current model on incoming windows, each published.

Public API (the daemon's and the benchmark's)::

    p = Predictor(config, spec, device_id, class_names=(), publish=[callback], socket=None)
    p.start()                                   # the prediction thread (and the socket, if any)
    p.set_model(version, tensors, "global", run_id="r1")   # or "local", round_index=n
    p.offer(window)                             # from the ingest path: never blocks, False if skipped
    p.stats(); p.telemetry(now)                 # counters; the Telemetry message's fields
    p.wait_idle(timeout_s)                      # every offered window handled (tests, benchmarks)
    p.stop()

``make_predictor(config, state_dir, transport, source)`` builds the daemon's (a ``NullPredictor``
when ``predict.enabled`` is false) with its MQTT and socket outputs.

Prediction never delays ingest or training: ``offer`` is a token bucket (``max_per_s``) and an
append to a bounded deque under a lock held for microseconds (a full queue drops its oldest
window, counted); one thread of its own drains the queue in batches, runs its own copy of the
model (a module built once from the spec, deep-copied and loaded for each new version, in eval
mode, swapped by that thread between batches, so a model never changes in the middle of a
batch) under ``torch.inference_mode`` (``no_grad`` on torch < 1.9), and hands each line to the
outputs. ``set_model`` only records the newest tensors: the module is built on the prediction
thread, never on the MQTT or training thread. Torch's thread count is the agent's
``torch_threads`` (process-wide, set by the core); the prediction thread does not change it.

Every prediction is one JSON object of schema 1 (docs/predictions.md): ``schema``, ``device_id``,
``seq``, ``time_s``, ``window_t_s``, ``class``, ``name``, ``confidence``, ``top_k``, ``label``
and ``model`` (``kind``, ``version``, ``round``, ``run_id``).
"""
import copy
import json
import logging
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from streamfl.agent.predict_config import MODEL_KINDS, PredictConfig
from streamfl.agent.prediction_socket import PredictionSocket
from streamfl.errors import StreamflError
from streamfl.models import ModelSpec, arrays_to_model, build_model
from streamfl.sensors.window import UNLABELLED, Window

log = logging.getLogger(__name__)

#: The JSON schema of a prediction; bumped only on an incompatible change.
SCHEMA_VERSION = 1
_INFERENCE = getattr(torch, "inference_mode", torch.no_grad)
_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False)

Publish = Callable[[bytes], Any]


def class_names_for(config: PredictConfig, num_classes: int, dataset_classes: Sequence[str] = ()) -> Tuple[str, ...]:
    """Each class's name: ``predict.class_names``, else a replay dataset's ``classes`` (when it
    names exactly the model's classes), else ``class_<index>``."""
    if config.class_names:
        if len(config.class_names) != num_classes:
            raise ValueError("predict.class_names has %d names, the model has %d classes"
                             % (len(config.class_names), num_classes))
        return tuple(config.class_names)
    if len(dataset_classes) == num_classes:
        return tuple(str(c) for c in dataset_classes)
    return tuple("class_%d" % k for k in range(num_classes))


class _Bucket:
    """A token bucket of ``rate`` per second holding at most max(1, rate) tokens."""

    def __init__(self, rate_per_s: float, now: float):
        self.rate = float(rate_per_s)
        self.capacity = max(1.0, self.rate)
        self.tokens = self.capacity
        self.last = now

    def take(self, now: float) -> bool:
        self.tokens = min(self.capacity, self.tokens + max(0.0, now - self.last) * self.rate)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class Predictor:
    """Predicts on offered windows on a thread of its own and publishes each prediction.

    ``class_names`` name the classes where ``config.class_names`` does not (``class_names_for``);
    each of ``publish`` gets every prediction's JSON bytes (a failing one is counted, logged,
    and never stops the others); ``socket`` gets each as a line."""

    def __init__(self, config: PredictConfig, spec: ModelSpec, device_id: str,
                 class_names: Sequence[str] = (), publish: Sequence[Publish] = (),
                 socket: Optional[PredictionSocket] = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time):
        self.config = config
        self.spec = spec
        self.device_id = device_id
        self.class_names = class_names_for(config, spec.num_classes, class_names)
        self.top_k = min(config.top_k, spec.num_classes)
        self.publish: List[Publish] = list(publish)
        self.socket = socket
        self._clock = clock
        self._wall_clock = wall_clock
        #: Built once here (before any training thread runs: building draws from torch's global
        #: generator inside fork_rng) and deep-copied for every version, which draws nothing.
        self._template = build_model(spec, dropout=0.0, seed=0).eval()
        self._cond = threading.Condition()
        self._queue: Deque[Tuple[Window, float]] = deque()
        self._bucket = _Bucket(config.max_per_s, clock())
        self._pending: Optional[Dict[str, Any]] = None
        self._have_local = False
        self._model: Optional[torch.nn.Module] = None
        self._model_info: Dict[str, Any] = {}
        self._busy = False
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._seq = 0
        self._last_confidence: Optional[float] = None
        self._telemetry_mark: Optional[Tuple[float, int]] = None
        self.counters = {"offered": 0, "predicted": 0, "skipped_rate": 0, "dropped": 0,
                         "no_model": 0, "models": 0, "model_errors": 0, "publish_errors": 0}

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the socket (if any; its errors are raised here) and the prediction thread."""
        if self._thread is not None:
            return
        if self.socket is not None:
            self.socket.start()
        self._telemetry_mark = (self._clock(), 0)
        self._thread = threading.Thread(target=self._run, name="streamfl-predict", daemon=True)
        self._thread.start()
        log.info("predicting with the %s model, at most %g per second", self.config.model,
                 self.config.max_per_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread (the windows still queued are dropped) and the socket."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self.socket is not None:
            self.socket.stop()
        c = self.counters
        log.info("predictions: %d made, %d windows skipped by max_per_s, %d dropped from the full "
                 "queue, %d before any model; %d models, %d output errors", c["predicted"],
                 c["skipped_rate"], c["dropped"], c["no_model"], c["models"], c["publish_errors"])

    # ---- inputs -------------------------------------------------------------------------------

    def offer(self, window: Window, t_s: Optional[float] = None) -> bool:
        """Queue ``window`` (arrived at wall time ``t_s``, default now) unless the rate says skip;
        never blocks. True if queued (a full queue drops its oldest window)."""
        now = self._clock()
        with self._cond:
            self.counters["offered"] += 1
            if not self._bucket.take(now):
                self.counters["skipped_rate"] += 1
                return False
            if len(self._queue) >= self.config.queue_size:
                self._queue.popleft()
                self.counters["dropped"] += 1
            self._queue.append((window, self._wall_clock() if t_s is None else float(t_s)))
            self._cond.notify()
        return True

    def set_model(self, version: int, tensors: Mapping[str, np.ndarray], kind: str,
                  round_index: Optional[int] = None, run_id: str = "") -> bool:
        """Predict with these tensors from the next batch on, if ``kind`` is the one configured
        (``local`` also takes global models until its first local one). Cheap: the module is
        built on the prediction thread. True if taken."""
        if kind not in MODEL_KINDS:
            raise ValueError("model kind must be one of %s, got %r" % (", ".join(MODEL_KINDS), kind))
        with self._cond:
            if kind != self.config.model and not (kind == "global" and not self._have_local):
                return False
            if kind == "local":
                self._have_local = True
            self._pending = {"kind": kind, "version": int(version),
                             "round": None if round_index is None else int(round_index),
                             "run_id": str(run_id or ""), "tensors": tensors}
            self._cond.notify()
        return True

    # ---- outputs ------------------------------------------------------------------------------

    def stats(self) -> Dict[str, Any]:
        """Counters, the queue's length, the model predicting now and the socket's clients."""
        with self._cond:
            out: Dict[str, Any] = dict(self.counters, queued=len(self._queue),
                                       model=dict(self._model_info) or None,
                                       confidence=self._last_confidence)
        if self.socket is not None:
            out["socket"] = dict(self.socket.counters, connected=self.socket.client_count)
        return out

    def telemetry(self, now: float) -> Dict[str, Any]:
        """The ``Telemetry`` fields: predictions per second since the last call (or start), the
        latest confidence and the windows dropped from the full queue since start."""
        with self._cond:
            predicted = self.counters["predicted"]
            dropped = self.counters["dropped"]
            confidence = self._last_confidence
            mark, self._telemetry_mark = self._telemetry_mark, (now, predicted)
        rate = None
        if mark is not None and now > mark[0]:
            rate = (predicted - mark[1]) / (now - mark[0])
        return {"predictions_per_s": rate, "prediction_confidence": confidence,
                "predictions_dropped": dropped}

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until every queued window and the newest model were handled; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._queue or self._pending is not None or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None or not self._thread.is_alive():
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    # ---- the prediction thread ----------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                while not self._queue and self._pending is None and not self._stop.is_set():
                    self._cond.wait(1.0)
                if self._stop.is_set():
                    return
                batch = list(self._queue)
                self._queue.clear()
                pending, self._pending = self._pending, None
                self._busy = True
            try:
                if pending is not None:
                    self._swap(pending)
                if batch:
                    self._predict(batch)
            except Exception:  # a bug here must not end predictions for good, nor the agent
                log.exception("prediction failed")
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _swap(self, pending: Dict[str, Any]) -> None:
        """Build the new version's module beside the old one and replace it."""
        module = copy.deepcopy(self._template)
        try:
            arrays_to_model(module, pending["tensors"])
        except StreamflError as exc:
            self.counters["model_errors"] += 1
            log.error("cannot predict with %s model v%d: %s; keeping the previous one",
                      pending["kind"], pending["version"], exc)
            return
        module.eval()
        info = {k: pending[k] for k in ("kind", "version", "round", "run_id")}
        with self._cond:
            self._model, self._model_info = module, info
            self.counters["models"] += 1
        log.info("predicting with the %s model v%d%s", info["kind"], info["version"],
                 "" if info["round"] is None else " (round %d)" % info["round"])

    def _predict(self, batch: List[Tuple[Window, float]]) -> None:
        model, info = self._model, self._model_info
        if model is None:
            with self._cond:
                self.counters["no_model"] += len(batch)
            return
        x = torch.from_numpy(np.stack([w.x for w, _ in batch]).astype(np.float32, copy=False))
        with _INFERENCE():
            probs = torch.softmax(model(x), dim=1)
            top_p, top_i = torch.topk(probs, self.top_k, dim=1)
        top_p, top_i = top_p.numpy(), top_i.numpy()
        for (window, t_s), ps, ks in zip(batch, top_p, top_i):
            line = self._line(window, t_s, ps, ks, info)
            for publish in self.publish:
                try:
                    publish(line)
                except Exception as exc:  # an output failing never stops the others
                    self.counters["publish_errors"] += 1
                    n = self.counters["publish_errors"]
                    if n & (n - 1) == 0:  # 1st, 2nd, 4th, ...
                        log.warning("publishing a prediction failed: %s (%d so far)", exc, n)
            if self.socket is not None:
                self.socket.broadcast(line + b"\n")

    def _line(self, window: Window, t_s: float, ps: np.ndarray, ks: np.ndarray,
              info: Mapping[str, Any]) -> bytes:
        """One prediction of schema 1 as JSON bytes (no newline)."""
        best = int(ks[0])
        confidence = float(ps[0])
        with self._cond:
            seq = self._seq
            self._seq += 1
            self.counters["predicted"] += 1
            self._last_confidence = confidence
        record = {
            "schema": SCHEMA_VERSION,
            "device_id": self.device_id,
            "seq": seq,
            "time_s": float(t_s),
            "window_t_s": float(window.t_s),
            "class": best,
            "name": self.class_names[best],
            "confidence": round(confidence, 6),
            "top_k": [{"class": int(k), "name": self.class_names[int(k)], "p": round(float(p), 6)}
                      for p, k in zip(ps, ks)],
            "label": None if window.label == UNLABELLED else int(window.label),
            "model": {"kind": info["kind"], "version": info["version"], "round": info["round"],
                      "run_id": info["run_id"]},
        }
        return _JSON.encode(record).encode("utf-8")


class NullPredictor:
    """``predict.enabled`` is false: every call does nothing, telemetry keeps its defaults."""

    def start(self) -> None:
        """Nothing to start."""

    def stop(self, timeout_s: float = 5.0) -> None:
        """Nothing to stop."""

    def offer(self, window: Window, t_s: Optional[float] = None) -> bool:
        """Nothing predicts."""
        return False

    def set_model(self, version: int, tensors: Mapping[str, np.ndarray], kind: str,
                  round_index: Optional[int] = None, run_id: str = "") -> bool:
        """No model is kept."""
        return False

    def stats(self) -> Dict[str, Any]:
        """No counters."""
        return {}

    def telemetry(self, now: float) -> Dict[str, Any]:
        """No fields: the ``Telemetry`` defaults (none, none, 0) say predictions are off."""
        return {}


def make_predictor(config, state_dir: Path, transport=None, source=None):
    """The daemon's predictor for an ``AgentConfig``: a ``NullPredictor`` unless
    ``predict.enabled``; else one publishing on the device's prediction topic (``predict.mqtt``)
    and serving ``predict.socket_path`` (relative to ``state_dir``)."""
    cfg: PredictConfig = config.predict
    if not cfg.enabled:
        return NullPredictor()
    from streamfl.protocol.topics import Topics

    publish: List[Publish] = []
    if cfg.mqtt and transport is not None:
        topic = Topics(config.fleet).device(config.device_id, "prediction")

        def to_mqtt(payload: bytes) -> None:
            if transport.connected:  # QoS 0: a prediction missed while offline is not worth keeping
                transport.publish(topic, payload, qos=0)
        publish.append(to_mqtt)
    server = None
    if cfg.socket_path is not None:
        path = cfg.socket_path if cfg.socket_path.is_absolute() else Path(state_dir) / cfg.socket_path
        server = PredictionSocket(path, cfg.socket_client_buffer_bytes, cfg.socket_max_clients)
    from streamfl.sensors.replay import ReplaySource

    dataset_classes = [str(c) for c in source.data.classes] if isinstance(source, ReplaySource) else []
    return Predictor(cfg, config.model, config.device_id, dataset_classes, publish, server)
