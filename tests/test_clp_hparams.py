"""AdaCLP eq. 4-6 hyper-parameter refinement on the device: formulas, clamps, segments, R_end."""
import ast
import inspect
import json
import math

import pytest

from streamfl.methods.clp import hparams as clp_hparams
from streamfl.methods.clp.hparams import ClpHparamsConfig, refine, sigmoid
from streamfl.methods.clp.probe import ClpProbeConfig, ClpProbe
from streamfl.methods.clp.payloads import ClpState

BASE = {"lr": 0.003, "batch_size": 32, "local_steps": 20, "dropout": 0.0}
E = math.e


def clp(fg, prev=None, version=10, start=0, regulating=True, seg_start=None):
    return ClpState(in_clp=True, fisher_global=fg, fisher_global_prev=prev, segment=0,
                    segment_start_version=start, regulating=regulating, version=version,
                    fisher_segment_start=seg_start)


def test_formulas_at_known_points():
    cfg = ClpHparamsConfig()
    out = refine(clp(E, prev=E), BASE, cfg)
    assert out["lr"] == pytest.approx(0.005)            # eta0 * e^-ln2 = eta0 / 2
    assert out["batch_size"] == 26                       # 1 + 50 / (1 + 1)
    assert out["dropout"] == pytest.approx(0.1)          # D0 (1 - sigmoid(0)) = D0 / 2
    out = refine(clp(E ** 2, prev=E ** 2 - 0.1), BASE, cfg)
    assert out["lr"] == pytest.approx(0.0025)            # eta0 / 4
    assert out["batch_size"] == 18                       # 1 + 50 / 3 = 17.67
    assert out["dropout"] == pytest.approx(0.2 * (1 - 1 / (1 + math.exp(-1.0))))  # beta 10 * 0.1
    assert isinstance(out["batch_size"], int)
    assert out["local_steps"] == 20


def test_falling_trace_raises_dropout_towards_d0():
    cfg = ClpHparamsConfig()
    rising = refine(clp(2.0, prev=1.9), BASE, cfg)["dropout"]
    falling = refine(clp(2.0, prev=2.1), BASE, cfg)["dropout"]
    assert rising < 0.1 < falling < 0.2


def test_missing_prev_counts_as_flat():
    assert refine(clp(E, prev=None), BASE)["dropout"] == pytest.approx(0.1)


def test_fisher_below_one_hits_lr_max_and_batch_max():
    cfg = ClpHparamsConfig()
    out = refine(clp(0.5, prev=0.5), BASE, cfg)
    assert out["lr"] == cfg.lr_max == cfg.initial_lr           # eq. 4 would give 0.0162
    assert out["batch_size"] == cfg.batch_max            # eq. 5 would give 164
    wide = ClpHparamsConfig(lr_max=0.05)
    assert refine(clp(0.5), BASE, wide)["lr"] == pytest.approx(0.01 * 0.5 ** -math.log(2))
    assert refine(clp(1e-3), BASE, wide)["lr"] == 0.05   # eq. 4 explodes: 0.12


@pytest.mark.parametrize("fg", [1 / E, 1 / E + 1e-15, 0.2, 1e-9])
def test_batch_pole_and_below_give_batch_max(fg):
    assert refine(clp(fg), BASE)["batch_size"] == 50


def test_large_fisher_hits_lr_min_and_batch_min():
    cfg = ClpHparamsConfig()
    out = refine(clp(1e6, prev=1e6), BASE, cfg)
    assert out["lr"] == cfg.lr_min                       # eq. 4: 7e-7
    assert out["batch_size"] == cfg.batch_min            # eq. 5: 4.4


def test_dropout_floor_and_ceiling():
    cfg = ClpHparamsConfig(dropout_min=0.05)
    assert refine(clp(5.0, prev=1.0), BASE, cfg)["dropout"] == 0.05   # eq. 6: ~0
    with pytest.raises(ValueError, match="dropout_max"):
        ClpHparamsConfig(initial_dropout=0.6)                          # D <= D0, so the ceiling bounds D0


def test_segment_start_resets_to_initial_values():
    cfg = ClpHparamsConfig(initial_dropout=0.3)
    out = refine(clp(1e6, prev=10.0, version=40, start=40), BASE, cfg)
    assert (out["lr"], out["batch_size"], out["dropout"]) == (0.01, 50, 0.3)
    after = refine(clp(1e6, prev=10.0, version=41, start=40), BASE, cfg)
    assert after["lr"] < 0.01


