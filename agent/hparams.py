"""How hard a coordinator may drive this board: every hyper-parameter it sends is clamped here.

A global model or an ``override`` command can carry any number that parses (lr 1, batch 1024,
10,000 local steps); the board, not the coordinator, decides what it accepts. The limits are the
agent YAML's ``hparam_limits`` (``{name: [low, high]}``), merged over ``DEFAULT_HPARAM_LIMITS``.

Defaults, chosen for an IMU-sized model on a Raspberry Pi or a Jetson: lr up to 0.5 (SGD on these
models diverges above that; AdaCLP's eq. 4 never exceeds its eta0), batches of at most 256 windows
(a few MB of activations for the LSTM) and 500 local steps (a round of minutes, not hours, on a Pi
4). A ``skip`` command is bounded by ``max_skip_rounds`` the same way (``agent/orders.py``).
"""
import logging
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

log = logging.getLogger(__name__)

DEFAULT_HPARAM_LIMITS: Dict[str, Tuple[float, float]] = {
    "lr": (1e-6, 0.5),
    "batch_size": (1, 256),
    "local_steps": (1, 500),
    "dropout": (0.0, 0.9),
}
#: Hyper-parameters that are counts (rounded after clamping).
INT_HPARAMS = ("batch_size", "local_steps")


def hparam_limits(overrides: Optional[Mapping[str, Sequence[float]]] = None) -> Dict[str, Tuple[float, float]]:
    """The defaults with ``overrides`` merged; ValueError naming the key if one is not a range."""
    limits = dict(DEFAULT_HPARAM_LIMITS)
    for key, pair in (overrides or {}).items():
        if key not in DEFAULT_HPARAM_LIMITS:
            raise ValueError("hparam_limits.%s: unknown hyper-parameter (known: %s)"
                             % (key, ", ".join(sorted(DEFAULT_HPARAM_LIMITS))))
        lo_default, hi_default = DEFAULT_HPARAM_LIMITS[key]
        if (not isinstance(pair, (list, tuple)) or len(pair) != 2
                or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in pair)
                or not lo_default <= pair[0] <= pair[1] <= max(hi_default, 1e6)):
            raise ValueError("hparam_limits.%s must be [low, high] with %g <= low <= high, got %r"
                             % (key, lo_default, pair))
        limits[key] = (float(pair[0]), float(pair[1]))
    return limits


def clamp_hparams(values: Mapping[str, Any], limits: Mapping[str, Tuple[float, float]],
                  source: str = "") -> Dict[str, float]:
    """The known, numeric hyper-parameters of ``values`` clamped to ``limits`` (logged when clamped)."""
    applied: Dict[str, float] = {}
    for key, value in values.items():
        if key not in limits:
            log.debug("%s: hyper-parameter %r not used by the agent", source, key)
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            log.warning("%s: ignoring non-numeric %s=%r", source, key, value)
            continue
        lo, hi = limits[key]
        clamped = min(max(float(value), lo), hi)
        if clamped != value:
            log.warning("%s: %s=%r clamped to %r (this board's hparam_limits)", source, key, value, clamped)
        applied[key] = int(round(clamped)) if key in INT_HPARAMS else clamped
    return applied
