"""FedTeddi's figures as Markdown: per method, the rounds (aggregations) from each frame's start to a
target accuracy on the classes seen so far, the time it took, how many devices a round trained
and what a round cost, from a run's ``summary.json`` (``streamfl report --section frames``).

Rounds are counted at evaluations (every ``eval_every_s``), so they are resolved to the versions
made between two evaluations. A seed that never reaches the target in a frame is left out of
that frame's mean and counted in the ``(reached/seeds)`` note; the comparison with the reference
counts it at the frame's length instead (a lower bound on its rounds). The change comes with its
spread: the std over seeds of each seed's change against the reference's run of the same seed.
A run folder's table also gives eq. 17's sigma and eq. 18's L, averaged over the schedule lines
of the frames shown, for the methods that measure them.
"""
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from streamfl.errors import ConfigError, StreamflError
from streamfl.sim.summary import read_summary
from streamfl.sim.tables import markdown_rows


def _frames(entry: Dict[str, Any], end_s: float) -> List[int]:
    """Frames every seed evaluated at least twice, starting before ``end_s`` (a run's last
    evaluation can open a frame)."""
    seen: Dict[int, List[int]] = {}
    for run in entry.get("runs", []):
        for p in run.get("periods", []):
            if float(p.get("start_s", 0.0)) < end_s:
                seen.setdefault(int(p["period"]), []).append(int(p.get("evaluations", 2)))
    runs = len(entry.get("runs", []))
    return sorted(f for f, evals in seen.items() if len(evals) == runs and min(evals) >= 2)


def frame_rounds(entry: Dict[str, Any], frame: int, target: str) -> Dict[str, Any]:
    """Mean rounds to ``target`` in ``frame`` over the seeds that reached it, how many did, and the
    mean with a seed that never did counted at the frame's length (a lower bound, ``censored``)."""
    rounds, censored, seeds = [], [], 0
    for run in entry.get("runs", []):
        for p in run.get("periods", []):
            if int(p["period"]) != frame:
                continue
            seeds += 1
            n = (p.get("rounds_to_seen") or {}).get(target)
            if n is not None:
                rounds.append(n)
            censored.append(n if n is not None else p.get("rounds", 0))
    return {"rounds": float(np.mean(rounds)) if rounds else None,
            "rounds_std": float(np.std(rounds)) if rounds else None,
            "censored": float(np.mean(censored)) if censored else None,
            "reached": len(rounds), "seeds": seeds}


def _per_round(entry: Dict[str, Any], key: str) -> Optional[float]:
    values = [r[key] / r["versions"] for r in entry.get("runs", [])
              if r.get(key) is not None and r.get("versions")]
    return float(np.mean(values)) if values else None


def _frames_of(methods: Dict[str, Any], summary: Dict[str, Any], first_frame: int) -> List[int]:
    end_s = float(summary.get("duration_s") or float("inf"))
    frames = sorted({f for e in methods.values() for f in _frames(e, end_s) if f >= first_frame})
    if not frames:
        raise StreamflError("the run has no frames from %d on (is it a new-class frame scenario?)"
                            % first_frame)
    return frames


def _selected(summary: Dict[str, Any], methods: Optional[Sequence[str]]) -> Dict[str, Any]:
    every = summary.get("methods") or {}
    chosen = every if methods is None else {m: every[m] for m in methods if m in every}
    if not chosen:
        raise StreamflError("the run has no methods to tabulate")
    return chosen


#: (change in percent against the reference, whether it is a bound, its spread over seeds or None)
Change = Tuple[Optional[float], bool, Optional[float]]


def _change_cell(change: Change) -> str:
    """"-45% ± 5" (the spread: std over seeds of each seed's own change), "~+0%" (a bound), or
    "–" (no reference figure)."""
    pct, bound, spread = change
    if pct is None:
        return "–"
    return "%s%+.0f%%%s" % ("~" if bound else "", pct, "" if spread is None else " ± %.0f" % spread)


