"""CriticalFL's client count and the baseline methods registered for AdaCLP's comparison."""
import numpy as np
import pytest

from streamfl.config import build
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.core import CoordinatorCore
from streamfl.coordinator.strategies.fedavg import FedAvgAggregator
from streamfl.errors import ConfigError
from streamfl.protocol.messages import Update

SPEC = {"name": "mlp", "in_channels": 3, "window_len": 8, "num_classes": 3, "hidden": 8}


def _update(device, version, tensors, trace=1.0):
    return Update(device_id=device, update_id="%s-%d" % (device, version), base_version=version,
                  arch_id=tensors[0], tensors=tensors[1], num_samples=10, class_counts={0: 10},
                  loss=0.1, seconds_per_sample=0.01, fisher_trace=trace)


def test_client_count_closes_rounds_early():
    online = ["a", "b", "c", "d"]
    agg = FedAvgAggregator(online_devices=lambda: online, clients_per_round=2)
    model = {"w": np.zeros(2, np.float32)}
    up = lambda d: Update(device_id=d, update_id=d, base_version=0, arch_id="x",
                          tensors={"w": np.ones(2, np.float32)}, num_samples=1, class_counts={},
                          loss=0.0, seconds_per_sample=0.0)
    assert agg.on_update(model, 0, up("a"), 0.0) is None
    assert agg.on_update(model, 0, up("b"), 0.0) is not None      # 2 of 4 is enough
    assert [u.device_id for u in agg.last_aggregated] == ["a", "b"]


def test_criticalfl_doubles_inside_the_clp_and_halves_after():
    online = ["d%d" % i for i in range(10)]
    agg = FedAvgAggregator(online_devices=lambda: online, criticalfl=True, clients_max=6)
    assert agg.clients_per_round == 2
    for want in (4, 6, 6):
        agg.on_clp(True)
        assert agg.clients_per_round == want
    for want in (3, 2, 2):
        agg.on_clp(False)
        assert agg.clients_per_round == want
    agg.clients_max = None                 # cap: the devices online
    for _ in range(5):
        agg.on_clp(True)
    assert agg.clients_per_round == 10
    state = agg.state()
    again = FedAvgAggregator(online_devices=lambda: online, criticalfl=True)
    again.load_state(state)
    assert again.clients_per_round == 10


def test_criticalfl_follows_the_coordinators_clp_flag_and_keeps_device_hparams():
    core = CoordinatorCore(build(CoordinatorConfig, {"model": SPEC, "strategy": "fedavg",
                                                     "clp": {"enabled": True, "refine_hparams": False},
                                                     "fedavg": {"criticalfl": True}}, "test"))
    for d in "abcdef":
        core.registry.seen(d, 0.0)
    arch, tensors = core.arch_id, core.model
    sizes = []
    for rnd, trace in enumerate([1.0, 4.0, 16.0, 0.1, 0.1, 0.1]):   # the trace rises, then falls
        k = core.strategy.clients_per_round
        sizes.append(k)
        for i in range(k):
            core.on_update(_update("abcdef"[i], core.version, (arch, tensors), trace), 1.0 + rnd)
    assert sizes == [2, 4, 6, 6, 3, 2], sizes
    assert core.global_model().clp["regulating"] is False            # devices keep their hparams
    assert "in_clp" in core.global_model().clp


def test_criticalfl_needs_the_clp_probe_and_fedavg():
    with pytest.raises(ConfigError):
        build(CoordinatorConfig, {"model": SPEC, "strategy": "fedavg", "fedavg": {"criticalfl": True}}, "t")
    with pytest.raises(ConfigError):
        build(CoordinatorConfig, {"model": SPEC, "clp": {"enabled": True},
                                  "fedavg": {"criticalfl": True}}, "t")


def test_every_baseline_of_the_adaclp_comparison_is_a_method():
    from streamfl.sim.methods import METHODS
    for name in ("fedavg", "fedasync", "fedcurv", "afedcurv", "criticalfl", "fedcurv+clp", "adaclp",
                 "adaclp-fixed-low", "adaclp-no-dvfs"):
        m = METHODS[name]
        build(CoordinatorConfig, dict(m.coordinator, model=SPEC), name)   # each is a valid config
