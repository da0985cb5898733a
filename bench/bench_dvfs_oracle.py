"""DVFS oracle: clp-aware's energy for a fixed amount of training against the best fixed level.

For every shipped board with a power model (``PROFILE_NAMES`` less generic-linux, whose domains
and watts are discovered on the machine), the simulator's ``DeviceModel`` (sim/device.py:
compute-bound timings t ~ f_top/f from its default seconds per sample, FedTeddi eq. 4 noise from a
seeded generator, utilization-weighted power ``train_w``) trains ``--samples`` samples in back-to-
back rounds of ``--round-samples``:

1. clp-aware: the real policy (dvfs/policies/clp_aware.py through ``make_policy``) plans each round
   from DomainViews of the current levels, with the CLP flag set for the first ``--clp-fraction``
   of the rounds and clear after, and observes every round's seconds per sample for every domain,
   as sim/runtime.py and agent/core.py feed it. Boards boot with every domain at its top.
2. Oracle: every level of the scaled domains (the GPU on Jetsons, the CPU policies on Pis, all at
   that index), the other domains at their top as clp-aware leaves them, each for the same rounds
   with the same noise draws; the level with the least energy.

Energy of a run: total, the board's joules for the work (``train_w`` x round time; back to back,
the wall time is the rounds' time, so this is idle power over the wall time plus what training
adds), and train-only, what training adds above idle (``(train_w - idle_w)`` x round time). Each
has its own oracle. Goal: clp-aware's total energy at most 1.10 x the total oracle's on every board,
checked per policy setting (``SETTINGS``); the JSON says which settings meet it.

With ``--seeds N`` the whole comparison runs for seeds ``seed .. seed+N-1`` (the noise draws of
the timings; the clp-aware policy reacts to them, the oracle's level may move): ``over_seeds``
gives each setting's ratio per board as mean, population standard deviation, min and max, and a
setting meets the goal only if it does on every board for every seed. ``boards`` details the
first seed.

Prints one JSON document; exit 1 if no setting meets the goal on every board.
Usage: python bench/bench_dvfs_oracle.py [--samples 51200] [--clp-fraction 0.3] [--seeds 1] [--boards a,b]
"""
import argparse
import json
import logging
import math
import platform
import sys
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from streamfl.dvfs.policies.base import DomainView, PolicyInput
from streamfl.dvfs.policies.factory import make_policy
from streamfl.dvfs.profiles import GENERIC, PROFILE_NAMES, load_profile
from streamfl.dvfs.utilization import power_table
from streamfl.sim.device import DeviceModel, DeviceSpec

GOAL_RATIO = 1.10
#: The "efficient+cap" setting's ``climb_energy_ratio``: the goal's 10%, as an operator would set it
#: for that goal (the cap bounds the post-CLP phase in the model; the bench checks the real policy,
#: its noisy timings and climb rule, stays within it).
CLIMB_ENERGY_RATIO = 1.10
#: Policy settings compared: name -> (what it is, options from the board's DeviceModel).
SETTINGS: Dict[str, Tuple[str, Callable[[DeviceModel], Dict[str, Any]]]] = {
    "paper": ("clp-aware defaults: AdaCLP s4.2.1, the CLP at the lowest level", lambda dm: {}),
    "efficient": ("clp_level efficient: the CLP at the first energy-per-sample minimum from "
                  "below, power_w from the board's power_table",
                  lambda dm: {"clp_level": "efficient",
                              "power_w": power_table(dm.profile, dm.utilization)}),
    "efficient+cap": ("clp_level efficient and climb_energy_ratio %.2f: the climb after the CLP "
                      "stops below levels over %.0f%% above the efficient level's energy per "
                      "sample" % (CLIMB_ENERGY_RATIO, 100 * (CLIMB_ENERGY_RATIO - 1)),
                      lambda dm: {"clp_level": "efficient",
                                  "climb_energy_ratio": CLIMB_ENERGY_RATIO,
                                  "power_w": power_table(dm.profile, dm.utilization)}),
}


def boards_with_power_model() -> List[str]:
    """Shipped profiles whose YAML has domains and watts (generic-linux discovers its own)."""
    return [name for name in PROFILE_NAMES if name != GENERIC and load_profile(name).domains]


def device(board: str, seed: int, noise_scale: float) -> DeviceModel:
    """A fresh device of ``board`` whose noise draws start from ``seed``."""
    return DeviceModel(DeviceSpec(board=board, noise_scale=noise_scale), load_profile(board), seed)