def _seed_total(run: Dict[str, Any], frames: Sequence[int], targets: Sequence[str]) -> float:
    """One run's rounds to every target in every frame, a target never reached counted at its
    frame's length."""
    total = 0.0
    for p in run.get("periods", []):
        if int(p["period"]) in frames:
            for t in targets:
                n = (p.get("rounds_to_seen") or {}).get(t)
                total += n if n is not None else p.get("rounds", 0)
    return total


def _seed_spread(entry: Dict[str, Any], ref: Dict[str, Any], frames: Sequence[int],
                 targets: Sequence[str]) -> Optional[float]:
    """The std over seeds of each seed's change in percent against the reference's run of the
    same seed (runs paired by ``seed``, else by order); None with fewer than two pairs."""
    def by_seed(runs):
        return {r.get("seed", k): r for k, r in enumerate(runs)}
    mine, theirs = by_seed(entry.get("runs", [])), by_seed(ref.get("runs", []))
    changes = []
    for seed in sorted(set(mine) & set(theirs), key=str):
        base = _seed_total(theirs[seed], frames, targets)
        if base > 0:
            changes.append(100.0 * (_seed_total(mine[seed], frames, targets) / base - 1.0))
    return float(np.std(changes)) if len(changes) >= 2 else None


def _rounds_cells(entry: Dict[str, Any], ref: Optional[Dict[str, Any]], frames: Sequence[int],
                  targets: Sequence[str]) -> Tuple[List[str], Optional[Change]]:
    """One cell per (target, frame): mean ± std rounds (reached/seeds); and the change in percent
    of their sum against ``ref``, whether it is a bound (some seed never reached a target) and
    its spread over seeds, None without ref."""
    cells: List[str] = []
    total = ref_total = 0.0
    bound = False
    for t in targets:
        for f in frames:
            got = frame_rounds(entry, f, t)
            if got["rounds"] is None:
                cells.append("– (0/%d)" % got["seeds"])
            else:
                note = ("" if got["reached"] == got["seeds"]
                        else " (%d/%d)" % (got["reached"], got["seeds"]))
                cells.append("%.1f ± %.1f%s" % (got["rounds"], got["rounds_std"], note))
            total += got["censored"] or 0.0
            bound |= got["reached"] < got["seeds"]
            if ref is not None:
                ref_got = frame_rounds(ref, f, t)
                ref_total += ref_got["censored"] or 0.0
                bound |= ref_got["reached"] < ref_got["seeds"]
    if ref is None:
        return cells, None
    if ref_total <= 0:
        return cells, (None, bound, None)
    return cells, (100.0 * (total / ref_total - 1.0), bound, _seed_spread(entry, ref, frames, targets))


def frames_table(summary: Dict[str, Any], targets: Sequence[str], reference: Optional[str] = "random",
                 first_frame: int = 1, methods: Optional[Sequence[str]] = None,
                 noise: Optional[Dict[str, Tuple[float, float]]] = None) -> str:
    """One row per method: rounds to each target in each frame from ``first_frame`` on; the change
    in their sum against ``reference`` ("~": some seed never reached a target, counted at its
    frame's length, so the figure is a bound; "±": its spread over seeds); devices per round,
    training joules per round and final accuracy; with ``noise`` (``schedule_noise``), eq. 17's
    sigma and L per method that measures them."""
    chosen = _selected(summary, methods)
    frames = _frames_of(chosen, summary, first_frame)
    ref = (summary.get("methods") or {}).get(reference) if reference else None
    header = ["method"]
    for t in targets:
        header += ["frame %d to %s (rounds)" % (f, t) for f in frames]
    if ref is not None:
        header.append("rounds vs `%s`" % reference)
    header += ["devices per round", "training J per round", "final accuracy"]
    header += [] if noise is None else ["sigma / L (eq. 17)"]
    rows = []
    for name, entry in chosen.items():
        cells, vs = _rounds_cells(entry, ref, frames, targets)
        dpr = entry.get("devices_per_round")
        jpr = _per_round(entry, "train_energy_j")
        acc, acc_std = entry.get("final_accuracy"), entry.get("final_accuracy_std")
        rows.append(["`%s`" % name] + cells + ([] if vs is None else [_change_cell(vs)]) + [
            "–" if dpr is None else "%.1f" % dpr, "–" if jpr is None else "%.1f" % jpr,
            "–" if acc is None else "%.3f ± %.3f" % (acc, acc_std or 0.0)])
        if noise is not None:
            sl = noise.get(name)
            rows[-1].append("–" if sl is None else "%.2f / %.2f" % sl)
    return markdown_rows(header, rows)


