"""Bytes against accuracy of the wire encodings, measured with ``streamfl sim`` on scenarios.

Each encoding is a pair of the real settings, ``agent.update_encoding`` and
``coordinator.model_encoding``, given to the simulator with ``--set``: every update and every
global model then goes through the real codec (``streamfl.protocol.quantize``,
``coordinator/deltas.py``), so the accuracy cost is the one a fleet would see, and the bytes are
the real frames' sizes (the update and aggregate events' ``frame_bytes`` and ``model_bytes``).
Smaller frames also upload and download faster in virtual time, as they would on a slow link.

Downlink bytes count every published version once per device, as a QoS 1 subscription to the
model topic delivers it (an upper bound: a device offline meanwhile gets only the retained newest).

    python -m streamfl.sim.compression configs/scenarios/smoke.yaml --seeds 3 --out runs/compression
"""
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

#: name -> (agent.update_encoding, coordinator.model_encoding)
ENCODINGS = {
    "none": ("float32", "float32"),
    "int8": ("int8_delta", "int8"),
    "float16": ("float16", "float16"),
}
#: The goal: at least this many times fewer bytes ...
GOAL_RATIO = 3.0
#: ... for at most this many points of final accuracy lost.
GOAL_POINTS = 0.5


def run(scenario: Path, encoding: str, out: Path, seeds: int, methods: Optional[str], jobs: int,
        sets: Sequence[str] = ()) -> Path:
    """One ``streamfl sim`` of ``scenario`` with ``encoding``; its run folder."""
    update_enc, model_enc = ENCODINGS[encoding]
    folder = out / ("%s-%s" % (scenario.stem, encoding))
    cmd = [sys.executable, "-m", "streamfl.cli", "sim", str(scenario), "--seeds", str(seeds),
           "--jobs", str(jobs), "--out", str(folder),
           "--set", "agent.update_encoding=%s" % update_enc,
           "--set", "coordinator.model_encoding=%s" % model_enc]
    if methods:
        cmd += ["--methods", methods]
    for item in sets:
        cmd += ["--set", item]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return folder


def _mean_std(values: List[float]) -> Dict[str, float]:
    return {"mean": statistics.fmean(values),
            "std": statistics.pstdev(values) if len(values) > 1 else 0.0, "n": len(values)}


def figures(folder: Path) -> Dict[str, Any]:
    """Per method: bytes up per update, down per version, total per aggregation, final and mean
    accuracy, each as mean and std over seeds."""
    events: Dict[tuple, Dict[str, list]] = {}
    devices: Dict[tuple, set] = {}
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        e = json.loads(line)
        key = (e.get("method"), e.get("seed"))
        kind = e.get("event")
        if kind in ("update", "aggregate", "eval"):
            events.setdefault(key, {"update": [], "aggregate": [], "eval": []})[kind].append(e)
        if kind == "update":
            devices.setdefault(key, set()).add(e.get("device"))
    path = folder / "summary.json"
    summary = json.loads(path.read_text()) if path.exists() else {}
    out: Dict[str, Any] = {}
    for method in sorted({m for m, _ in events}):
        per_seed = []
        for (m, seed), ev in sorted(events.items()):
            if m != method or not ev["update"] or not ev["aggregate"]:
                continue
            up = [u["frame_bytes"] for u in ev["update"]]
            down = [a["model_bytes"] for a in ev["aggregate"]]
            n_dev = len(devices[(m, seed)])
            final = [x for x in ev["eval"] if x.get("final")]
            per_seed.append({
                "seed": seed, "updates": len(up), "versions": len(down), "devices": n_dev,
                "up_bytes_per_update": statistics.fmean(up),
                "down_bytes_per_version": statistics.fmean(down),
                "up_bytes": sum(up), "down_bytes": sum(down) * n_dev,
                "bytes_per_aggregation": (sum(up) + sum(down) * n_dev) / len(down),
                "delta_base_rejections": sum(1 for u in ev["update"] if u.get("reason") == "delta_base"),
                "final_accuracy": final[-1]["accuracy"] if final else None})
        if not per_seed:
            continue
        entry = {k: _mean_std([s[k] for s in per_seed]) for k in (
            "up_bytes_per_update", "down_bytes_per_version", "bytes_per_aggregation", "updates",
            "versions", "delta_base_rejections")}
        s = summary.get("methods", {}).get(method)
        if s is None:  # an interrupted grid: the seeds whose runs finished, from their events
            finals = [p["final_accuracy"] for p in per_seed if p["final_accuracy"] is not None]
            s = {"final_accuracy": statistics.fmean(finals),
                 "final_accuracy_std": statistics.pstdev(finals) if len(finals) > 1 else 0.0}
        entry["final_accuracy"] = {"mean": s["final_accuracy"], "std": s.get("final_accuracy_std", 0.0),
                                   "n": len(per_seed)}
        if s.get("mean_accuracy") is not None:
            entry["mean_accuracy"] = {"mean": s["mean_accuracy"], "std": s.get("mean_accuracy_std", 0.0)}
        entry["seeds"] = per_seed
        out[method] = entry
    return out