class Run:
    """Joules and seconds of one schedule of rounds, total and per phase."""

    def __init__(self, idle_w: float):
        self.idle_w = idle_w
        self.time_s = 0.0
        self.total_j = 0.0
        self.train_only_j = 0.0
        #: Per phase ("clp", "post"): [seconds, total joules, samples].
        self.phases: Dict[str, List[float]] = {"clp": [0.0, 0.0, 0], "post": [0.0, 0.0, 0]}
        self.levels: List[int] = []

    def add(self, phase: str, watts: float, seconds: float, samples: int) -> None:
        """One round at ``watts`` for ``seconds``."""
        self.time_s += seconds
        self.total_j += watts * seconds
        self.train_only_j += (watts - self.idle_w) * seconds
        row = self.phases[phase]
        row[0] += seconds
        row[1] += watts * seconds
        row[2] += samples


def schedule(samples: int, round_samples: int, clp_fraction: float) -> List[Tuple[int, bool]]:
    """(samples, in CLP) per round: ``samples`` in rounds of ``round_samples`` (the last one
    shorter), the first ``clp_fraction`` of the rounds in the CLP."""
    rounds = max(1, int(math.ceil(samples / float(round_samples))))
    clp_rounds = int(round(clp_fraction * rounds))
    out = []
    left = samples
    for k in range(rounds):
        n = min(round_samples, left)
        left -= n
        out.append((n, k < clp_rounds))
    return out


def run_fixed(board: str, level: int, plan: Sequence[Tuple[int, bool]], seed: int,
              noise_scale: float) -> Run:
    """The schedule with the scaled domains pinned at ``level``, the rest at their top."""
    dm = device(board, seed, noise_scale)
    levels = dict(dm.top_levels, **{name: level for name in dm.scaled_domains})
    watts = dm.train_w(levels)
    run = Run(dm.idle_w)
    for n, in_clp in plan:
        run.add("clp" if in_clp else "post", watts, dm.compute_s(n, levels), n)
        run.levels.append(level)
    return run


def run_policy(board: str, options: Mapping[str, Any], plan: Sequence[Tuple[int, bool]], seed: int,
               noise_scale: float) -> Run:
    """The schedule under the real clp-aware policy, fed as the simulator's runtime feeds it."""
    dm = device(board, seed, noise_scale)
    policy = make_policy("clp-aware", **options)
    levels = dm.top_levels
    run = Run(dm.idle_w)
    for n, in_clp in plan:
        views = tuple(DomainView(name, dom.kind, dm.levels_khz[name], levels[name])
                      for name, dom in ((d.name, d) for d in dm.profile.domains))
        levels.update(policy.plan(PolicyInput(in_clp, views)))
        compute_s = dm.compute_s(n, levels)
        run.add("clp" if in_clp else "post", dm.train_w(levels), compute_s, n)
        run.levels.append(levels[dm.scaled_domains[0]])
        for name, level in levels.items():            # AgentCore.observe_clocks
            policy.observe(name, level, compute_s / max(1, n))
    return run


def per_sample_j(run: Run, phase: str) -> Optional[float]:
    """Total joules per sample in one phase; None if the phase had no samples."""
    _, joules, samples = run.phases[phase]
    return joules / samples if samples else None


