"""How hard a coordinator may drive this board: every hyper-parameter it sends is clamped here.

A global model or an ``override`` command can carry any number that parses (lr 1, batch 1024,
10,000 local steps); the board, not the coordinator, decides what it accepts. The limits are the
agent YAML's ``hparam_limits`` (``{name: [low, high]}``), merged over ``DEFAULT_HPARAM_LIMITS``.

Defaults, chosen for an IMU-sized model on a Raspberry Pi or a Jetson: lr up to 0.5 (SGD on these
models diverges above that; AdaCLP's eq. 4 never exceeds its eta0), batches of at most 256 windows
(a few MB of activations for the LSTM) and 500 local steps (a round of minutes, not hours, on a Pi
4). A ``skip`` command is bounded by ``max_skip_rounds`` the same way (``agent/orders.py``).

A clamp or a refused value is logged once per change (the same value clamped again by every
global model is not said again), so a coordinator that keeps asking too much shows as one line.
A method's plug-in that replaces a hyper-parameter is logged by ``streamfl.agent.plugin_set``.
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

#: What was last said of each hyper-parameter (the value asked for and what it became), so that a
#: clamp is logged once per change, not once per global model.
_said: Dict[str, Tuple[Any, Any]] = {}


def _say_once(key: str, asked: Any, became: Any, msg: str, *args: Any) -> None:
    """``log.warning(msg, *args)`` unless the same ``asked -> became`` of ``key`` was said last."""
    seen = (repr(asked), repr(became))
    if _said.get(key) == seen:
        log.debug(msg, *args)
        return
    _said[key] = seen
    log.warning(msg, *args)


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
            _say_once(key, value, None, "%s: ignoring non-numeric %s=%r", source, key, value)
            continue
        lo, hi = limits[key]
        clamped = min(max(float(value), lo), hi)
        if clamped != value:
            _say_once(key, value, clamped, "%s: %s=%r clamped to %r (this board's hparam_limits; "
                      "said again only when it changes)", source, key, value, clamped)
        else:
            _said.pop(key, None)
        applied[key] = int(round(clamped)) if key in INT_HPARAMS else clamped
    return applied
