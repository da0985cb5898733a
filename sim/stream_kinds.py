"""Per-kind timeline builders for ``sim.streams`` (one ``_kind_*`` per scenario kind, with sources),
and what each kind adds to the simulator's ``eval`` events (``KindEval``, ``EVALS``).

``make_streams`` picks a builder from ``BUILDERS``; the runtime asks ``evaluation(kind)`` for the
kind's extra class sets and event fields, so it never names a kind.
"""
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from streamfl.errors import ConfigError
from streamfl.sim.stream_timeline import (
    T_BOUNDS, T_BURST, T_CHAIN, T_ORDER, T_RARE, T_ROW, T_STATES, Bursts, CountedBounds, Frames,
    KindContext,
    LabelChain, LatentStates, RandomBounds, Timeline, dirichlet_row, keyed_rng, onehot, uniform_row)


def _take(kind: str, params: Dict, defaults: Dict) -> Dict:
    """Defaults overridden by ``params``; an unknown key is a ``ConfigError`` naming it."""
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise ConfigError("stream kind %r has no parameter %r (it takes %s)" % (
            kind, unknown[0], ", ".join(sorted(defaults)) or "none"))
    out = dict(defaults)
    out.update(params)
    return out


def _positive(kind: str, p: Dict, *keys: str) -> None:
    for key in keys:
        if not (isinstance(p[key], (int, float)) and p[key] > 0):
            raise ConfigError("stream kind %r: %s must be > 0, got %r" % (kind, key, p[key]))


def _period_defaults(ctx: KindContext, p: Dict, kind: str) -> Dict:
    """AdaCLP sec. 5.1: T_i ~ N(mu=400, sigma=50) rounds; scaled so each class comes ~twice a run."""
    if p["mu_s"] is None:
        p["mu_s"] = ctx.duration_s / (2.0 * ctx.kp)
    if p["sigma_s"] is None:
        p["sigma_s"] = p["mu_s"] * 50.0 / 400.0
    if p["min_s"] is None:
        p["min_s"] = p["mu_s"] / 4.0
    _positive(kind, p, "mu_s", "min_s")
    return p


_PERIODS = {"mu_s": None, "sigma_s": None, "min_s": None, "mu_aggregations": None,
            "sigma_aggregations": None, "min_aggregations": None, "count": "aggregations"}
COUNTS = ("aggregations", "updates")
Built = Tuple[List[Timeline], Dict]


def _bounds(ctx: KindContext, p: Dict, kind: str, *key: int):
    """Period starts: N(mu_s, sigma_s) seconds, or, with ``mu_aggregations`` set, N(mu, sigma)
    aggregations of the run (AdaCLP sec. 5.1 counts T_i in rounds: mu = 400, sigma = 50; sigma
    defaults to mu/8 and the minimum to mu/4, as for seconds); ``count: updates`` counts the
    updates merged instead (``AggregationClock``)."""
    if p["count"] not in COUNTS:
        raise ConfigError("stream kind %r: count must be one of %s, got %r"
                          % (kind, ", ".join(COUNTS), p["count"]))
    mu = p["mu_aggregations"]
    if mu is None:
        return RandomBounds(keyed_rng(ctx.seed, T_BOUNDS, *key), p["mu_s"], p["sigma_s"], p["min_s"])
    if ctx.clock is None:
        raise ConfigError("stream kind %r: periods in aggregations (mu_aggregations) need a "
                          "simulator run's aggregation clock" % kind)
    if p["sigma_aggregations"] is None:
        p["sigma_aggregations"] = mu * 50.0 / 400.0
    if p["min_aggregations"] is None:
        p["min_aggregations"] = mu / 4.0
    _positive(kind, p, "mu_aggregations", "min_aggregations")
    return CountedBounds(keyed_rng(ctx.seed, T_BOUNDS, *key), float(mu),
                         float(p["sigma_aggregations"]), float(p["min_aggregations"]), ctx.clock,
                         p["count"])


def _static_row(ctx: KindContext, d: int, mix: str, kind: str) -> np.ndarray:
    if mix == "uniform":
        return uniform_row(ctx.present, ctx.k)
    if mix == "pool":
        return ctx.pool_row(d)
    raise ConfigError("stream kind %r: mix must be 'uniform' or 'pool', got %r" % (kind, mix))