def bench_board(board: str, samples: int, round_samples: int, clp_fraction: float, seed: int,
                noise_scale: float) -> Dict[str, Any]:
    """Sweep, oracles and every policy setting on one board."""
    dm = device(board, seed, noise_scale)
    plan = schedule(samples, round_samples, clp_fraction)
    scaled = dm.scaled_domains
    ladder = dm.levels_khz[scaled[0]]
    sweep = [run_fixed(board, level, plan, seed, noise_scale) for level in range(len(ladder))]

    def best(key: str) -> int:
        return min(range(len(sweep)), key=lambda i: getattr(sweep[i], key))

    oracle_total, oracle_train = best("total_j"), best("train_only_j")
    o_run = sweep[oracle_total]
    out: Dict[str, Any] = {
        "board": board, "scaled_domains": list(scaled), "levels": len(ladder),
        "idle_w": dm.idle_w, "utilization": dm.utilization,
        "rounds": len(plan), "clp_rounds": sum(1 for _, c in plan if c), "samples": samples,
        "oracle": {
            "total": {"level": oracle_total, "khz": ladder[oracle_total],
                      "energy_j": round(o_run.total_j, 3), "time_s": round(o_run.time_s, 3)},
            "train_only": {"level": oracle_train, "khz": ladder[oracle_train],
                           "energy_j": round(sweep[oracle_train].train_only_j, 3),
                           "time_s": round(sweep[oracle_train].time_s, 3)}},
        "top": {"total_j": round(sweep[-1].total_j, 3),
                "train_only_j": round(sweep[-1].train_only_j, 3),
                "time_s": round(sweep[-1].time_s, 3),
                "ratio_total": round(sweep[-1].total_j / o_run.total_j, 4)},
        "settings": {},
        # [level, kHz, seconds, train-only J, total J] of every fixed level.
        "sweep": [[i, ladder[i], round(r.time_s, 3), round(r.train_only_j, 3), round(r.total_j, 3)]
                  for i, r in enumerate(sweep)],
    }
    oracle_j_per_sample = o_run.total_j / samples
    for name, (_, options) in SETTINGS.items():
        run = run_policy(board, options(dm), plan, seed, noise_scale)
        clp_levels = sorted({lv for lv, (_, c) in zip(run.levels, plan) if c})
        ratio = run.total_j / o_run.total_j
        clp_j, post_j = per_sample_j(run, "clp"), per_sample_j(run, "post")
        out["settings"][name] = {
            "energy_j": round(run.total_j, 3), "train_only_j": round(run.train_only_j, 3),
            "time_s": round(run.time_s, 3),
            "ratio_total": round(ratio, 4),
            "ratio_train_only": round(run.train_only_j / sweep[oracle_train].train_only_j, 4),
            "time_ratio": round(run.time_s / o_run.time_s, 4),
            "meets_goal": ratio <= GOAL_RATIO,
            "clp_levels": clp_levels, "final_level": run.levels[-1],
            # Joules per sample in each phase against the total oracle's: which phase costs.
            "clp_phase_vs_oracle": (None if clp_j is None
                                    else round(clp_j / oracle_j_per_sample, 4)),
            "post_phase_vs_oracle": (None if post_j is None
                                     else round(post_j / oracle_j_per_sample, 4)),
        }
    return out


def diagnose(row: Dict[str, Any], setting: Dict[str, Any]) -> Optional[str]:
    """Why a setting misses the goal on a board, from its phases; None when it meets it."""
    if setting["meets_goal"]:
        return None
    oracle = row["oracle"]["total"]["level"]
    reasons = []
    clp, post = setting["clp_phase_vs_oracle"], setting["post_phase_vs_oracle"]
    if clp is not None and clp > GOAL_RATIO:
        reasons.append("the CLP ran at level %s, %.2fx the oracle's (level %d) joules per sample"
                       % ("/".join(str(v) for v in setting["clp_levels"]), clp, oracle))
    if post is not None and post > GOAL_RATIO:
        reasons.append("after the CLP the climb went to level %d (its time threshold only), "
                       "%.2fx the oracle's joules per sample" % (setting["final_level"], post))
    return "; ".join(reasons) or "both phases within %.2fx, together above it" % GOAL_RATIO