def test_no_estimate_yet_gives_initial_values():
    for fg in (None, 0.0, float("nan"), "x"):
        out = refine(clp(fg), BASE)
        assert (out["lr"], out["batch_size"], out["dropout"]) == (0.01, 50, 0.2)


def test_segment_start_reference():
    cfg = ClpHparamsConfig(fisher_reference="segment_start")
    out = refine(clp(6.0 * E, prev=6.0 * E, seg_start=6.0), BASE, cfg)
    assert out["lr"] == pytest.approx(0.005) and out["batch_size"] == 26
    missing = refine(clp(6.0 * E, seg_start=None), BASE, cfg)
    assert (missing["lr"], missing["batch_size"]) == (0.01, 50)


def test_fisher_scale_normalizes_absolute_reference():
    cfg = ClpHparamsConfig(fisher_scale=100.0)
    out = refine(clp(100.0 * E, prev=100.0 * E - 1.0), BASE, cfg)
    assert out["lr"] == pytest.approx(0.005)
    assert out["dropout"] == pytest.approx(0.2 * (1 - sigmoid(10.0 * 0.01)))


@pytest.mark.parametrize("state", [clp(E, regulating=False), None])
def test_not_regulating_returns_the_coordinators_hparams(state):
    out = refine(state, BASE)
    assert out == BASE and out is not BASE


def test_probe_state_drives_refine_after_json():
    probe = ClpProbe(ClpProbeConfig(trace_window=1, staleness_decay=0.0, last_regulated_version=3))
    states = [probe.on_aggregation(v, v - 1, E ** v) for v in range(1, 5)]
    outs = [refine(ClpState.parse(json.loads(json.dumps(s.as_dict())), {}), BASE) for s in states]
    assert outs[1]["lr"] == pytest.approx(0.01 * 2.0 ** -2)   # F_G = e^2
    assert outs[2]["batch_size"] == 14                         # 1 + 50 / 4 = 13.5 -> 14
    assert outs[3] == BASE                                     # version 4 > R_end


def test_sigmoid_is_stable():
    assert sigmoid(0.0) == 0.5
    assert sigmoid(-1000.0) == 0.0 and sigmoid(1000.0) == 1.0


@pytest.mark.parametrize("kwargs, field", [
    ({"initial_lr": 0.0}, "initial_lr"), ({"initial_lr": 0.02}, "initial_lr <= lr_max"), ({"lr_min": -1.0}, "lr_min"),
    ({"initial_batch": 0}, "initial_batch"), ({"initial_batch": 60}, "initial_batch <= batch_max"), ({"batch_min": 2.5}, "batch_min"),
    ({"initial_dropout": 1.0}, "initial_dropout"), ({"dropout_min": 0.3}, "dropout_min <= initial_dropout"), ({"dropout_slope": -1.0}, "dropout_slope"),
    ({"fisher_reference": "relative"}, "fisher_reference"), ({"fisher_scale": 0.0}, "fisher_scale"),
])
def test_config_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ClpHparamsConfig(**kwargs)


def test_defaults_follow_the_paper():
    cfg = ClpHparamsConfig()
    assert (cfg.initial_lr, cfg.initial_batch) == (0.01, 50)


def test_module_parses_as_python_38():
    ast.parse(inspect.getsource(clp_hparams), feature_version=(3, 8))


def test_warmup_reference_reads_f_g_relative_to_the_broadcast_reference():
    cfg = ClpHparamsConfig(initial_lr=0.05, lr_max=0.05, lr_min=0.0005, initial_batch=32, batch_max=32,
                           fisher_reference="warmup")
    base = {"lr": 0.05, "batch_size": 32, "dropout": 0.0, "local_steps": 10}
    state = ClpState(version=9, fisher_global=40.0, fisher_global_prev=40.0, in_clp=True,
                     segment=0, segment_start_version=0, regulating=True)
    unknown = refine(state, base, cfg)              # reference not known yet: reset values
    assert (unknown["lr"], unknown["batch_size"]) == (0.05, 32)
    import dataclasses
    known = refine(dataclasses.replace(state, fisher_reference=10.0), base, cfg)
    assert known["lr"] == pytest.approx(0.05 * 4.0 ** -math.log(2.0))
    same = refine(dataclasses.replace(state, fisher_global=400.0, fisher_global_prev=400.0,
                                      fisher_reference=100.0), base, cfg)
    assert same["lr"] == pytest.approx(known["lr"])   # scale-free: only the ratio counts
