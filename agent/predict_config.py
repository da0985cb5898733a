"""The ``predict:`` section of the agent config: predictions on live windows (docs/predictions.md).

Off unless configured. Choices left open by the issue, each configurable:

- ``max_per_s`` is a token bucket holding one second's worth of predictions (at least one), so a
  burst of windows (a sensor catching up) is predicted up to that, then paced; 5 per second is
  every window of the default sensor (``sensor.windows_per_s: 5``), a few milliseconds of one
  core per second for the shipped models.
- A full queue drops its oldest window, not the new one: an app wants the newest prediction, and
  one that comes late is worth less than one that comes now.
- ``local`` predicts with the global model until this board's first round (or checkpoint): a
  fresh board predicts at once, and every line says which model made it.
- A socket client may fall behind by ``socket_client_buffer_bytes`` in the agent plus as much in
  the kernel (the agent sets the socket's send buffer to it) before it is disconnected: 64 KiB
  is some 200 lines, 40 s at 5 a second.
"""
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

from streamfl.config import bounded

#: Which model predicts.
MODEL_KINDS = ("global", "local")


@dataclass(frozen=True)
class PredictConfig:
    """Run the current model on incoming windows and publish each prediction (docs/predictions.md)."""

    #: Predict on incoming windows and publish each prediction; off unless configured.
    enabled: bool = False
    #: Which model predicts: ``global`` (the newest global model this board accepted) or ``local``
    #: (this board's own model after its last round; the global model until its first round).
    model: str = "global"
    #: Most predictions per second (a token bucket of one second's worth); windows beyond it are
    #: skipped and counted (``skipped_rate``). 5: every window of the default sensor.
    max_per_s: float = bounded(5.0, 0.0, 10000.0, lo_open=True)
    #: Windows waiting for the prediction thread; when it is full the oldest is dropped and
    #: counted (``predictions_dropped`` in telemetry). Sensor ingest never waits for it.
    queue_size: int = bounded(16, 1, 100000)
    #: Publish each prediction on ``streamfl/v1/<fleet>/device/<id>/prediction`` (QoS 0, JSON,
    #: not retained): for apps and dashboards, not the coordinator.
    mqtt: bool = True
    #: A Unix domain socket streaming every prediction as a JSON line to apps on the board
    #: (mode 0660, removed at stop); a relative path is under ``state_dir``; null = none.
    socket_path: Optional[Path] = Path("predictions.sock")
    #: Bytes a socket client may fall behind (the agent's buffer; the kernel holds as much again)
    #: before it is disconnected, so a slow client never delays the others or the agent.
    socket_client_buffer_bytes: int = bounded(65536, 4096, 64 * 1024 * 1024)
    #: Socket clients served at once; one more is closed as soon as it connects (counted).
    socket_max_clients: int = bounded(16, 1, 1024)
    #: Classes listed, most likely first, in each prediction's ``top_k``.
    top_k: int = bounded(3, 1, 4096)
    #: Class names by index, shown in each prediction (``name``); empty: the replay dataset's
    #: ``classes`` where the sensor replays one, else ``class_<index>``. Its length must be
    #: ``model.num_classes``.
    class_names: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.model not in MODEL_KINDS:
            raise ValueError("predict.model must be one of %s, got %r"
                             % (", ".join(MODEL_KINDS), self.model))
        for i, name in enumerate(self.class_names):
            if not name or len(name) > 128:
                raise ValueError("predict.class_names[%d] must be 1-128 characters, got %r" % (i, name))