def dumps(doc: Dict[str, Any]) -> str:
    """JSON with one line per top-level key, and per row where the value is a list of rows."""
    parts = []
    for key, value in doc.items():
        if isinstance(value, list) and value:
            rows = ",\n".join("  " + json.dumps(row) for row in value)
            parts.append(" %s: [\n%s]" % (json.dumps(key), rows))
        elif isinstance(value, dict) and value:
            rows = ",\n".join("  %s: %s" % (json.dumps(k), json.dumps(v)) for k, v in value.items())
            parts.append(" %s: {\n%s}" % (json.dumps(key), rows))
        else:
            parts.append(" %s: %s" % (json.dumps(key), json.dumps(value)))
    return "{\n" + ",\n".join(parts) + "\n}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=51200, help="training work per run")
    parser.add_argument("--round-samples", type=int, default=256, help="samples per round")
    parser.add_argument("--clp-fraction", type=float, default=0.3,
                        help="share of the rounds in the CLP (the rest after it)")
    parser.add_argument("--noise-scale", type=float, default=DeviceSpec.noise_scale,
                        help="FedTeddi eq. 4 noise of DeviceSpec (exponential mean / shift)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=1,
                        help="run seeds seed .. seed+N-1 and report each ratio's spread over them")
    parser.add_argument("--boards", default=None,
                        help="comma-separated profiles (default: every one with a power model)")
    args = parser.parse_args(argv)
    if (args.samples < 1 or args.round_samples < 1 or args.seeds < 1
            or not 0.0 <= args.clp_fraction <= 1.0):
        parser.error("--samples, --round-samples and --seeds must be >= 1, --clp-fraction within [0, 1]")
    boards = args.boards.split(",") if args.boards else boards_with_power_model()
    logging.basicConfig(level=logging.ERROR)
    started = time.monotonic()
    seeds = list(range(args.seed, args.seed + args.seeds))
    runs = [[bench_board(b, args.samples, args.round_samples, args.clp_fraction, seed,
                         args.noise_scale) for b in boards] for seed in seeds]
    rows = runs[0]
    for run in runs:
        for row in run:
            for setting in row["settings"].values():
                setting["why_missed"] = diagnose(row, setting)
    goals = {}
    over_seeds: Dict[str, Dict[str, Dict[str, float]]] = {}
    for name, (what, _) in SETTINGS.items():
        ratios = {r["board"]: r["settings"][name]["ratio_total"] for r in rows}
        goals[name] = {"what": what, "ratio_total": ratios,
                       "worst": max(r["settings"][name]["ratio_total"] for run in runs for r in run),
                       "boards_meeting": sum(all(run[i]["settings"][name]["meets_goal"] for run in runs)
                                             for i in range(len(boards))),
                       "pass": all(r["settings"][name]["meets_goal"] for run in runs for r in run)}
        over_seeds[name] = {}
        for i, board in enumerate(boards):
            values = [run[i]["settings"][name]["ratio_total"] for run in runs]
            mean = sum(values) / len(values)
            over_seeds[name][board] = {
                "mean": round(mean, 4),
                "std": round(math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)), 4),
                "min": min(values), "max": max(values)}
    oracle_levels = {board: sorted({run[i]["oracle"]["total"]["level"] for run in runs})
                     for i, board in enumerate(boards)}
    meeting = [name for name, g in goals.items() if g["pass"]]
    notes = [
        "Every figure is the simulator's model, not a measurement [U]: per-level watts from the "
        "board YAMLs (full-load figures from model_watts, see each file's sources), weighted by "
        "training_utilization (GPU 1.0 and one core per CPU cluster on Jetsons, every core on "
        "Pis; each row's utilization), and compute-bound timings t ~ f_top/f. A memory-bound "
        "model gains less time from a higher clock, which moves every optimum lower.",
        "Total vs train-only: without the idle floor the slowest levels look cheapest (dynamic "
        "power falls faster than time grows), so the train-only oracle sits at or below the "
        "total one and every setting that runs faster than it scores worse there. The goal is "
        "judged on total energy, what the board's meter reads for the work.",
        "paper (AdaCLP s4.2.1 as written) runs the CLP at the lowest level: on the Jetson Nano "
        "and Xavier NX that GPU level is 9-12x slower than the top and the board's idle power "
        "and the core feeding the GPU are paid all that time; after the CLP the time-only climb "
        "runs to the top, about 20% over the oracle per sample on the AGX Orin (its GPU's 30 W).",
        "efficient fixes the CLP phase (its level is the sweep's oracle up to rounding and noise); "
        "efficient+cap also bounds the post-CLP climb by energy. A cap equal to the goal meets it "
        "by construction in the model: the bench checks that the real policy, on noisy timings "
        "and its climb rule, stays within it, and what it costs in time (time_ratio, against the "
        "oracle's run).",
        "Phases: clp_phase_vs_oracle and post_phase_vs_oracle are each phase's joules per sample "
        "over the total oracle's whole-run joules per sample (its noise mean differs per phase "
        "by under 1%).",
    ]
    result = {
        "benchmark": "dvfs_clp_aware_vs_fixed_level_oracle",
        "machine": {"python": platform.python_version(), "machine": platform.machine()},
        "method": [line.strip() for line in __doc__.strip().splitlines()[2:-3]],
        "parameters": {"samples": args.samples, "round_samples": args.round_samples,
                       "clp_fraction": args.clp_fraction, "noise_scale": args.noise_scale,
                       "seed": args.seed, "seeds": seeds, "goal_ratio_total": GOAL_RATIO},
        "boards": rows,
        "goals": goals,
        "over_seeds": over_seeds,
        "oracle_levels_over_seeds": oracle_levels,
        "settings_meeting_goal": meeting,
        "notes": notes,
        "pass": bool(meeting),
        "elapsed_s": round(time.monotonic() - started, 2),
    }
    print(dumps(result))
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
