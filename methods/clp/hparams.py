"""AdaCLP hyper-parameter refinement on the device (AdaCLP paper, sec. 3.2, eq. 4-6).

``refine(state, gm.hparams, cfg)`` turns the coordinator's CLP state (the global model's typed
``ClpState`` extra) into the round's lr, batch size and dropout:

* eq. 4 ``eta = eta0 * F^(-ln 2)``, eq. 5 ``B = 1 + B0 / (1 + ln F)``,
  eq. 6 ``D = D0 (1 - sigmoid(beta (F(T) - F(T-1))))``, with ``F = F_G / reference``
  (reference = ``fisher_scale``, 1.0 = the paper's literal F_G; F_G at the segment start; or
  the coordinator's warm-up reference, the scale-free option).
* Guards: eq. 4 grows without bound as F -> 0 and eq. 5 has a pole at F = 1/e (negative below),
  so lr and batch size are clamped. ``lr_max = initial_lr`` (eta0) and ``batch_max =
  initial_batch`` (B0) by default: sec. 3.2 only ever *reduces* eta and B from their initial
  values, so F < 1 (outside the formulas' intended range) gives the initial values; below the
  pole (1 + ln F <= 0) the batch size is ``batch_max``, the limit from above, keeping B non-increasing in F. Eq. 6 lies in (0, D0]
  for beta >= 0, so ``dropout_max`` bounds D0 itself and ``dropout_min`` is the floor.
* Segment start (``version == segment_start_version``) and no F_G yet: (eta0, B0, D0), the
  paper's reset values. Eq. 6 applies throughout (rising F -> D < D0/2; after leaving the CLP F
  falls and D rises towards D0, the paper's "increase the dropout rate to re-enter the CLP").
* Not regulating (no CLP state, ``regulating`` off, or after R_end): the coordinator's ``base`` hparams
  unchanged: "after R_end we stop ... hyperparameter adjustments, resuming standard asynchronous
  federated learning" (sec. 3.2), i.e. the run's plain FedAsync settings, not eta0/B0/D0.

Pure functions, Python 3.8 (the agent runs on JetPack 5).
"""
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Mapping, Optional

from streamfl.config import bounded
from streamfl.methods.clp.payloads import ClpState

#: Paper defaults: eta0 = 0.01 (sec. 5.4.2), B0 = 50 (sec. 5.4.1).
DEFAULT_ETA0 = 0.01
DEFAULT_B0 = 50
FISHER_REFERENCES = ("absolute", "segment_start", "warmup")
_LN2 = math.log(2.0)


