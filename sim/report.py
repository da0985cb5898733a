"""Turn a run folder's ``metrics.jsonl`` into a summary and a PNG plot of accuracy over time."""
import json
import logging
from pathlib import Path
from typing import Dict, List, Optional

log = logging.getLogger(__name__)


def read_metrics(path: Path) -> List[Dict]:
    """All JSON lines of ``path``; a half-written last line (a running writer) is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except ValueError:
                log.debug("skipping partial metrics line in %s", path)
    return records


def summarize(metrics: List[Dict], num_classes: int) -> Dict:
    """Versions, updates, staleness and accuracy at start and end of a run."""
    evals = [m for m in metrics if m.get("event") == "eval"]
    updates = [m for m in metrics if m.get("event") == "update"]
    staleness = [m["staleness"] for m in updates if m.get("staleness") is not None]
    return {
        "final_version": max([m.get("version", 0) for m in metrics] or [0]),
        "updates": len(updates),
        "aggregated": sum(1 for m in updates if m.get("aggregated")),
        "devices": sorted({m["device"] for m in updates if "device" in m}),
        "mean_staleness": sum(staleness) / len(staleness) if staleness else None,
        "max_staleness": max(staleness) if staleness else None,
        "initial_accuracy": evals[0]["accuracy"] if evals else None,
        "final_accuracy": evals[-1]["accuracy"] if evals else None,
        "best_accuracy": max(m["accuracy"] for m in evals) if evals else None,
        "chance": 1.0 / num_classes,
        "evaluations": len(evals),
    }


def elapsed_s(records: List[Dict]) -> List[float]:
    """Seconds since the first record; wall time spans coordinator restarts, ``time_s`` does not.

    ``time_s`` is monotonic since the server started, so it falls back to 0 after a restart; every
    record written since the fix also carries ``wall_s`` (Unix time), used when all records have it.
    """
    key = "wall_s" if records and all("wall_s" in m for m in records) else "time_s"
    t0 = records[0][key] if records else 0.0
    return [m[key] - t0 for m in records]


def _pyplot():
    """matplotlib's pyplot on the Agg backend, or None (logged) where matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed (pip install 'streamfl[server]'): no plot written")
        return None
    return plt


def plot_accuracy(metrics: List[Dict], out_path: Path, title: str = "streamfl") -> Optional[Path]:
    """Accuracy of the global model against time (and version); None when nothing to plot."""
    evals = [m for m in metrics if m.get("event") == "eval"]
    if not evals:
        return None
    plt = _pyplot()
    if plt is None:
        return None
    times = elapsed_s(evals)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(times, [m["accuracy"] for m in evals], marker="o", markersize=3, label="global model")
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("held-out accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    top = ax.secondary_xaxis("top")
    top.set_xlabel("version %d -> %d" % (evals[0]["version"], evals[-1]["version"]))
    top.set_ticks([])
    ax.legend(loc="lower right")
    fig.tight_layout()
    out_path = Path(out_path)
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path


def energy_by_device(metrics: List[Dict]) -> Dict[str, float]:
    """Joules each device reported over the run (updates without ``energy_j`` add nothing)."""
    out: Dict[str, float] = {}
    for m in metrics:
        if m.get("event") == "update" and m.get("energy_j") is not None:
            out[m["device"]] = round(out.get(m["device"], 0.0) + float(m["energy_j"]), 3)
    return out


def plot_clock_levels(metrics: List[Dict], out_path: Path, boards: Optional[Dict[str, str]] = None,
                      title: str = "clock levels") -> Optional[Path]:
    """Each device's clock level per round over time (the GPU where it has one, else cpu0)."""
    updates = [m for m in metrics if m.get("event") == "update" and m.get("clock_levels")]
    if not updates:
        return None
    plt = _pyplot()
    if plt is None:
        return None
    times = elapsed_s(updates)
    fig, ax = plt.subplots(figsize=(7, 4))
    for device in sorted({m["device"] for m in updates}):
        points = [(t, m["clock_levels"]) for t, m in zip(times, updates) if m["device"] == device]
        domain = "gpu" if "gpu" in points[0][1] else sorted(points[0][1])[0]
        label = "%s (%s, %s)" % (device, (boards or {}).get(device, "?"), domain)
        ax.step([t for t, _ in points], [lv.get(domain, 0) for _, lv in points], where="post",
                marker="o", markersize=2, label=label)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("clock level (0 = lowest)")
    ax.grid(alpha=0.3)
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    out_path = Path(out_path)
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path
