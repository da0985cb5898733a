"""The device side of coordinator scheduling (FedTeddi and its baselines): what a device tells the
scheduler about its data, every round, trained or not.

Dormant until the global model carries a ``ScheduleRequest``. Then every update carries a
``ScheduleStats`` (its buffer's class counts now and at its previous frame, its frame number and,
from the round just trained, per-class gradient norms, the gradient variance and norm and the start
loss), and while the device is told to skip its telemetry carries the same counts (no training, no
backward pass) with the last round's gradient figures.

Frames (FedTeddi sec. III-A: new data at a frame's start) are not announced to a board, so the
device notices them in its own buffer: a new frame starts when a class appears that the current
frame's reference distribution lacks (the paper's new-class frames), or when the distribution has
moved more than ``frame_shift`` in total variation from that reference (new data of known classes).
At a new frame the counts last seen before it become the previous frame's (``prev_counts``) and
the current ones the new reference. The default 0.6 lies above what refilling a buffer after a new-class
frame moves (a one-class device gaining a second class moves 0.5), so one arrival is one frame.
"""
import logging
from dataclasses import dataclass
from typing import ClassVar, Dict, List, Optional, Tuple

import numpy as np

from streamfl.agent.plugins.base import AgentPlugin, ModelDecision, ReportContext, RoundContext, Statistic
from streamfl.config import bounded
from streamfl.models.class_gradients import gradient_stats
from streamfl.protocol.extras import Extra
from streamfl.protocol.messages import GlobalModel
from streamfl.methods.schedule.payloads import ScheduleRequest, ScheduleStats

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScheduleAgentConfig:
    """stat_windows: windows the gradient statistics run on (each in one backward pass: at the
    default 32, a fifth of a round of 5 steps of 32); frame_shift: total-variation distance from the frame's reference
    distribution that starts a new frame without a new class; channel_snr_hz: this radio's
    P|H|^2/N0 in Hz where the board or its operator knows it (the simulator fills it from its
    channel model), for the scheduler's bandwidth allocation (FedTeddi eq. 14); None: unknown."""

    #: Keys that are facts of this board: a coordinator's named method never sets them
    #: (``streamfl.agent.method_settings``).
    BOARD_KEYS: ClassVar[Tuple[str, ...]] = ("channel_snr_hz",)

    stat_windows: int = bounded(32, 2, 65536)
    frame_shift: float = bounded(0.6, 0.0, 1.0, lo_open=True)
    channel_snr_hz: Optional[float] = bounded(None, 0.0, 1e18, lo_open=True)

    def __post_init__(self) -> None:
        if self.stat_windows < 2:
            raise ValueError("stat_windows must be >= 2, got %r" % (self.stat_windows,))
        if not 0.0 < self.frame_shift <= 1.0:
            raise ValueError("frame_shift must be in (0, 1], got %r" % (self.frame_shift,))
        if self.channel_snr_hz is not None and not (np.isfinite(self.channel_snr_hz)
                                                    and self.channel_snr_hz > 0):
            raise ValueError("channel_snr_hz must be a finite number > 0, got %r"
                             % (self.channel_snr_hz,))


def _vector(counts: Dict[int, int], num_classes: int) -> np.ndarray:
    out = np.zeros(num_classes, dtype=np.int64)
    for c, n in counts.items():
        if 0 <= int(c) < num_classes:
            out[int(c)] = int(n)
    return out


class ScheduleAgentPlugin(AgentPlugin):
    """Tracks the device's frames and reports its scheduling statistics while a scheduler runs."""

    name = "schedule"
    Config = ScheduleAgentConfig
    activated_by = (ScheduleRequest.KIND,)

    def __init__(self, config: ScheduleAgentConfig = ScheduleAgentConfig()):
        super().__init__(config)
        self.request: Optional[ScheduleRequest] = None
        self.frame = 0
        #: Class counts at the current frame's start, and the previous frame's reference.
        self._reference: Optional[np.ndarray] = None
        self._previous: Optional[np.ndarray] = None
        #: The last counts seen: the previous frame's end when a new one starts.
        self._latest: Optional[np.ndarray] = None
        #: (class norms, variance, norm, loss) of the last trained round.
        self._last: Tuple[Tuple[float, ...], Optional[float], Optional[float], Optional[float]] = (
            (), None, None, None)

    def on_model_received(self, gm: GlobalModel, hparams: Dict[str, float]) -> ModelDecision:
        self.request = gm.extras[ScheduleRequest.KIND]
        return ModelDecision(hparams)

    def _observe(self, counts: np.ndarray) -> None:
        """Start a new frame when a class is new to this frame or the mix moved past frame_shift."""
        if self._reference is None or self._reference.shape != counts.shape:
            self._reference = self._previous = self._latest = counts.copy()
            return
        ref_total, total = self._reference.sum(), counts.sum()
        if total == 0:
            return
        if ref_total == 0:
            self._reference = self._latest = counts.copy()
            return
        new_class = bool(((counts > 0) & (self._reference == 0)).any())
        shift = 0.5 * float(np.abs(counts / total - self._reference / ref_total).sum())
        if new_class or shift > self.config.frame_shift:
            self.frame += 1
            self._previous = self._latest
            self._reference = counts.copy()
            log.info("frame %d: %s", self.frame, "a new class" if new_class else "shift %.2f" % shift)
        self._latest = counts.copy()

    def _stats(self, counts: np.ndarray) -> ScheduleStats:
        self._observe(counts)
        norms, variance, norm, loss = self._last
        return ScheduleStats(counts=tuple(int(v) for v in counts),
                             prev_counts=tuple(int(v) for v in self._previous), frame=self.frame,
                             class_grad_norms=norms, grad_var=variance, grad_norm=norm, loss=loss,
                             snr_hz=self.config.channel_snr_hz)

    def after_round(self, ctx: RoundContext) -> List[Statistic]:
        """The round's statistics at the trained model; gradient figures only when asked for."""
        counts = _vector(ctx.buffer_counts, ctx.num_classes)
        loss = ctx.start_loss if ctx.start_loss is not None else ctx.loss
        windows = 0
        norms: Tuple[float, ...] = ()
        variance = norm = None
        if self.request.class_gradients and ctx.buffer_len > 0:
            windows = max(2, min(self.config.stat_windows, ctx.buffer_len))
            X, y = ctx.sample(windows)
            try:
                stats = gradient_stats(ctx.model, X, y, ctx.num_classes)
            except ValueError as exc:
                log.warning("no gradient statistics this round: %s", exc)
            else:
                if all(np.isfinite(v) for v in stats.class_norms + (stats.norm, stats.variance or 0.0)):
                    norms, variance, norm = stats.class_norms, stats.variance, stats.norm
                else:
                    log.warning("gradient statistics not finite; the update goes without them")
        if loss is not None and not np.isfinite(loss):
            loss = None
        self._last = (norms, variance, norm, loss)
        # Every window goes through one backward pass (two per class, over its halves).
        return [Statistic(self._stats(counts), batched_windows=windows)]

    def before_telemetry(self, ctx: ReportContext) -> List[Extra]:
        """The counts now, with the last trained round's gradient figures (no training here)."""
        return [self._stats(_vector(ctx.buffer_counts, ctx.num_classes))]