def schedule_noise(metrics_path: Path, first_frame: int = 1) -> Dict[str, Tuple[float, float]]:
    """Per method, the mean over its ``schedule`` lines from ``first_frame`` on of eq. 17's
    gradient-noise scale sigma and eq. 18's L (``L_mean``), for the methods that measure both
    from the devices' reports (a sigma set in the config, or the default before any report, is
    left out; so are methods that ask for no class gradients); {} without a metrics file."""
    import json
    sums: Dict[str, List[float]] = {}
    try:
        lines = Path(metrics_path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return {}
    for line in lines:
        if '"schedule"' not in line:
            continue
        e = json.loads(line)
        if e.get("event") != "schedule" or int(e.get("frame") or 0) < first_frame:
            continue
        sigma, L = e.get("sigma"), e.get("L_mean")
        if e.get("sigma_from") == "reports" and isinstance(sigma, (int, float)) \
                and isinstance(L, (int, float)) and L > 0:
            acc = sums.setdefault(e.get("method", ""), [0.0, 0.0, 0.0])
            acc[0] += sigma
            acc[1] += L
            acc[2] += 1
    return {m: (a[0] / a[2], a[1] / a[2]) for m, a in sums.items() if a[2]}


def grid_table(runs: Sequence[Tuple[str, Dict[str, Any]]], targets: Sequence[str],
               reference: Optional[str] = "random", first_frame: int = 1,
               methods: Optional[Sequence[str]] = None) -> str:
    """Several runs of one scenario side by side (a deadline sweep, say), one row per method: for
    each ``(label, summary)`` the rounds to the targets (joined by " / "), the change against
    ``reference`` and the devices per round. A method missing from a run gets "–" there."""
    if not runs:
        raise StreamflError("no runs to tabulate")
    names: List[str] = list(methods) if methods is not None else []
    if methods is None:
        for _, summary in runs:
            names += [m for m in (summary.get("methods") or {}) if m not in names]
    header = ["method"]
    columns = []
    for label, summary in runs:
        chosen = _selected(summary, names)
        frames = _frames_of(chosen, summary, first_frame)
        every = summary.get("methods") or {}
        ref = every.get(reference) if reference else None
        header += ["%s: to %s (rounds)" % (label, " / ".join(targets))]
        header += ([] if ref is None else ["%s: vs `%s`" % (label, reference)]) + ["%s: devices" % label]
        columns.append((every, ref, frames))
    rows = []
    for name in names:
        row = ["`%s`" % name]
        for every, ref, frames in columns:
            entry = every.get(name)
            if entry is None:
                row += ["–"] * (3 if ref is not None else 2)
                continue
            cells, vs = _rounds_cells(entry, ref, frames, targets)
            dpr = entry.get("devices_per_round")
            row += [" / ".join(cells)] + ([] if vs is None else [_change_cell(vs)])
            row.append("–" if dpr is None else "%.1f" % dpr)
        rows.append(row)
    return markdown_rows(header, rows)


def frames_for_run(run_dir: Path, targets: Sequence[str], reference: Optional[str] = "random",
                   methods: Optional[Sequence[str]] = None) -> str:
    """``frames_table`` of the run in ``run_dir`` (``methods``: those rows only, in that order)."""
    return frames_table(read_summary(Path(run_dir) / "summary.json"), targets, reference,
                        methods=methods, noise=schedule_noise(Path(run_dir) / "metrics.jsonl"))


def overview_table(runs: Sequence[Tuple[str, Dict[str, Any], Sequence[str]]],
                   reference: str = "random", first_frame: int = 1,
                   methods: Optional[Sequence[str]] = None) -> str:
    """Only the change against ``reference`` per method for each ``(label, summary, targets)``
    (settings with their own targets, e.g. datasets), and its mean over the settings ("~" when
    any is a bound)."""
    if not runs:
        raise StreamflError("no runs to tabulate")
    names = list(methods) if methods is not None else list(runs[0][1].get("methods") or {})
    header = ["method"] + [label for label, _, _ in runs] + ["mean"]
    rows = []
    for name in names:
        row, values, bound = ["`%s`" % name], [], False
        for _, summary, targets in runs:
            every = summary.get("methods") or {}
            entry, ref = every.get(name), every.get(reference)
            if entry is None or ref is None:
                row.append("–")
                continue
            _, vs = _rounds_cells(entry, ref, _frames_of({name: entry}, summary, first_frame), targets)
            row.append(_change_cell(vs))
            if vs[0] is not None:
                bound |= vs[1]
                values.append(vs[0])
        row.append(_change_cell((float(np.mean(values)) if values else None, bound, None)))
        rows.append(row)
    return markdown_rows(header, rows)


def grid_for_runs(run_dirs: Sequence[Path], targets: Sequence[str], reference: Optional[str] = "random",
                  methods: Optional[Sequence[str]] = None,
                  labels: Optional[Sequence[str]] = None) -> str:
    """``grid_table`` of the runs in ``run_dirs``, labelled by ``labels`` (default: folder names)."""
    return grid_table([(name, read_summary(Path(d) / "summary.json"))
                       for name, d in _labelled(run_dirs, labels)], targets, reference, methods=methods)


def _labelled(run_dirs: Sequence[Path], labels: Optional[Sequence[str]]) -> List[Tuple[str, Path]]:
    """``(label, folder)`` pairs: ``labels`` in order, else the folders' names."""
    if labels is not None and len(labels) != len(run_dirs):
        raise StreamflError("%d labels for %d run folders" % (len(labels), len(run_dirs)))
    names = labels if labels is not None else [Path(d).name for d in run_dirs]
    return [(name.strip(), Path(d)) for name, d in zip(names, run_dirs)]


def overview_for_runs(run_dirs: Sequence[Path], targets: Sequence[Sequence[str]],
                      reference: str = "random", methods: Optional[Sequence[str]] = None,
                      labels: Optional[Sequence[str]] = None) -> str:
    """``overview_table`` of the runs in ``run_dirs``, with one target list each (or one for all)."""
    if len(targets) not in (1, len(run_dirs)):
        raise StreamflError("%d target lists for %d run folders" % (len(targets), len(run_dirs)))
    lists = list(targets) * len(run_dirs) if len(targets) == 1 else list(targets)
    return overview_table([(name, read_summary(d / "summary.json"), t)
                           for (name, d), t in zip(_labelled(run_dirs, labels), lists)], reference,
                          methods=methods)


def section(run_dirs: Sequence[Path], methods: Optional[Sequence[str]], option: str,
            reference: Optional[str] = "random", labels: Optional[Sequence[str]] = None,
            overview: bool = False) -> str:
    """``streamfl report DIR... --section frames --option TARGETS``: rounds to these comma-separated
    accuracies after each new-class frame (one folder), or the folders side by side; with
    ``overview``, only each folder's change against ``reference`` and their mean, and then
    ``option`` may give one target list per folder, separated by ';'."""
    lists = [[t.strip() for t in part.split(",") if t.strip()]
             for part in option.split(";") if part.strip()]
    if not lists:
        raise ConfigError("section frames: --option takes comma-separated target accuracies, e.g. 0.7,0.8")
    if overview:
        return overview_for_runs(run_dirs, lists, reference, methods, labels)
    if len(lists) > 1:
        raise ConfigError("one target list per folder goes with --overview only")
    if len(run_dirs) == 1:
        return frames_for_run(run_dirs[0], lists[0], reference, methods)
    return grid_for_runs(run_dirs, lists[0], reference, methods, labels)
