"""What jetson-stats (jtop) says about clocks and the power mode: read only, optional.

jtop has no frequency setter, so streamfl sets clocks through sysfs and asks jtop
only for a second opinion: the nvpmodel mode, whether jetson_clocks pins the clocks (which would
override the agent's caps), and the clocks it reads. ``streamfl-agent dvfs status`` prints it.
"""
import importlib
import logging
from typing import Any, Callable, Dict, Mapping, Optional

log = logging.getLogger(__name__)


def summarize_jtop(jetson: Any) -> Dict[str, Any]:
    """Power mode, jetson_clocks state and current clocks (kHz) from a connected jtop client."""
    out: Dict[str, Any] = {}
    model = getattr(jetson, "nvpmodel", None)
    if model is not None:
        out["nvpmodel"] = "%s (id %s)" % (getattr(model, "name", model), getattr(model, "id", "?"))
    clocks = getattr(jetson, "jetson_clocks", None)
    if clocks is not None:
        out["jetson_clocks"] = str(getattr(clocks, "status", bool(clocks)))
    cpus = (getattr(jetson, "cpu", None) or {}).get("cpu", [])
    out["cpu_khz"] = [c.get("freq", {}).get("cur") for c in cpus if isinstance(c, Mapping)
                      and c.get("online", True)]
    gpus = getattr(jetson, "gpu", None) or {}
    out["gpu_khz"] = {name: g.get("freq", {}).get("cur") for name, g in gpus.items()
                      if isinstance(g, Mapping)}
    return out


def read_jtop(connect: Optional[Callable[[], Any]] = None) -> Optional[Dict[str, Any]]:
    """``summarize_jtop`` of a fresh client, or None when jetson-stats is absent or its service
    cannot be reached (logged); ``connect`` returns a started client (tests)."""
    jetson = None
    try:
        if connect is None:
            try:
                module = importlib.import_module("jtop")
            except ImportError:
                log.debug("jetson-stats not installed: no jtop reading")
                return None
            jetson = module.jtop()
            jetson.start()
        else:
            jetson = connect()
        return summarize_jtop(jetson)
    except Exception as exc:  # jtop's own exceptions and socket errors: a reader, never fatal
        log.warning("jtop unavailable: %s", exc)
        return None
    finally:
        if jetson is not None and connect is None:
            try:
                jetson.close()
            except Exception:  # noqa: B902 - closing a half-started client may fail too
                pass