def _kind_iid(ctx: KindContext, params: Dict) -> Built:
    """All classes uniformly, all the time (``mix="pool"``: the pool's own class shares instead)."""
    p = _take("iid", params, {"mix": "uniform"})
    return [Timeline(ctx.k, lambda i: 0.0, lambda i, r=_static_row(ctx, d, p["mix"], "iid"): r,
                      last=0, fix=ctx.fix(d)) for d in range(ctx.n)], p


def _kind_extreme(ctx: KindContext, params: Dict) -> Built:
    """AdaCLP sec. 5.1 extreme: one class per period, period lengths ~ N(mu_s, sigma_s) >= min_s
    (or N(mu_aggregations, sigma_aggregations) aggregations, the paper's unit: ``_bounds``).

    Switch times are shared (the server switches every client at once); each device cycles through
    its own random class order (``shared_order=True``: one order for all, the paper's exact setting).
    """
    p = _period_defaults(ctx, _take("extreme", params, dict(_PERIODS, shared_order=False)), "extreme")
    bounds = _bounds(ctx, p, "extreme")
    shared = keyed_rng(ctx.seed, T_ORDER).permutation(ctx.present)
    out = []
    for d in range(ctx.n):
        order = shared if p["shared_order"] else keyed_rng(ctx.seed, T_ORDER, d).permutation(ctx.present)
        out.append(Timeline(ctx.k, bounds.start, lambda i, o=order: onehot(o[i % len(o)], ctx.k),
                             fix=ctx.fix(d)))
    return out, p


def _kind_non_extreme(ctx: KindContext, params: Dict) -> Built:
    """AdaCLP sec. 5.1 non-extreme: each period a Dirichlet(beta) class mix per device.

    beta = 0.2 (sec. 5.2.2; the paper sweeps 0.1..0.5); periods as "extreme". ``shared=True`` gives
    every device the same mix per period (the server picks the subset for all clients).
    """
    p = _period_defaults(ctx, _take("non_extreme", params, dict(_PERIODS, beta=0.2, shared=False)),
                         "non_extreme")
    _positive("non_extreme", p, "beta")
    bounds = _bounds(ctx, p, "non_extreme")
    out = []
    for d in range(ctx.n):
        who = ctx.n if p["shared"] else d

        def row(i: int, who: int = who) -> np.ndarray:
            return dirichlet_row(keyed_rng(ctx.seed, T_ROW, who, i), p["beta"], ctx.present, ctx.k)
        out.append(Timeline(ctx.k, bounds.start, row, fix=ctx.fix(d)))
    return out, p


def _kind_periodic(ctx: KindContext, params: Dict) -> Built:
    """AdaCLP sec. 5.3.1 periodic streams: ``phases`` mixes per cycle, repeating every ``period_s``.

    Each phase a Dirichlet(beta = 0.2, sec. 5.3.1) mix per device, or one class per phase when beta
    is None; default period_s = duration_s / 3 (the paper's T in {100, 400, 800} over 9-15 h runs),
    phases = number of classes. ``period(t)`` counts phases from the start (phase = period % phases).
    """
    p = _take("periodic", params, {"period_s": ctx.duration_s / 3.0, "phases": ctx.kp, "beta": 0.2})
    _positive("periodic", p, "period_s", "phases")
    phases, phase_s = int(p["phases"]), float(p["period_s"]) / int(p["phases"])
    out = []
    for d in range(ctx.n):
        order = keyed_rng(ctx.seed, T_ORDER, d).permutation(ctx.present)
        if p["beta"] is None:
            table = [onehot(order[j % len(order)], ctx.k) for j in range(phases)]
        else:
            table = [dirichlet_row(keyed_rng(ctx.seed, T_ROW, d, j), p["beta"], ctx.present, ctx.k)
                     for j in range(phases)]
        out.append(Timeline(ctx.k, lambda i: i * phase_s, lambda i, t=table: t[i % len(t)],
                             fix=ctx.fix(d)))
    return out, p