def compare(results: Dict[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Rows of (scenario, method, encoding) with ratios and accuracy cost against ``none``."""
    rows = []
    for scenario, by_enc in results.items():
        base = by_enc.get("none", {})
        for encoding, by_method in by_enc.items():
            for method, f in by_method.items():
                ref = base.get(method)
                row = {"scenario": scenario, "method": method, "encoding": encoding,
                       "up_bytes_per_update": f["up_bytes_per_update"]["mean"],
                       "down_bytes_per_version": f["down_bytes_per_version"]["mean"],
                       "final_accuracy": f["final_accuracy"]["mean"],
                       "final_accuracy_std": f["final_accuracy"]["std"], "seeds": f["final_accuracy"]["n"],
                       "mean_accuracy": f.get("mean_accuracy", {}).get("mean"),
                       "mean_accuracy_std": f.get("mean_accuracy", {}).get("std")}
                if ref is not None:
                    row["up_ratio"] = ref["up_bytes_per_update"]["mean"] / f["up_bytes_per_update"]["mean"]
                    row["down_ratio"] = ref["down_bytes_per_version"]["mean"] / f["down_bytes_per_version"]["mean"]
                    row["total_ratio"] = ref["bytes_per_aggregation"]["mean"] / f["bytes_per_aggregation"]["mean"]
                    row["accuracy_cost_points"] = 100 * (ref["final_accuracy"]["mean"] - f["final_accuracy"]["mean"])
                    if row["mean_accuracy"] is not None and ref.get("mean_accuracy"):
                        row["mean_accuracy_cost_points"] = 100 * (ref["mean_accuracy"]["mean"] - row["mean_accuracy"])
                    row["meets_goal"] = row["total_ratio"] >= GOAL_RATIO and row["accuracy_cost_points"] <= GOAL_POINTS
                rows.append(row)
    return rows


def markdown(rows: List[Dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    lines = ["| scenario | method | encoding | up B/update | down B/version | up x | down x | total x "
             "| final accuracy | cost (points) | mean accuracy | cost (points) | goal |", "|---" * 13 + "|"]
    for r in rows:
        ratio = lambda k: "%.2f" % r[k] if k in r else "-"  # noqa: E731
        lines.append("| %s | %s | %s | %.0f | %.0f | %s | %s | %s | %.3f ± %.3f (%d seeds) | %s | %s | %s | %s |" % (
            r["scenario"], r["method"], r["encoding"], r["up_bytes_per_update"], r["down_bytes_per_version"],
            ratio("up_ratio"), ratio("down_ratio"), ratio("total_ratio"), r["final_accuracy"],
            r["final_accuracy_std"], r["seeds"],
            "%+.2f" % r["accuracy_cost_points"] if "accuracy_cost_points" in r else "-",
            "-" if r["mean_accuracy"] is None else "%.3f ± %.3f" % (r["mean_accuracy"], r["mean_accuracy_std"]),
            "%+.2f" % r["mean_accuracy_cost_points"] if "mean_accuracy_cost_points" in r else "-",
            "-" if r["encoding"] == "none" else ("yes" if r.get("meets_goal") else "no")))
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="+", type=Path)
    parser.add_argument("--encodings", default=",".join(ENCODINGS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--methods", default=None)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], dest="sets")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tabulate-only", action="store_true", help="read existing run folders")
    args = parser.parse_args(argv)
    results: Dict[str, Dict[str, Any]] = {}
    for scenario in args.scenarios:
        for encoding in args.encodings.split(","):
            folder = args.out / ("%s-%s" % (scenario.stem, encoding))
            if not args.tabulate_only:
                run(scenario, encoding, args.out, args.seeds, args.methods, args.jobs, args.sets)
            if (folder / "metrics.jsonl").exists():
                results.setdefault(scenario.stem, {})[encoding] = figures(folder)
    rows = compare(results)
    (args.out / "compression.json").write_text(json.dumps({"rows": rows, "runs": results}, indent=1))
    table = markdown(rows)
    (args.out / "compression.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