def _num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class ClpHparamsConfig:
    """eq. 4-6 constants and the clamps that keep them finite.

    initial_lr, initial_batch, initial_dropout: eq. 4-6's eta0, B0 and D0, the values a segment
      starts from and the most each formula gives.
    initial_dropout: the paper gives no D0; 0.2 is a common dropout for small LSTM/CNN HAR models
      and leaves eq. 6 the range (0, 0.2] (0.1 on a flat trace).
    dropout_slope: eq. 6's beta, the sigmoid's slope in F's change. The paper gives none; eq. 6
      uses the *absolute* change of F per version, which with a window of ~10 and F ~ 1 is of
      order 0.01-0.1, so beta = 10 spans most of the sigmoid.
    lr_min = initial_lr / 100: reached only when F rises ~770x (100^(1/ln 2)); lower rates stall
      learning, which sec. 5.4.2 shows costs accuracy.
    batch_min = 8 (reached at F ~ e^6.1): eq. 5 tends to 1; single-sample batches waste the
      boards' parallelism and make gradients (and the device's Fisher estimate) very noisy.
    dropout_max = 0.5: Srivastava et al. [53]'s upper practical value.
    fisher_reference: "absolute" uses F_G / fisher_scale (1.0 = the paper literally; set the
      scale to a typical trace of the model to make eq. 4-6 scale-free); "segment_start" uses
      F_G / F_G(segment start), so every segment restarts at F = 1; "warmup" uses F_G / the
      coordinator's warm-up reference (``ClpState.fisher_reference``: F_G's mean over the run's
      first traced aggregations), a scale-free reading that keeps eq. 4's shape across models and
      class counts (until the reference is known: eta0, B0, D0).
    """

    #: Old key names (the paper's symbols) that files may still use.
    RENAMED: ClassVar[Dict[str, str]] = {
        "eta0": "initial_lr", "b0": "initial_batch", "d0": "initial_dropout", "beta": "dropout_slope"}

    #: The learning rate at F = 1 and at a segment's start (AdaCLP's eta0, eq. 4).
    initial_lr: float = bounded(DEFAULT_ETA0, 0.0, 10.0, lo_open=True)
    #: The batch-size term at F = 1 and the batch size at a segment's start (AdaCLP's B0, eq. 5).
    initial_batch: int = bounded(DEFAULT_B0, 1, 65536)
    #: The dropout at a segment's start and eq. 6's ceiling (AdaCLP's D0, eq. 6).
    initial_dropout: float = bounded(0.2, 0.0, 1.0, hi_open=True)
    #: Slope of eq. 6's sigmoid in F's change per version (AdaCLP's beta, eq. 6).
    dropout_slope: float = bounded(10.0, 0.0, 1e4)
    lr_min: float = bounded(DEFAULT_ETA0 / 100.0, 0.0, 10.0, lo_open=True)
    #: Upper clamp on eq. 4's learning rate (AdaCLP); eq. 4 explodes for F_G < 1.
    lr_max: float = bounded(DEFAULT_ETA0, 0.0, 10.0, lo_open=True)
    batch_min: int = bounded(8, 1, 65536)
    #: Upper clamp on eq. 5's batch size (AdaCLP), also its value past eq. 5's pole.
    batch_max: int = bounded(DEFAULT_B0, 1, 65536)
    #: Lower clamp on eq. 6's dropout (AdaCLP).
    dropout_min: float = bounded(0.0, 0.0, 1.0, hi_open=True)
    dropout_max: float = bounded(0.5, 0.0, 1.0, hi_open=True)
    fisher_reference: str = "absolute"
    #: fisher_reference absolute: F = F_G / fisher_scale in eq. 4-6 (1.0 = the paper's literal F_G;
    #: a typical trace of the model makes them scale-free).
    fisher_scale: float = bounded(1.0, 0.0, 1e12, lo_open=True)

    def __post_init__(self) -> None:
        for name in ("initial_lr", "lr_min", "lr_max", "fisher_scale"):
            value = getattr(self, name)
            if not _num(value) or value <= 0:
                raise ValueError("clp_hparams.%s must be a finite number > 0, got %r" % (name, value))
        for name in ("initial_batch", "batch_min", "batch_max"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError("clp_hparams.%s must be an integer >= 1, got %r" % (name, value))
        for name in ("initial_dropout", "dropout_min", "dropout_max"):
            value = getattr(self, name)
            if not _num(value) or not 0.0 <= value < 1.0:
                raise ValueError("clp_hparams.%s must be in [0, 1), got %r" % (name, value))
        if not _num(self.dropout_slope) or self.dropout_slope < 0:
            raise ValueError("clp_hparams.dropout_slope must be a finite number >= 0, got %r"
                             % (self.dropout_slope,))
        if not self.lr_min <= self.initial_lr <= self.lr_max:
            raise ValueError("clp_hparams needs lr_min <= initial_lr <= lr_max, got %r <= %r <= %r"
                             % (self.lr_min, self.initial_lr, self.lr_max))
        if not self.batch_min <= self.initial_batch <= self.batch_max:
            raise ValueError("clp_hparams needs batch_min <= initial_batch <= batch_max, got %r <= %r"
                             " <= %r" % (self.batch_min, self.initial_batch, self.batch_max))
        if not self.dropout_min <= self.initial_dropout <= self.dropout_max:
            raise ValueError("clp_hparams needs dropout_min <= initial_dropout <= dropout_max, got %r"
                             " <= %r <= %r" % (self.dropout_min, self.initial_dropout, self.dropout_max))
        if self.fisher_reference not in FISHER_REFERENCES:
            raise ValueError("clp_hparams.fisher_reference must be one of %s, got %r"
                             % (", ".join(FISHER_REFERENCES), self.fisher_reference))


def _clamp(value: float, lo: float, hi: float) -> float:
    return min(max(value, lo), hi)


def sigmoid(x: float) -> float:
    """Numerically stable logistic function."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def learning_rate(f: float, cfg: ClpHparamsConfig) -> float:
    """Eq. 4, clamped to [lr_min, lr_max]; f <= 0 (no information) gives initial_lr."""
    if f <= 0:
        return cfg.initial_lr
    return _clamp(cfg.initial_lr * f ** (-_LN2), cfg.lr_min, cfg.lr_max)


def batch_size(f: float, cfg: ClpHparamsConfig) -> int:
    """Eq. 5 rounded, clamped to [batch_min, batch_max]; at/below the pole F = 1/e: batch_max."""
    if f <= 0:
        return cfg.initial_batch
    denom = 1.0 + math.log(f)
    if denom <= 1e-12:
        return cfg.batch_max
    raw = 1.0 + cfg.initial_batch / denom
    return int(round(_clamp(raw, cfg.batch_min, cfg.batch_max)))


def dropout(delta_f: float, cfg: ClpHparamsConfig) -> float:
    """Eq. 6, clamped to [dropout_min, dropout_max]."""
    return _clamp(cfg.initial_dropout * (1.0 - sigmoid(cfg.dropout_slope * delta_f)), cfg.dropout_min,
                  cfg.dropout_max)


def _positive(value: Optional[float]) -> Optional[float]:
    return value if value is not None and _num(value) else None


def refine(clp: Optional[ClpState], base: Mapping[str, float],
           cfg: ClpHparamsConfig = ClpHparamsConfig()) -> Dict[str, float]:
    """The round's hparams: ``base`` (GlobalModel.hparams) with lr, batch_size, dropout refined
    from ``clp`` (the global model's CLP state); local_steps and any other key pass through."""
    out = dict(base)
    if clp is None or clp.regulating is not True:
        return out
    reset = {"lr": cfg.initial_lr, "batch_size": cfg.initial_batch, "dropout": cfg.initial_dropout}
    fg = _positive(clp.fisher_global)
    if fg is None or fg <= 0 or clp.version == clp.segment_start_version:
        out.update(reset)
        return out
    if cfg.fisher_reference in ("segment_start", "warmup"):
        ref = _positive(clp.fisher_segment_start if cfg.fisher_reference == "segment_start"
                        else clp.fisher_reference)
        if ref is None or ref <= 0:
            out.update(reset)
            return out
    else:
        ref = cfg.fisher_scale
    prev = _positive(clp.fisher_global_prev)
    f = fg / ref
    delta = 0.0 if prev is None else (fg - prev) / ref
    out.update({"lr": learning_rate(f, cfg), "batch_size": batch_size(f, cfg),
                "dropout": dropout(delta, cfg)})
    return out