def _kind_aperiodic_rare(ctx: KindContext, params: Dict) -> Built:
    """AdaCLP Table 2 aperiodic: extreme periods of i.i.d. random common classes, plus rare classes.

    ``n_rare`` (Table 2: 1, 2 or 4) classes, the same for every device, each appear with probability
    ``rare_prob`` (1%): in bursts of ``burst_s`` (default mu_s / 10) at exponential gaps, so each rare
    class holds rare_prob of the device's time. Period bounds are per device (no server rhythm).
    """
    p = _period_defaults(ctx, _take("aperiodic_rare", params,
                                    dict(_PERIODS, n_rare=1, rare_prob=0.01, burst_s=None)),
                         "aperiodic_rare")
    if p["burst_s"] is None:
        p["burst_s"] = p["mu_s"] / 10.0
    _positive("aperiodic_rare", p, "burst_s", "rare_prob")
    if not 0 <= int(p["n_rare"]) < ctx.kp or not p["rare_prob"] < 1:
        raise ConfigError("aperiodic_rare needs 0 <= n_rare < %d classes and rare_prob < 1" % ctx.kp)
    rare = np.sort(keyed_rng(ctx.seed, T_RARE).choice(ctx.present, int(p["n_rare"]), replace=False))
    common = np.setdiff1d(ctx.present, rare)
    out = []
    for d in range(ctx.n):
        bounds = RandomBounds(keyed_rng(ctx.seed, T_BOUNDS, d), p["mu_s"], p["sigma_s"], p["min_s"])
        bursts = Bursts(ctx.k, rare, [keyed_rng(ctx.seed, T_BURST, d, int(c)) for c in rare],
                         p["burst_s"], p["rare_prob"], ctx.fix(d)) if len(rare) else None

        def row(i: int, d: int = d) -> np.ndarray:
            return onehot(common[keyed_rng(ctx.seed, T_ROW, d, i).integers(len(common))], ctx.k)
        out.append(Timeline(ctx.k, bounds.start, row, fix=ctx.fix(d), bursts=bursts))
    p["rare_classes"] = [int(c) for c in rare]
    return out, p



def _kind_new_class_frames(ctx: KindContext, params: Dict) -> Built:
    """FedTeddi sec. 5 (CIFAR settings): frames of ``frame_s``; a device's mix is uniform over its set.

    Frame 0: ``initial_frac`` (0.6: classes 0-5 of 10) of the classes, each device one of them, a
    ``two_class_frac`` (1/3: 10 of 30 clients) two. From frame 1 a ``new_frac`` (0.4: 12 of 30) of
    devices each gain one class: the not yet introduced classes arrive in ``new_frames`` (2, as in
    CIFAR-100) blocks, later frames add introduced classes a device lacks. frame_s = duration_s / 3.
    ``first_frame_s`` (default ``frame_s``) sets frame 0's length alone: the paper starts its new-class
    frames from a model pre-trained on the initial classes, which a long frame 0 trains here (the
    frames' figures are counted from frame 1's start, so frame 0 is a warm-up they exclude).
    """
    p = _take("new_class_frames", params, {"frame_s": ctx.duration_s / 3.0, "initial_frac": 0.6,
                                           "new_frac": 0.4, "two_class_frac": 1.0 / 3.0,
                                           "new_frames": 2, "first_frame_s": None})
    if p["first_frame_s"] is None:
        p["first_frame_s"] = p["frame_s"]
    _positive("new_class_frames", p, "frame_s", "first_frame_s", "initial_frac", "new_frames")
    frames = Frames(ctx, p)
    first_s, frame_s = float(p["first_frame_s"]), float(p["frame_s"])
    out = [Timeline(ctx.k, lambda i: 0.0 if i == 0 else first_s + (i - 1) * frame_s,
                     lambda i, d=d: uniform_row(frames.classes(i, d), ctx.k), fix=ctx.fix(d))
           for d in range(ctx.n)]
    p["initial_classes"] = [int(c) for c in frames.initial]
    return out, p



