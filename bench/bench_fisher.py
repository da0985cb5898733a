"""Benchmark the Fisher trace's share of a local round (goal <= 10%; AdaCLP sec. 5.4.5: 32-40%).

A round is tau SGD steps of batch B through ``LocalTrainer`` plus one Fisher trace on a B-window
subsample of the buffer. Compares the one-backward estimator (``models.fisher.fisher_trace``) with
the naive per-sample form (B forward/backward passes of one window), all timed in the same run,
interleaved, median of the repeats; also the relative spread of each estimator over independent
draws (one round's noise) and the share at smaller subsamples, among them the agent's default
``plugins.clp.fisher_samples`` (20), which is what a board runs each round. Prints JSON.

Usage: python bench/bench_fisher.py [--model lstm] [--tau 5] [--batch 50] [--repeats 9]
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np
import torch

from streamfl.agent.config import AgentConfig
from streamfl.agent.trainer import LocalTrainer
from streamfl.models import ModelSpec, build_model
from streamfl.models.fisher import fisher_trace

#: The agent's default subsample for the per-round trace (the clp plug-in's ``fisher_samples``).
AGENT_FISHER_SAMPLES = AgentConfig(device_id="bench").plugins["clp"].fisher_samples
GOAL_SHARE = 0.10


def per_sample_fisher(model, X, num_samples, generator):
    """The naive estimator: mean over B windows of ||grad log p(yhat|x)||^2, one backward each."""
    idx = torch.randperm(len(X), generator=generator)[:num_samples]
    params = [p for p in model.parameters() if p.requires_grad]
    was = model.training
    model.eval()
    total = 0.0
    try:
        for i in idx.tolist():
            log_p = torch.log_softmax(model(X[i:i + 1]), dim=1)[0]
            y = torch.multinomial(log_p.detach().exp(), 1, generator=generator)
            grads = torch.autograd.grad(log_p[y].sum(), params)
            total += float(sum(g.pow(2).sum() for g in grads))
    finally:
        model.train(was)
    return total / len(idx)


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="lstm")
    parser.add_argument("--tau", type=int, default=5, help="local SGD steps per round")
    parser.add_argument("--batch", type=int, default=50, help="SGD batch and Fisher subsample size")
    parser.add_argument("--buffer", type=int, default=512,
                        help="windows the Fisher subsamples from")
    parser.add_argument("--repeats", type=int, default=9, help="median of N rounds")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--draws", type=int, default=30,
                        help="independent estimates per subsample size for the relative spread")
    parser.add_argument("--sizes", type=int, nargs="*", default=[AGENT_FISHER_SAMPLES, 10],
                        help="smaller Fisher subsamples to time and measure besides --batch")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    spec = ModelSpec(name=args.model)
    model = build_model(spec, seed=0)
    trainer = LocalTrainer(model, spec.num_classes)
    rng = np.random.default_rng(0)
    buf_X = rng.normal(size=(args.buffer, spec.window_len, spec.in_channels)).astype(np.float32)
    buf_y = rng.integers(0, spec.num_classes, size=args.buffer)
    X_t = torch.from_numpy(buf_X)
    gen = torch.Generator().manual_seed(0)

    def train():
        idx = [rng.integers(0, args.buffer, size=args.batch) for _ in range(args.tau)]
        trainer.run([(buf_X[i], buf_y[i]) for i in idx], lr=0.01)

    def one_backward():
        fisher_trace(model, X_t, num_samples=args.batch, generator=gen)

    def per_sample():
        per_sample_fisher(model, X_t, args.batch, gen)

    for fn in (train, one_backward, per_sample):  # warm-up
        fn()
    t_train, t_one, t_naive = [], [], []
    for _ in range(args.repeats):
        t_train.append(timed(train))
        t_one.append(timed(one_backward))
        t_naive.append(timed(per_sample))

    def shares(t_f):
        overhead = [f / t for f, t in zip(t_f, t_train)]
        share = [f / (t + f) for f, t in zip(t_f, t_train)]
        return {"median_s": statistics.median(t_f),
                "share_of_round": round(statistics.median(share), 4),
                "overhead_vs_training": round(statistics.median(overhead), 4)}

    one, naive = shares(t_one), shares(t_naive)

    def spread(fn):
        """Relative std of independent estimates at these weights: one round's noise."""
        vals = np.array([fn(torch.Generator().manual_seed(s)) for s in range(args.draws)])
        return {"mean": round(float(vals.mean()), 4),
                "rel_std": round(float(vals.std(ddof=1) / vals.mean()), 3)}

    one.update(spread(lambda g: fisher_trace(model, X_t, args.batch, g)))
    naive.update(spread(lambda g: per_sample_fisher(model, X_t, args.batch, g)))
    smaller = {}
    for k in args.sizes:
        t_k = []
        for t in t_train:
            t_k.append(timed(lambda: fisher_trace(model, X_t, num_samples=k, generator=gen)))
        entry = {"median_s": statistics.median(t_k),
                 "share_of_round": round(statistics.median(
                     [f / (t + f) for f, t in zip(t_k, t_train)]), 4)}
        entry.update(spread(lambda g: fisher_trace(model, X_t, k, g)))
        smaller[str(k)] = entry
    print(json.dumps({
        "model": spec.arch_id, "tau": args.tau, "batch": args.batch, "threads": args.threads,
        "repeats": args.repeats,
        "train_round_median_s": statistics.median(t_train),
        "fisher_one_backward": one,
        "fisher_per_sample": naive,
        "fisher_one_backward_smaller_subsample": smaller,
        "speedup_vs_per_sample": round(naive["median_s"] / one["median_s"], 2),
        "goal_share": GOAL_SHARE,
        "goal_met_at_batch_size": one["share_of_round"] <= GOAL_SHARE,
        # What an agent runs: the clp plug-in's fisher_samples windows (when --sizes includes it).
        "agent_fisher_samples": AGENT_FISHER_SAMPLES,
        "goal_met_as_the_agent_runs": (smaller[str(AGENT_FISHER_SAMPLES)]["share_of_round"] <= GOAL_SHARE
                                       if str(AGENT_FISHER_SAMPLES) in smaller else None),
        "paper_overhead": "32-40% (AdaCLP sec. 5.4.5)",
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
