"""Named methods: an aggregation strategy, a list of plug-ins with their settings, a clock policy.

The simulator runs several methods on identical streams, devices and seeds and compares them.
A method's behaviour lives in its plug-ins (``streamfl.coordinator.plugins`` and
``streamfl.agent.plugins``); here it is only named and composed: ``plugins`` maps each coordinator
plug-in to switch on to its settings (the devices' plug-ins follow the coordinator's models).
Methods compose by listing several plug-ins.
"""
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional

from streamfl.errors import ConfigError


@dataclass(frozen=True)
class Method:
    """What a method changes: ``CoordinatorConfig`` keys, the coordinator plug-ins it switches on
    with their settings, ``AgentConfig`` keys, the clock policy."""

    name: str
    description: str
    coordinator: Dict[str, Any] = field(default_factory=dict)
    plugins: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    agent: Dict[str, Any] = field(default_factory=dict)
    #: None keeps the scenario's ``dvfs_policy``.
    dvfs_policy: Optional[str] = None


METHODS: Dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add ``method`` to the registry (a name may be registered once)."""
    if method.name in METHODS:
        raise ValueError("method %r is already registered" % method.name)
    METHODS[method.name] = method
    return method


def get_method(name: str) -> Method:
    """The method called ``name``; ``ConfigError`` listing the known ones otherwise."""
    try:
        return METHODS[name]
    except KeyError:
        raise ConfigError("unknown method %r (known: %s)" % (name, ", ".join(sorted(METHODS)))) from None


def resolve(names: Iterable[str]) -> List[Method]:
    """Methods by name, in order, without repeats; ``ConfigError`` on an unknown name."""
    out: List[Method] = []
    for name in names:
        method = get_method(name.strip())
        if method not in out:
            out.append(method)
    if not out:
        raise ConfigError("no method named")
    return out


register(Method("fedasync", "FedAsync: every update mixed in as it arrives, weighted by staleness "
                            "(Xie et al. 2019; DESIGN.md s8)", coordinator={"strategy": "fedasync"}))
register(Method("fedavg", "synchronous FedAvg: sample-weighted average of one update per device per "
                          "round, rounds bounded by a deadline (McMahan et al. 2017)",
                coordinator={"strategy": "fedavg"}))


# AdaCLP (adaclp.txt) and its Table 4 ablations: FedAsync with the federated CLP probe, the devices'
# CLP hyper-parameters, and clocks as the method says. A scenario's ``plugins.clp`` settings
# (window, sigma, r_end scaled to the run) apply to each of them.
_FEDASYNC = {"strategy": "fedasync"}
_FEDAVG = {"strategy": "fedavg"}
register(Method("adaclp", "AdaCLP: FedAsync with the staleness-decayed CLP probe (eq. 2-3), CLP "
                          "hyper-parameters on the devices (eq. 4-6) and CLP-aware DVFS (sec. 4.2)",
                coordinator=_FEDASYNC, plugins={"clp": {}}, dvfs_policy="clp-aware"))
register(Method("adaclp-no-dvfs", "AdaCLP without DVFS: clocks left where they are (Table 4)",
                coordinator=_FEDASYNC, plugins={"clp": {}}, dvfs_policy="none"))
register(Method("adaclp-fixed-low", "AdaCLP at the lowest clock level throughout (Table 4)",
                coordinator=_FEDASYNC, plugins={"clp": {}}, dvfs_policy="powersave"))


# The AdaCLP paper's other baselines (adaclp.txt sec. 5.1): FedCurv (synchronous, the U/V sums of
# DESIGN.md s8), AFedCurv (the same penalty under FedAsync), CriticalFL (synchronous; twice the
# clients per round inside the CLP, half outside) and FedCurv+CLP (FedCurv with the CLP regulator).
register(Method("fedcurv", "FedCurv: synchronous FedAvg whose devices train with the peers' Fisher-"
                           "weighted penalty (Shoham et al. 2019)",
                coordinator=_FEDAVG, plugins={"fedcurv": {}}))
register(Method("afedcurv", "AFedCurv: FedCurv's penalty under FedAsync aggregation",
                coordinator=_FEDASYNC, plugins={"fedcurv": {}}))
register(Method("criticalfl", "CriticalFL: synchronous rounds whose client count doubles inside "
                              "the CLP and halves after (Yan et al. 2023)",
                coordinator=_FEDAVG, plugins={"clp": {"refine_hparams": False}, "criticalfl": {}}))
register(Method("fedcurv+clp", "FedCurv with the CLP regulator: synchronous FedCurv, devices refine "
                               "lr, batch size and dropout from the CLP state (eq. 4-6)",
                coordinator=_FEDAVG, plugins={"fedcurv": {}, "clp": {}}))


# streamfl's own CLP regulator (agent/clp_learned.py), beside the paper's: the probe (eq. 2-3),
# R_end and eq. 5-6 as AdaCLP, but instead of eq. 4's lower rate while F_G is high (while a class
# is being learned) a device rests once its own data is learned (its last round's loss under
# rest_loss_frac * ln K) for rest_rounds round-lengths. Clocks are left alone (see docs/results.md).
_LEARNED = {"plugins": {"clp": {"lr_rule": "learned"}}}
register(Method("streamclp", "streamfl's CLP regulator (ours): AdaCLP's probe, R_end and eq. 5-6, "
                             "but devices rest once their own data is learned instead of eq. 4's "
                             "lower rate while it is learned",
                coordinator=_FEDASYNC, plugins={"clp": {}}, agent=_LEARNED, dvfs_policy="none"))
# The clocks: AdaCLP's clp-aware policy, but the CLP at the board's most energy-efficient level
# and the climb after it capped at 10% over that level's joules per sample (the options
# bench/bench_dvfs_oracle.py finds within 10% of the best fixed level on every shipped board).
_EFFICIENT_CLOCKS = {"dvfs": {"policy_options": {"clp_level": "efficient",
                                                 "climb_energy_ratio": 1.1}}}
register(Method("streamclp-dvfs", "streamclp with CLP-aware clocks at the board's energy-efficient "
                                  "level (clp_level efficient, climb capped at 1.10x its energy)",
                coordinator=_FEDASYNC, plugins={"clp": {}},
                agent=dict(_LEARNED, **_EFFICIENT_CLOCKS), dvfs_policy="clp-aware"))
register(Method("adaclp-efficient-dvfs", "AdaCLP with the same energy-efficient CLP-aware clocks",
                coordinator=_FEDASYNC, plugins={"clp": {}}, agent=_EFFICIENT_CLOCKS,
                dvfs_policy="clp-aware"))
# Class-balanced mixing (coordinator/plugins/balance.py): alone; with rests for the devices whose
# update was weighted under 0.25 (5 round intervals: in the extreme setting about one update in
# five, those of the class every device is on); and composed with streamclp and the same rests.
# 0.25 and 5 sit between the rests tried on seeds 0-1 (docs/results.md): 0.2 saved 9% of the
# energy at no cost, 0.3 saved 15% for a point.
_REST = {"rest_below": 0.25, "rest_rounds": 5}
register(Method("fedasync+balance", "FedAsync with class-balanced mixing (ours): updates of the "
                                    "classes the model already holds too much of weigh less",
                coordinator=_FEDASYNC, plugins={"balance": {}}))
register(Method("fedasync+balance-rest", "fedasync+balance, and a device whose update weighed under "
                                         "0.25 rests 5 round intervals (ours)",
                coordinator=_FEDASYNC, plugins={"balance": _REST}))
register(Method("streamclp+balance", "streamclp with class-balanced mixing and the same rests (ours)",
                coordinator=_FEDASYNC, plugins={"clp": {}, "balance": _REST}, agent=_LEARNED,
                dvfs_policy="none"))
register(Method("streamclp+fedcurv", "streamclp composed with FedCurv's penalty (a regularizer "
                                     "and the CLP regulator in one fleet)",
                coordinator=_FEDASYNC, plugins={"clp": {}, "fedcurv": {}}, agent=_LEARNED,
                dvfs_policy="none"))


# Device scheduling (coordinator/plugins/schedule.py): FedTeddi (fedteddi.txt) and its baselines
# (sec. V-A), each a policy of the one plug-in, in synchronous deadline rounds as in the paper.
# A scenario's ``plugins.schedule`` settings (deadline_s = T_max, the shared band, frame_rounds)
# apply to all of them; fedteddi+adaclp composes the choice with AdaCLP under FedAsync, where the
# chosen devices are those invited to train next.
for _policy, _what in (
        ("fedteddi", "FedTeddi: greedy choice by collective divergence minus lambda_k-weighted "
                     "temporal drift (eq. 15), eq. 17's stopping rule, eq. 14's bandwidth"),
        ("random", "devices drawn uniformly at random while the band holds (FedTeddi sec. V-A)"),
        ("best-channel", "the devices with the best channels first (FedTeddi sec. V-A, [37])"),
        ("best-norm", "the devices with the largest local gradient norm first ([37])"),
        ("power-of-choice", "a random candidate set, the highest local losses first (Cho et al.)"),
        ("pure-drift", "the devices whose class distribution drifted most first (eq. 9 alone)"),
        ("fedcbs", "class-balanced sampling by the quadratic class-imbalance degree ([26])"),
        ("fedcgd", "greedy choice by collective divergence and eq. 17, no drift term ([29])")):
    register(Method(_policy, _what, coordinator=_FEDAVG, plugins={"schedule": {"policy": _policy}}))
register(Method("fedteddi+adaclp", "FedTeddi's choice of who trains next, composed with AdaCLP "
                                   "(FedAsync, CLP probe, CLP hyper-parameters and clocks)",
                coordinator=_FEDASYNC, plugins={"clp": {}, "schedule": {"policy": "fedteddi"}},
                dvfs_policy="clp-aware"))
# The composition's own references under the same band: the paper's random choice with AdaCLP, and
# ours (the band filled in FedTeddi's order) with AdaCLP.
register(Method("random+adaclp", "random choice of who trains next in the shared band, with AdaCLP "
                                 "(the reference for fedteddi+adaclp)",
                coordinator=_FEDASYNC, plugins={"clp": {}, "schedule": {"policy": "random"}},
                dvfs_policy="clp-aware"))
register(Method("fedteddi-fill+adaclp", "fedteddi-fill's choice of who trains next, with AdaCLP "
                                        "(ours)",
                coordinator=_FEDASYNC,
                plugins={"clp": {}, "schedule": {"policy": "fedteddi", "sigma": 1.0e9}},
                dvfs_policy="clp-aware"))
# Ours: FedTeddi's greedy order (divergence, lambda_k-weighted drift) with the set grown until the
# band or the deadline is full. Eq. 17 stops the greedy where sigma / sqrt(b) no longer outweighs
# the divergence a device adds; with the gradient noise the devices report that is after 3-4
# devices on the shipped scenarios, far fewer than the band carries (docs/results.md). A sigma
# beyond any divergence turns the stop rule off.
register(Method("fedteddi-fill", "FedTeddi's greedy order with the set grown until the shared band "
                                 "is full (eq. 17's stop rule off; ours)",
                coordinator=_FEDAVG, plugins={"schedule": {"policy": "fedteddi", "sigma": 1.0e9}}))


# ST-EWC (st-ewc.txt) and its baselines (sec. 5.1): FedAvg (lambda1 = lambda2 = 0) and FedCurv
# (lambda1 = 0) are registered above; TimeEWC is the temporal term alone (lambda2 = 0), ST-EWC both
# (FedCurv's plug-in is the spatial half). Synchronous as in the paper; -async under FedAsync;
# +adaclp composed with the CLP regulator. A scenario's ``plugins.stewc`` settings (the period
# boundary: its schedule, or drift) apply to each.
register(Method("timeewc", "TimeEWC: FedAvg whose devices train with the temporal EWC term "
                           "lambda1 (P theta - Q) over past periods' T-FDMs (Hashash et al. 2022)",
                coordinator=_FEDAVG, plugins={"stewc": {}}))
register(Method("stewc", "ST-EWC: FedAvg with the temporal term of past periods' T-FDMs and "
                         "FedCurv's spatial term of the peers' S-FDMs (eq. 12)",
                coordinator=_FEDAVG, plugins={"fedcurv": {}, "stewc": {}}))
register(Method("stewc-async", "ST-EWC's two terms under FedAsync aggregation",
                coordinator=_FEDASYNC, plugins={"fedcurv": {}, "stewc": {}}))
register(Method("stewc+adaclp", "ST-EWC's two terms composed with AdaCLP (FedAsync, CLP probe, "
                                "CLP hyper-parameters and clocks)",
                coordinator=_FEDASYNC, plugins={"clp": {}, "fedcurv": {}, "stewc": {}},
                dvfs_policy="clp-aware"))


# Session initialization for dynamic devices (session-init-dynamic-devices.txt) and its baselines
# (sec. VI): FedAvg rounds as in the paper, the ``sessions`` plug-in ending a session whenever the
# online devices change, and each session starting from the model its ``init`` builds. A
# scenario's ``plugins.sessions`` settings (the trigger, kappa) apply to each.
register(Method("previous", "sessions that keep training the last session's model (the session "
                            "paper's Previous baseline): FedAvg with sessions tracked",
                coordinator=_FEDAVG, plugins={"sessions": {"init": "previous"}}))
register(Method("average", "each session starts from the mean of the saved session models (the "
                           "session paper's Average baseline)",
                coordinator=_FEDAVG, plugins={"sessions": {"init": "average"}}))
register(Method("session-init", "each session starts from the saved models weighted by how close "
                                "their gradient from the pilot model is to the new session's, after "
                                "one auxiliary round (the session paper's Algorithm 1)",
                coordinator=_FEDAVG, plugins={"sessions": {"init": "session-init"}}))
register(Method("session-init+adaclp", "session-init's starting models composed with AdaCLP "
                                       "(FedAsync, CLP probe, CLP hyper-parameters and clocks)",
                coordinator=_FEDASYNC, plugins={"clp": {}, "sessions": {"init": "session-init"}},
                dvfs_policy="clp-aware"))


# SFedPO (sfedpo.txt) and its baselines (sec. 6): FedAvg rounds as in the paper. ``sfedpo`` is DDS
# admission on the devices' buffers and SAW weights on the coordinator; ``dds-only`` and
# ``saw-only`` are the paper's ablations (SAW off: uniform aggregation; DDS off: every state
# admitted at the budget alpha_n). FedAvg and FedCurv (registered above) keep FIFO buffers.
# ``fedogd``: online FL (Kwon et al. 2023): each round's steps on the newest windows only, here a
# 32-window FIFO buffer (the paper's baselines replace their data with the current state's).
# ``is``: importance sampling (Li et al. 2021) at the same budget. ``adapfedavg`` (Canonaco et al.
# 2021) is the drift baseline. A scenario's ``plugins.sfedpo`` settings apply to each SFedPO method.
register(Method("sfedpo", "SFedPO: distribution-guided admission of each latent state's windows "
                          "(DDS, eq. 10-11, Algorithm 2) and shift-aware aggregation weights (SAW, "
                          "eq. 14) under FedAvg",
                coordinator=_FEDAVG, plugins={"sfedpo": {}}))
register(Method("dds-only", "SFedPO's DDS admission with uniform FedAvg aggregation (SAW off)",
                coordinator=_FEDAVG, plugins={"sfedpo": {"saw": False}}))
register(Method("saw-only", "SFedPO's SAW weights with every state admitted at the budget (DDS off)",
                coordinator=_FEDAVG, plugins={"sfedpo": {"dds": False}}))
register(Method("fedogd", "FedOGD: online FL, FedAvg rounds on the newest windows only (a "
                          "32-window buffer; Kwon et al. 2023)",
                coordinator=_FEDAVG, agent={"buffer_capacity": 32, "min_buffer": 16}))
register(Method("is", "importance sampling: windows of the classes with the largest logit-gradient "
                      "norm admitted more and evicted last, at SFedPO's budget (Li et al. 2021)",
                coordinator=_FEDAVG, plugins={"importance": {}}))
register(Method("sfedpo+adaclp", "SFedPO's DDS and SAW composed with AdaCLP (FedAsync with SAW "
                                 "scaling the mixing weight, CLP probe, CLP hyper-parameters and clocks)",
                coordinator=_FEDASYNC, plugins={"clp": {}, "sfedpo": {}}, dvfs_policy="clp-aware"))
# Adaptive-FedAvg (Canonaco et al., IJCNN 2021), SFedPO's concept-drift baseline (sfedpo.txt sec. 6:
# "adjusts local learning rates to improve model plasticity under concept drift"): FedAvg rounds,
# the coordinator's ``adaptive_lr`` plug-in setting each round's lr from the global model's drift.
register(Method("adapfedavg", "Adaptive-FedAvg: FedAvg whose devices' lr follows the global model's "
                              "running variance ratio with a 1/t decay (Canonaco et al. 2021)",
                coordinator=_FEDAVG, plugins={"adaptive_lr": {}}))