def _kind_sessions(ctx: KindContext, params: Dict) -> Built:
    """Session paper sec. VI: sessions of ``session_s``; a label set per session, Dirichlet mixes.

    Consecutive label sets share round(``label_overlap`` * L) of their L = ``labels_per_session``
    labels (overlap 0, 0.2 or 0.8; L defaults to K // 2 so that overlap 0 can be disjoint); a
    device's mix over the set is Dirichlet(``dirichlet_alpha``: 0.3 or 0.7). The set is global (the
    paper); ``per_device=True`` gives each device its own chain. session_s = duration_s / 5 (the paper reports 4 transitions).
    """
    p = _take("sessions", params, {"session_s": ctx.duration_s / 5.0, "label_overlap": 0.2,
                                   "dirichlet_alpha": 0.3, "labels_per_session": max(1, ctx.kp // 2),
                                   "per_device": False})
    _positive("sessions", p, "session_s", "dirichlet_alpha", "labels_per_session")
    size = min(int(p["labels_per_session"]), ctx.kp)
    if not 0.0 <= p["label_overlap"] <= 1.0:
        raise ConfigError("sessions: label_overlap must be in [0, 1], got %r" % (p["label_overlap"],))
    shared = LabelChain(keyed_rng(ctx.seed, T_CHAIN), ctx.present, size, p["label_overlap"])
    out = []
    for d in range(ctx.n):
        chain = LabelChain(keyed_rng(ctx.seed, T_CHAIN, d), ctx.present, size, p["label_overlap"]) \
            if p["per_device"] else shared

        def row(s: int, d: int = d, chain: LabelChain = chain) -> np.ndarray:
            return dirichlet_row(keyed_rng(ctx.seed, T_ROW, d, s), p["dirichlet_alpha"],
                                  chain.labels(s), ctx.k)
        out.append(Timeline(ctx.k, lambda s: s * p["session_s"], row, fix=ctx.fix(d)))
    return out, p


#: The input changes of "domain_incremental" periods.
DOMAINS = ("pixels", "channels", "rotation")


def _kind_domain_incremental(ctx: KindContext, params: Dict) -> Built:
    """ST-EWC sec. 5 PermutedMNIST: ``num_periods`` (T = 5) periods of ``period_s`` (duration_s / 5).

    Every class in every period (``mix``: "uniform", or "pool" for the device's own shares, which
    keeps e.g. the paper's two-classes-per-device split); period p > 0 transforms the input with
    its own fixed ``domain`` change (``DeviceStream.transform``): "pixels" permutes the flattened
    window (PermutedMNIST), "channels" permutes the channels (a re-wired sensor), "rotation"
    rotates every x/y/z channel triple by one random rotation (a watch worn another way: the
    accelerometer and gyroscope turn together). The last period lasts to the end of time.
    """
    p = _take("domain_incremental", params, {"num_periods": 5, "period_s": None, "mix": "uniform",
                                             "domain": "pixels"})
    if p["domain"] not in DOMAINS:
        raise ConfigError("stream kind 'domain_incremental': domain must be one of %s, got %r"
                          % (", ".join(DOMAINS), p["domain"]))
    if p["period_s"] is None:
        p["period_s"] = ctx.duration_s / float(p["num_periods"])
    _positive("domain_incremental", p, "num_periods", "period_s")
    last = int(p["num_periods"]) - 1
    return [Timeline(ctx.k, lambda i: i * p["period_s"],
                      lambda i, r=_static_row(ctx, d, p["mix"], "domain_incremental"): r,
                      last=last, fix=ctx.fix(d)) for d in range(ctx.n)], p



def _kind_latent_states(ctx: KindContext, params: Dict) -> Built:
    """SFedPO sec. 5 / App. H.1: devices move between latent states with their own class mixes.

    ``n_states`` = 12 (the paper's 60 = 6 clusters x 10, scaled to 6 x 2) with ``concentrations``
    (0.05, 0.1, 0.2, 0.5, 1, 100), one per cluster. Device n has state probabilities pi_n ~
    Dirichlet(1) over its accessible states: all ("full") or a random ``states_per_device`` subset
    (M / 6, as 10 of 60; "partial"). Time is cut into slots of ``state_s`` (duration_s / 50); each
    slot keeps the state with ``stay_prob`` (0), else draws it from pi_n (a Markov chain whose
    stationary law is pi_n). A ``high_het_frac`` (0.5) of devices start in a state of a
    concentration <= 0.1 cluster (partial access then includes one). ``period(t)`` is the slot.
    """
    p = _take("latent_states", params, {
        "n_states": 12, "concentrations": (0.05, 0.1, 0.2, 0.5, 1.0, 100.0), "state_s":
        ctx.duration_s / 50.0, "access": "full", "states_per_device": None, "stay_prob": 0.0,
        "high_het_frac": 0.5})
    m = int(p["n_states"])
    if p["states_per_device"] is None:
        p["states_per_device"] = max(1, int(round(m / 6.0)))
    _positive("latent_states", p, "n_states", "state_s", "states_per_device")
    if p["access"] not in ("full", "partial") or not p["concentrations"]:
        raise ConfigError("latent_states: access must be 'full' or 'partial', got %r" % (p["access"],))
    space = LatentStates(ctx, p)
    out, metas = [], []
    for d in range(ctx.n):
        rng = keyed_rng(ctx.seed, T_STATES, d)
        high = d in space.high_devices and len(space.high)
        if p["access"] == "full":
            access = np.arange(m)
        else:
            access = rng.choice(m, min(int(p["states_per_device"]), m), replace=False)
            if high and not np.isin(access, space.high).any():
                access[0] = space.high[rng.integers(len(space.high))]
        access = np.sort(access)
        pi = np.zeros(m)
        pi[access] = rng.dirichlet(np.ones(len(access)))
        start_pool = np.intersect1d(access, space.high) if high else np.zeros(0, dtype=np.int64)
        first = int(start_pool[rng.integers(len(start_pool))]) if len(start_pool) else \
            int(rng.choice(m, p=pi))
        states = [first]

        def row(i: int, rng=rng, pi=pi, states=states) -> np.ndarray:
            while len(states) <= i:  # called in order i = 0, 1, ...: one Markov step per slot
                stay = rng.random() < p["stay_prob"]
                states.append(states[-1] if stay else int(rng.choice(len(pi), p=pi)))
            return space.class_probs[states[i]]
        out.append(Timeline(ctx.k, lambda i: i * p["state_s"], row, fix=ctx.fix(d)))
        metas.append({"states": states, "state_probs": pi, "accessible_states": frozenset(
            int(s) for s in access), "state_class_probs": space.class_probs,
            "state_concentrations": space.conc})
    p["_metas"] = metas
    return out, p


BUILDERS = {
    "iid": _kind_iid, "extreme": _kind_extreme, "non_extreme": _kind_non_extreme,
    "periodic": _kind_periodic, "aperiodic_rare": _kind_aperiodic_rare,
    "new_class_frames": _kind_new_class_frames, "sessions": _kind_sessions,
    "domain_incremental": _kind_domain_incremental, "latent_states": _kind_latent_states}


class KindEval:
    """What a stream kind adds to an ``eval`` event beyond accuracy on all and on seen classes.

    ``devices`` are the runtime's ``DeviceState`` values (``.model.presence``, ``.stream``,
    ``.agent``). The default adds nothing."""

    def class_sets(self, t_s: float, devices: Sequence[Any]) -> List[Set[int]]:
        """Further class sets to score in the same pass as the seen classes."""
        return []

    def fields(self, t_s: float, devices: Sequence[Any], evaluator: Any, tensors: Dict[str, np.ndarray],
               set_accuracies: Sequence[Optional[float]]) -> Dict[str, Any]:
        """The event's extra fields; ``set_accuracies`` holds the accuracy on each of
        ``class_sets``' sets, in order (None: no windows of it)."""
        return {}


class CurrentLabels(KindEval):
    """"sessions": accuracy on the current session's own labels (``accuracy_now``), what the
    session paper scores, over the devices online now."""

    def class_sets(self, t_s: float, devices: Sequence[Any]) -> List[Set[int]]:
        return [{int(c) for d in devices if d.model.presence.available(t_s)
                 for c in np.flatnonzero(d.stream.class_distribution(t_s) > 0)}]

    def fields(self, t_s, devices, evaluator, tensors, set_accuracies) -> Dict[str, Any]:
        return {"accuracy_now": set_accuracies[0]} if set_accuracies else {}


class BufferMix(KindEval):
    """"latent_states": one device's buffer class mix (``buffer_counts``), which shows how the
    states' windows are admitted."""

    def fields(self, t_s, devices, evaluator, tensors, set_accuracies) -> Dict[str, Any]:
        return {"buffer_counts": list(devices[0].agent.buffer.counts)}


class EveryPeriod(KindEval):
    """"domain_incremental": accuracy on every period's inputs, future ones too
    (``period_accuracy``), from which forgetting and transfer are read."""

    def fields(self, t_s, devices, evaluator, tensors, set_accuracies) -> Dict[str, Any]:
        stream = devices[0].stream
        return {"period_accuracy": [round(evaluator.evaluate_classes(tensors, (), stream.transform, p)[0], 6)
                                    for p in range(stream.num_periods)]}


#: The kinds whose ``eval`` events carry more than the common fields.
EVALS: Dict[str, KindEval] = {"sessions": CurrentLabels(), "latent_states": BufferMix(),
                              "domain_incremental": EveryPeriod()}


def evaluation(kind: str) -> KindEval:
    """What stream kind ``kind`` adds to ``eval`` events (nothing for most)."""
    return EVALS.get(kind, KindEval())
