"""Each method's fleet-level sum caps one device's claim at a multiple of its peers' median:
FedCurv's U and V, ST-EWC's P at the fold, AdaCLP's F_G; and a restart keeps the caps."""
import numpy as np
import pytest

from factories import greet, make_update
from streamfl.config import build
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.core import CoordinatorCore
from streamfl.methods.fedcurv.coordinator import CurvatureSums
from streamfl.methods.stewc.temporal import TemporalSums
from streamfl.models import ModelSpec
from streamfl.methods.fedcurv.payloads import CurvatureDiagonal
from streamfl.methods.clp.payloads import FisherTrace
from streamfl.methods.stewc.payloads import PeriodFisher

SHAPES = {"w": (4, 3), "b": (3,)}
HONEST = ("pi-0", "pi-1", "pi-2")


def tensors(value):
    return {k: np.full(s, value, np.float32) for k, s in SHAPES.items()}


def curvature_update(device, fisher, weight=0.5):
    return make_update(tensors(0.0), device_id=device, tensors=tensors(weight),
                       extras={"curvature_diagonal": CurvatureDiagonal(tensors(fisher))})


def test_fedcurv_sums_hold_a_forged_diagonal_to_four_times_the_peers():
    sums = CurvatureSums(max_peer_multiple=4.0)
    for d in HONEST:
        sums.on_update(curvature_update(d, 1.0))
    sums.on_update(curvature_update("mallory", 1e4, weight=-3.0))
    U, V = sums.sums()
    assert sums.scale("mallory") == pytest.approx(4.0 / 1e4)
    np.testing.assert_allclose(U["w"], 3.0 + 4.0, rtol=1e-6)            # 4 of 7: bounded
    np.testing.assert_allclose(V["w"], 3 * 0.5 + 4.0 * -3.0, rtol=1e-6)
    # Peers that arrive later re-cap it; a device that leaves takes its share with it.
    sums.on_update(curvature_update("pi-3", 1.0))
    assert sums.sums()[0]["w"][0, 0] == pytest.approx(4.0 + 4.0)
    sums.forget("mallory")
    assert sums.sums()[0]["w"][0, 0] == pytest.approx(4.0)
    # A restart rebuilds the capped sums from the contributions as sent.
    sums.on_update(curvature_update("mallory", 1e4, weight=-3.0))
    again = CurvatureSums(max_peer_multiple=4.0)
    again.load(sums.arrays())
    for k in SHAPES:
        np.testing.assert_allclose(again.sums()[0][k], sums.sums()[0][k], rtol=1e-6)
        np.testing.assert_allclose(again.sums()[1][k], sums.sums()[1][k], rtol=1e-6)


def test_stewc_fold_caps_a_forged_sample_count_and_fisher():
    sums = TemporalSums(max_fisher=1e4, max_samples=10 ** 7, max_peer_multiple=4.0)
    anchor = tensors(1.0)
    sums.begin(0, anchor, version=3, now=0.0, expected=list(HONEST) + ["mallory"])
    for d in HONEST:
        assert sums.add(d, PeriodFisher(0, 100, tensors(0.01)))
    assert sums.add("mallory", PeriodFisher(0, 10 ** 7, tensors(1e4)))
    done = sums.fold()
    assert done["capped_devices"] == ["mallory"]
    # mallory's samples count as 400 (of 700), and its part of the numerator as 4x an honest
    # device's (100 x 0.01 per element): (3 + 4) x 100 x 0.01 / 700; it holds 4/7 of P.
    np.testing.assert_allclose(sums.P["w"], 7 * 100 * 0.01 / 700, rtol=1e-5)
    clean = TemporalSums()
    clean.begin(0, anchor, version=3, now=0.0, expected=list(HONEST))
    for d in HONEST:
        clean.add(d, PeriodFisher(0, 100, tensors(0.01)))
    clean.fold()
    assert float(sums.P["w"].mean()) < 3 * float(clean.P["w"].mean())  # not the 99% of before


def test_stewc_open_consolidation_survives_a_restart_per_device():
    sums = TemporalSums()
    sums.begin(2, tensors(1.0), version=9, now=5.0, expected=["a", "b"])
    sums.add("a", PeriodFisher(2, 10, tensors(0.3)))
    again = TemporalSums()
    again.load(sums.meta(), sums.arrays())
    assert again.pending.devices == {"a"} and again.pending.samples == 10
    assert not again.add("a", PeriodFisher(2, 10, tensors(0.3)))        # answered already
    assert again.add("b", PeriodFisher(2, 30, tensors(0.1)))
    again.fold()
    np.testing.assert_allclose(again.P["b"], (10 * 0.3 + 30 * 0.1) / 40, rtol=1e-5)


def test_clp_traces_are_capped_against_the_other_devices():
    spec = ModelSpec(name="mlp", in_channels=3, window_len=8, num_classes=3, hidden=8)
    core = CoordinatorCore(build(CoordinatorConfig, {"model": spec.__dict__, "strategy": "fedasync",
                                                     "plugins": {"clp": {}}}, "test"))
    greet(core, *HONEST, "mallory")
    plugin = core.plugin("clp")
    t = 0.0
    for rnd in range(3):
        for d in HONEST:
            t += 1.0
            core.on_update(make_update(spec, None, seed=int(t), device_id=d,
                                       base_version=core.version,
                                       extras={"fisher_trace": FisherTrace(20.0 + rnd)}), t)
    honest_fg = plugin.probe.fisher_global
    for rnd in range(10):
        t += 1.0
        core.on_update(make_update(spec, None, seed=int(1000 + t), device_id="mallory",
                                   base_version=core.version,
                                   extras={"fisher_trace": FisherTrace(1e8)}), t)
    assert plugin.clipped_traces == 10
    assert plugin.probe.fisher_global <= 4.0 * 22.0 + 1e-9
    assert plugin.probe.fisher_global > honest_fg        # it moved F_G, by a bounded factor
