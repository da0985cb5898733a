"""CriticalFL's client count and the baseline methods registered for AdaCLP's comparison."""
import numpy as np
import pytest

from factories import greet, make_update
from streamfl.config import build
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.core import CoordinatorCore
from streamfl.coordinator.plugins import Aggregation, FleetView
from streamfl.methods.criticalfl.coordinator import CriticalFlConfig, CriticalFlPlugin
from streamfl.coordinator.strategies.fedavg import FedAvgAggregator
from streamfl.errors import ConfigError
from streamfl.methods.clp.payloads import FisherTrace

SPEC = {"name": "mlp", "in_channels": 3, "window_len": 8, "num_classes": 3, "hidden": 8}


def _update(device, version, tensors, trace=1.0):
    return make_update(tensors[1], device_id=device, base_version=version, arch_id=tensors[0],
                       tensors=tensors[1], extras={"fisher_trace": FisherTrace(trace)})


def test_client_count_closes_rounds_early():
    online = ["a", "b", "c", "d"]
    agg = FedAvgAggregator(online_devices=lambda: online, clients_per_round=2)
    model = {"w": np.zeros(2, np.float32)}
    up = lambda d: make_update(model, 1.0, device_id=d)
    assert agg.on_update(model, 0, up("a"), 0.0).model is None
    closed = agg.on_update(model, 0, up("b"), 0.0)                  # 2 of 4 is enough
    assert closed.model is not None
    assert [u.device_id for u in closed.merged] == ["a", "b"]


class _Flag:
    """Stands in for the CLP probe plug-in: CriticalFL reads only its flag."""

    in_clp = True


def test_criticalfl_doubles_inside_the_clp_and_halves_after():
    online = ["d%d" % i for i in range(10)]
    agg = FedAvgAggregator(online_devices=lambda: online)
    flag = _Flag()
    fleet = FleetView(lambda: online, round_deadline_s=30.0)
    plugin = CriticalFlPlugin(CriticalFlConfig(clients_max=6), fleet, {"clp": flag})
    assert plugin.on_start(0.0).round_size == 2
    for want in (4, 6, 6):
        assert plugin.on_model_made(Aggregation(version=1, merged=(), time_s=0.0)).round_size == want
    flag.in_clp = False
    for want in (3, 2, 2):
        assert plugin.on_model_made(Aggregation(version=1, merged=(), time_s=0.0)).round_size == want
    uncapped = CriticalFlPlugin(CriticalFlConfig(), fleet, {"clp": flag})
    flag.in_clp = True                     # cap: the devices online
    for _ in range(5):
        size = uncapped.on_model_made(Aggregation(version=1, merged=(), time_s=0.0)).round_size
    assert size == 10
    state = uncapped.state()
    again = CriticalFlPlugin(CriticalFlConfig(), fleet, {"clp": flag})
    again.load_state(state)
    assert again.on_start(0.0).round_size == 10


def test_criticalfl_follows_the_coordinators_clp_flag_and_keeps_device_hparams():
    core = CoordinatorCore(build(CoordinatorConfig, {"model": SPEC, "strategy": "fedavg", "plugins": {
        "clp": {"refine_hparams": False}, "criticalfl": {}}}, "test"))
    greet(core, *"abcdef")
    arch, tensors = core.arch_id, core.model
    sizes = []
    for rnd, trace in enumerate([1.0, 4.0, 16.0, 0.1, 0.1, 0.1]):   # the trace rises, then falls
        k = core.strategy.clients_per_round
        sizes.append(k)
        for i in range(k):
            core.on_update(_update("abcdef"[i], core.version, (arch, tensors), trace), 1.0 + rnd)
    assert sizes == [2, 4, 6, 6, 3, 2], sizes
    state = core.global_model().extras["clp"]
    assert state.regulating is False                     # devices keep their hparams
    assert state.in_clp is False                         # the flag still travels
    assert core.state()["plugins"]["criticalfl"] == {"clients_per_round": 2}


def test_criticalfl_needs_the_clp_probe_and_fedavg():
    with pytest.raises(ConfigError, match="clp"):
        build(CoordinatorConfig, {"model": SPEC, "strategy": "fedavg", "plugins": {"criticalfl": {}}}, "t")
    with pytest.raises(ConfigError, match="fedavg"):
        build(CoordinatorConfig, {"model": SPEC, "plugins": {"clp": {}, "criticalfl": {}}}, "t")
    with pytest.raises(ConfigError, match="clients_max"):
        build(CoordinatorConfig, {"model": SPEC, "strategy": "fedavg", "plugins": {
            "clp": {}, "criticalfl": {"clients_min": 4, "clients_max": 2}}}, "t")


def test_every_baseline_of_the_adaclp_comparison_is_a_method():
    from streamfl.sim.methods import METHODS
    for name in ("fedavg", "fedasync", "fedcurv", "afedcurv", "criticalfl", "fedcurv+clp", "adaclp",
                 "adaclp-fixed-low", "adaclp-no-dvfs"):
        m = METHODS[name]
        build(CoordinatorConfig, dict(m.coordinator, model=SPEC, plugins=m.plugins), name)   # a valid config
