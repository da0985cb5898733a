"""Benchmark what ST-EWC's two terms add to a local round (goal: under 10% of a round).

A round is tau SGD steps of batch B through ``LocalTrainer``. ST-EWC adds, every round, FedCurv's
spatial penalty and the temporal penalty to each step's loss (both built by the real agent
plug-ins from random U, V, P, Q of the model's shapes; also, for comparison, the same terms added
to the loss instead of fused into the gradient) and FedCurv's S-FDM after the round (the
Fisher diagonal on ``fisher_samples`` windows, one backward each); once a period, the T-FDM at
theta*_t (the ``stewc`` plug-in's ``fisher_samples`` windows), amortized here over
``--rounds-per-period`` rounds, in a random order each repeat. The S-FDM is reported per estimate and amortized over the
cadences of ``--fisher-every`` (fedcurv's ``fisher_every_rounds``). All timed in the same run, interleaved, median of the repeats;
shares are of the plain round's time. Prints JSON.

Usage: python bench/bench_stewc.py [--model lstm] [--tau 5] [--batch 32] [--repeats 21]
"""
import argparse
import json
import statistics
import time

import numpy as np
import torch

from streamfl.methods.fedcurv.agent import FedCurvAgentPlugin
from streamfl.methods.stewc.agent import StEwcAgentPlugin
from streamfl.agent.trainer import LocalTrainer
from streamfl.methods.fedcurv.coordinator import FedCurvConfig
from streamfl.methods.stewc.coordinator import StEwcConfig
from streamfl.models import ModelSpec, build_model
from streamfl.models.fisher import fisher_diagonal
from streamfl.protocol.messages import GlobalModel
from streamfl.methods.fedcurv.payloads import CurvatureTerms
from streamfl.methods.stewc.payloads import PeriodTerms

GOAL_SHARE = 0.10


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="lstm")
    parser.add_argument("--tau", type=int, default=5, help="local SGD steps per round")
    parser.add_argument("--batch", type=int, default=32, help="SGD batch")
    parser.add_argument("--buffer", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=21, help="median of N rounds")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds-per-period", type=int, default=100,
                        help="rounds the once-a-period T-FDM is spread over (the paper's R = 100)")
    parser.add_argument("--fisher-every", type=int, nargs="*", default=[1, 10, 20],
                        help="S-FDM cadences to report (fedcurv's fisher_every_rounds; 1 = the paper)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    spec = ModelSpec(name=args.model)
    model = build_model(spec, seed=0)
    trainer = LocalTrainer(model, spec.num_classes)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(args.buffer, spec.window_len, spec.in_channels)).astype(np.float32)
    y = rng.integers(0, spec.num_classes, size=args.buffer)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}

    def rand(positive):
        return {n: (np.abs(rng.normal(size=s)) * 1e-3 if positive else rng.normal(size=s)).astype(np.float32)
                for n, s in shapes.items()}

    spatial_fisher = FedCurvConfig().fisher_samples
    temporal_fisher = StEwcConfig().fisher_samples
    curv, temporal = FedCurvAgentPlugin(), StEwcAgentPlugin()
    curv.on_model_received(GlobalModel(1, spec.arch_id, {}, extras={
        "curvature": CurvatureTerms(1.0, spatial_fisher, rand(True), rand(False))}), {})
    temporal.on_model_received(GlobalModel(1, spec.arch_id, {}, extras={
        "periods": PeriodTerms(2, StEwcConfig().temporal_strength, temporal_fisher, None, rand(True), rand(False))}),
        {"lr": 0.01})
    gen = torch.Generator().manual_seed(0)

    def batches():
        return [(X[i], y[i]) for i in (rng.integers(0, args.buffer, size=args.batch) for _ in range(args.tau))]

    def plain():
        trainer.penalties = []
        trainer.run(batches(), lr=0.01)

    def penalized():
        # As the agent core does each round: the plug-ins build their penalties, then train.
        trainer.penalties = [curv.before_round(model), temporal.before_round(model)]
        trainer.run(batches(), lr=0.01)

    def as_loss_terms():
        # The same two terms added to the loss instead (their own autograd graph every step).
        pulls = [curv.before_round(model), temporal.before_round(model)]
        trainer.penalties = [lambda m, p=p: p(m) for p in pulls]
        trainer.run(batches(), lr=0.01)

    def s_fdm():
        fisher_diagonal(model, X, y, num_samples=spatial_fisher, generator=gen)

    def t_fdm():
        fisher_diagonal(model, X, y, num_samples=temporal_fisher, generator=gen)

    runs = (("plain", plain), ("penalized", penalized), ("as_loss_terms", as_loss_terms),
            ("s_fdm", s_fdm), ("t_fdm", t_fdm))
    for _, fn in runs:  # warm-up
        fn()
    t = {name: [] for name, _ in runs}
    order = np.random.default_rng(1)
    for _ in range(args.repeats):
        for i in order.permutation(len(runs)):  # no variant always runs first (warm caches)
            name, fn = runs[i]
            t[name].append(timed(fn))
    base = statistics.median(t["plain"])
    penalties = statistics.median([p - q for p, q in zip(t["penalized"], t["plain"])]) / base
    as_loss = statistics.median([p - q for p, q in zip(t["as_loss_terms"], t["plain"])]) / base
    s_share = statistics.median(t["s_fdm"]) / base
    t_share = statistics.median(t["t_fdm"]) / base / args.rounds_per_period
    by_cadence = {}
    for every in args.fisher_every:
        total = max(penalties, 0.0) + s_share / every + t_share
        by_cadence[str(every)] = {"s_fdm_share": round(s_share / every, 4),
                                  "all_share": round(total, 4), "goal_met": total <= GOAL_SHARE}
    print(json.dumps({
        "model": spec.arch_id, "tau": args.tau, "batch": args.batch, "threads": args.threads,
        "repeats": args.repeats, "round_median_s": base,
        # The two terms in the gradient, every step of every round.
        "penalties_share": round(penalties, 4),
        "penalties_share_as_loss_terms": round(as_loss, 4),
        "goal_share": GOAL_SHARE,
        "goal_met_penalties": penalties <= GOAL_SHARE,
        # The statistics that feed them: FedCurv's S-FDM (per estimate, then amortized over its
        # cadence) and the T-FDM once a period.
        "s_fdm_share_per_estimate": round(s_share, 4), "s_fdm_windows": spatial_fisher,
        "t_fdm_share_amortized": round(t_share, 5), "t_fdm_windows": temporal_fisher,
        "t_fdm_once_s": statistics.median(t["t_fdm"]),
        "rounds_per_period": args.rounds_per_period,
        "with_statistics_by_s_fdm_cadence": by_cadence,
    }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
