"""Benchmark one FedTeddi scheduling decision (eq. 14 allocation + greedy) for 10,000 devices, one core.

A fleet of ``--devices`` devices with Dirichlet class mixes over ``--classes`` classes (a quarter of
them drifted to a new mix since the last frame) shares one wireless cell as in the paper's sec. V-A:
devices uniform in a 250 m disc, path loss 128.1 + 37.6 log10(d_km) dB, 8 dB log-normal shadowing,
23 dBm transmit power, -174 dBm/Hz noise, 20 MHz in total, compute time shifted-exponential (eq. 4,
0.5 ms/sample + Exp with 2 samples/ms) over tau x b samples, deadline 1 s. A decision is
``allocate_bandwidth`` for every device, then ``greedy_select`` under that budget; median of the
repeats (goal: under 50 ms). Also each scheduling policy's ``select`` on the same fleet and band
(``policies_select_ms``, for comparison; no goal), and the cost of one greedy step, from a run forced to take
``--long-steps`` steps (eq. 17 always holding, no budget), so a longer selection can be extrapolated.

Prints one JSON object; exit 1 if the goal is missed.
Usage: python bench/bench_scheduler.py [--devices 10000] [--classes 10] [--repeats 9]
"""
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core, before numpy loads its BLAS
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from streamfl.methods.schedule.policies import (  # noqa: E402
    POLICIES, allocate_bandwidth, greedy_select, make_policy,
)
from streamfl.methods.schedule.policies.base import Budget, Candidates, RoundInfo  # noqa: E402

GOAL_MS = 50.0


def fleet(devices: int, classes: int, seed: int):
    """Class mixes, sample counts and the paper's channel and compute model for a fleet."""
    rng = np.random.default_rng(seed)
    p_prev = rng.dirichlet(np.full(classes, 0.5), size=devices)
    p_now = p_prev.copy()
    drifted = rng.random(devices) < 0.25
    p_now[drifted] = rng.dirichlet(np.full(classes, 0.5), size=int(drifted.sum()))
    samples = rng.integers(100, 1000, size=devices).astype(np.float64)
    distance_km = 0.25 * np.sqrt(rng.random(devices)) + 1e-3
    loss_db = 128.1 + 37.6 * np.log10(distance_km) + rng.normal(0.0, 8.0, size=devices)
    channel_gain = 10.0 ** (-loss_db / 10.0)
    tau_b = 5 * 32  # local steps x batch
    compute_s = 0.5e-3 * tau_b + rng.exponential(tau_b / 2.0, size=devices) * 1e-3
    return p_now, p_prev, samples, channel_gain, compute_s


def _timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=10000)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=9, help="median of N timings")
    parser.add_argument("--model-bits", type=float, default=1.6e6, help="upload size D_s")
    parser.add_argument("--deadline-s", type=float, default=1.0)
    parser.add_argument("--total-bandwidth-hz", type=float, default=20e6)
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--round", type=int, default=1, help="k of K = 10 rounds in the frame")
    parser.add_argument("--long-steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    p_now, p_prev, samples, gain, compute_s = fleet(args.devices, args.classes, args.seed)
    L = np.ones(args.classes)
    noise_psd_w_per_hz = 10.0 ** (-174.0 / 10.0) * 1e-3
    tx_power_w = 10.0 ** (23.0 / 10.0) * 1e-3

    def decide():
        t0 = time.perf_counter()
        alloc = allocate_bandwidth(args.model_bits, compute_s, tx_power_w, gain, noise_psd_w_per_hz,
                                   args.deadline_s)
        t1 = time.perf_counter()
        chosen = greedy_select(p_now, p_prev, samples, L, args.round, 10, sigma=args.sigma,
                               bandwidth_hz=alloc.bandwidth_hz,
                               total_bandwidth_hz=args.total_bandwidth_hz)
        t2 = time.perf_counter()
        return (t2 - t0, t1 - t0, t2 - t1), chosen, alloc

    def forced(steps):
        t0 = time.perf_counter()
        chosen = greedy_select(p_now, p_prev, samples, L, args.round, 10, sigma=1e9,
                               max_devices=steps)
        return time.perf_counter() - t0, chosen

    decide()  # warm-up (imports, first allocations)
    timings = [decide()[0] for _ in range(args.repeats)]
    _, chosen, alloc = decide()
    one = statistics.median(forced(1)[0] for _ in range(args.repeats))
    long_s, long_chosen = min((forced(args.long_steps) for _ in range(max(1, args.repeats // 3))),
                              key=lambda r: r[0])
    per_step_ms = 1e3 * (long_s - one) / max(1, len(long_chosen) - 1)

    # Every policy the coordinator plug-in can run, on the same fleet and budget (for comparison).
    n = args.devices
    cand = Candidates(device_ids=tuple("d%d" % i for i in range(n)), p_now=p_now, p_prev=p_prev,
                      samples=samples, L=L, cost=alloc.bandwidth_hz,
                      grad_norm=np.random.default_rng(1).random(n), loss=np.random.default_rng(2).random(n),
                      snr_hz=gain * tx_power_w / noise_psd_w_per_hz, latency_s=compute_s)
    budget = Budget(total=args.total_bandwidth_hz)
    info = RoundInfo(k=args.round, K=10, sigma=args.sigma)
    policies_ms = {}
    for name in POLICIES:
        policy = make_policy(name, seed=args.seed)
        policy.select(cand, budget, info)
        policies_ms[name] = round(1e3 * statistics.median(
            _timed(policy.select, cand, budget, info) for _ in range(args.repeats)), 3)

    median_ms = 1e3 * statistics.median(t[0] for t in timings)
    result = {
        "benchmark": "fedteddi_scheduler",
        "devices": args.devices,
        "classes": args.classes,
        "repeats": args.repeats,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "feasible_devices": int(np.isfinite(alloc.bandwidth_hz).sum()),
        "selected": int(chosen.size),
        "bandwidth_used_hz": round(float(alloc.bandwidth_hz[chosen].sum())),
        "median_ms": round(median_ms, 3),
        "allocate_median_ms": round(1e3 * statistics.median(t[1] for t in timings), 3),
        "greedy_median_ms": round(1e3 * statistics.median(t[2] for t in timings), 3),
        "greedy_setup_ms": round(1e3 * one, 3),
        "greedy_step_ms": round(per_step_ms, 4),
        "policies_select_ms": policies_ms,
        "goal_ms": GOAL_MS,
        "met": median_ms < GOAL_MS,
    }
    print(json.dumps(result))
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
