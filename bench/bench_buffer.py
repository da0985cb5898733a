"""Benchmark the agent buffer: inserts/s (goal >= 100,000) and minibatch samples/s; prints JSON.

Usage: python bench/bench_buffer.py [--capacity 2048] [--inserts 200000] [--batch 32]
"""
import argparse
import json
import sys
import time

import numpy as np

from streamfl.agent.buffer import Buffer, ReplacementPolicy

GOAL_INSERTS_PER_S = 100000


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=2048)
    parser.add_argument("--window-len", type=int, default=50)
    parser.add_argument("--channels", type=int, default=6)
    parser.add_argument("--classes", type=int, default=6)
    parser.add_argument("--inserts", type=int, default=200000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batches", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3, help="best of N timings")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    pool = 1024
    windows = [rng.standard_normal((args.window_len, args.channels)).astype(np.float32)
               for _ in range(pool)]
    labels = [int(v) for v in rng.integers(0, args.classes, size=pool)]

    def time_inserts(policy):
        best = float("inf")
        for _ in range(args.repeats):
            buf = Buffer(args.capacity, args.window_len, args.channels, args.classes, policy)
            add = buf.add
            t0 = time.perf_counter()
            for i in range(args.inserts):
                j = i % pool
                add(windows[j], labels[j])
            best = min(best, time.perf_counter() - t0)
        assert sum(buf.counts) == len(buf) == min(args.capacity, args.inserts)
        return best, buf

    # A plain ReplacementPolicy behaves like FIFO but takes the generic hook path a DDS policy uses.
    best_hook_s, _ = time_inserts(ReplacementPolicy())
    best_insert_s, buf = time_inserts(None)

    sample_rng = np.random.default_rng(1)
    best_sample_s = float("inf")
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for _ in range(args.batches):
            buf.sample(args.batch, sample_rng)
        best_sample_s = min(best_sample_s, time.perf_counter() - t0)

    inserts_per_s = args.inserts / best_insert_s
    result = {
        "benchmark": "agent_buffer",
        "capacity": args.capacity,
        "window_shape": [args.window_len, args.channels],
        "buffer_bytes": buf.nbytes,
        "inserts": args.inserts,
        "inserts_per_s": round(inserts_per_s),
        "insert_us": round(1e6 * best_insert_s / args.inserts, 3),
        "inserts_per_s_policy_hook": round(args.inserts / best_hook_s),
        "batch_size": args.batch,
        "minibatches_per_s": round(args.batches / best_sample_s),
        "minibatch_samples_per_s": round(args.batches * args.batch / best_sample_s),
        "goal_inserts_per_s": GOAL_INSERTS_PER_S,
        "meets_goal": inserts_per_s >= GOAL_INSERTS_PER_S,
    }
    print(json.dumps(result, indent=2))
    return 0 if result["meets_goal"] else 1


if __name__ == "__main__":
    sys.exit(main())
