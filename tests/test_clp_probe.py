"""AdaCLP federated CLP probe: eq. 2 weights (Fig. 5), eq. 3 flag, guards, segments, R_end, state."""
import json
import math

import pytest

from streamfl.methods.clp.probe import ClpProbeConfig, ClpProbe
from streamfl.methods.clp.payloads import ClpState

AS_DICT_KEYS = {"in_clp", "fisher_global", "fisher_global_prev", "segment", "segment_start_version",
                "regulating", "version", "fisher_segment_start", "fisher_reference"}


def feed(probe, items):
    """items: (version, base_version, trace); returns the list of states."""
    return [probe.on_aggregation(v, b, f) for v, b, f in items]


@pytest.mark.parametrize("lam", [0.01, 0.5])
def test_fig5_staleness_weights(lam):
    # Fig. 4/5: rounds 1..4 aggregate models trained from versions 0, 0, 1, 0; with window 3 the
    # estimate at round 4 covers rounds [2, 3, 4] from [0, 1, 0]: e^-2l, e^-2l, e^-4l.
    probe = ClpProbe(ClpProbeConfig(trace_window=3, staleness_decay=lam))
    traces = {1: 9.0, 2: 2.0, 3: 3.0, 4: 5.0}
    feed(probe, [(1, 0, traces[1]), (2, 0, traces[2]), (3, 1, traces[3]), (4, 0, traces[4])])
    w = probe.weights()
    assert list(w) == [2, 3, 4]
    assert w[2] == pytest.approx(math.exp(-2 * lam))
    assert w[3] == pytest.approx(math.exp(-2 * lam))
    assert w[4] == pytest.approx(math.exp(-4 * lam))
    expected = (w[2] * 2.0 + w[3] * 3.0 + w[4] * 5.0) / 3
    assert probe.current().fisher_global == pytest.approx(expected)


def test_warmup_divides_by_count_not_m():
    probe = ClpProbe(ClpProbeConfig(trace_window=10, staleness_decay=0.0))
    s1 = probe.on_aggregation(1, 0, 4.0)
    assert s1.fisher_global == pytest.approx(4.0)
    s2 = probe.on_aggregation(2, 1, 4.0)
    assert s2.fisher_global == pytest.approx(4.0)  # 1/m would give 0.4 then 0.8: a fake rise
    assert s2.in_clp is False                      # flat trace: growth 0 < sigma


def test_fresh_update_weighs_exp_minus_lambda():
    probe = ClpProbe(ClpProbeConfig(staleness_decay=0.1))
    probe.on_aggregation(1, 0, 1.0)
    assert probe.weights() == {1: pytest.approx(math.exp(-0.1))}


def test_clp_flag_rising_then_flat():
    probe = ClpProbe(ClpProbeConfig(trace_window=2, staleness_decay=0.0, growth_threshold=0.15))
    states = feed(probe, [(v, v - 1, f) for v, f in
                          enumerate([1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0, 5.0], start=1)])
    assert states[0].in_clp is True           # no F_G(T-1) yet: training starts in the CLP
    assert [s.in_clp for s in states[1:5]] == [True] * 4
    assert states[5].in_clp is False          # mean(5, 5) vs mean(4, 5): +11% < 15%
    assert [s.in_clp for s in states[6:]] == [False, False]
    assert states[4].fisher_global_prev == pytest.approx(3.5)
    assert states[4].fisher_global == pytest.approx(4.5)


def _noisy_hump():
    """Traces that rise for 40 aggregations and fall for 40, each alternately 1.6x and 0.4x the
    trend: the spread of per-update traces at one model seen in docs/results.md."""
    trend = [1.0 + 0.05 * k for k in range(40)] + [3.0 - 0.05 * k for k in range(40)]
    return [(v, v - 1, t * (1.6 if v % 2 else 0.4)) for v, t in enumerate(trend, start=1)]


def test_growth_lag_one_is_the_paper_and_flickers_on_noise():
    probe = ClpProbe(ClpProbeConfig(trace_window=5, staleness_decay=0.0, growth_threshold=0.0))
    flags = [s.in_clp for s in feed(probe, _noisy_hump())]
    # F_G(T) - F_G(T-1) is one noisy trace against the one leaving the window: the flag flips
    # on almost every aggregation, rising trend or not.
    flips = sum(a != b for a, b in zip(flags, flags[1:]))
    assert flips > 30


def test_growth_lag_of_a_window_follows_the_trend():
    probe = ClpProbe(ClpProbeConfig(trace_window=10, staleness_decay=0.0, growth_threshold=0.0, growth_lag=10))
    states = feed(probe, _noisy_hump())
    flags = [s.in_clp for s in states]
    assert all(flags[12:38])                  # rising half: in the CLP throughout
    assert not any(flags[52:])                # falling half (once the window has turned): out
    assert sum(a != b for a, b in zip(flags, flags[1:])) <= 3
    # eq. 6 still sees the one-step difference
    assert states[20].fisher_global_prev == pytest.approx(states[19].fisher_global)


def test_growth_lag_compares_with_the_estimate_k_back():
    probe = ClpProbe(ClpProbeConfig(trace_window=1, staleness_decay=0.0, growth_threshold=0.5, growth_lag=3))
    states = feed(probe, [(1, 0, 4.0), (2, 1, 1.0), (3, 2, 1.0), (4, 3, 1.0), (5, 4, 1.6)])
    assert states[1].in_clp is False          # warm-up: against the oldest estimate there is (4.0)
    assert states[3].in_clp is False          # 1.0 against F_G(1) = 4.0
    assert states[4].in_clp is True           # 1.6 against F_G(2) = 1.0: +60%, though F_G(4) = 1.0 too


def test_sigma_threshold_is_inclusive():
    probe = ClpProbe(ClpProbeConfig(trace_window=1, staleness_decay=0.0, growth_threshold=0.5))
    probe.on_aggregation(1, 0, 2.0)
    assert probe.on_aggregation(2, 1, 3.0).in_clp is True    # exactly +50%
    assert probe.on_aggregation(3, 2, 4.4).in_clp is False   # +47%


def test_zero_previous_estimate_guard():
    probe = ClpProbe(ClpProbeConfig(trace_window=1, staleness_decay=0.0))
    probe.on_aggregation(1, 0, 0.0)
    assert probe.on_aggregation(2, 1, 0.0).in_clp is False   # 0 -> 0: no growth
    assert probe.on_aggregation(3, 2, 1.0).in_clp is True    # 0 -> 1: unbounded growth


@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), -1.0])
def test_missing_or_invalid_trace_does_not_move_estimate(bad):
    probe = ClpProbe(ClpProbeConfig(trace_window=2, staleness_decay=0.0))
    feed(probe, [(1, 0, 1.0), (2, 1, 2.0)])
    before = probe.current()
    after = probe.on_aggregation(3, 2, bad)
    assert after.version == 3
    assert (after.fisher_global, after.fisher_global_prev, after.in_clp) == \
        (before.fisher_global, before.fisher_global_prev, before.in_clp)
    assert list(probe.weights()) == [1, 2]
    assert probe.rounds == 3 and probe.traced_rounds == 2


def test_future_base_version_counts_as_staleness_zero():
    probe = ClpProbe(ClpProbeConfig(staleness_decay=1.0))
    probe.on_aggregation(5, 9, 2.0)
    assert probe.weights() == {5: 1.0}


def test_versions_must_increase():
    probe = ClpProbe(ClpProbeConfig())
    probe.on_aggregation(3, 2, 1.0)
    with pytest.raises(ValueError, match="increase"):
        probe.on_aggregation(3, 2, 1.0)
    with pytest.raises(ValueError, match="integers"):
        probe.on_aggregation(4.0, 2, 1.0)


def test_regulation_stops_after_r_end():
    probe = ClpProbe(ClpProbeConfig(trace_window=1, staleness_decay=0.0, last_regulated_version=3, segment_rounds=2))
    states = feed(probe, [(v, v - 1, float(v)) for v in range(1, 7)])
    assert [s.regulating for s in states] == [True, True, True, False, False, False]
    assert all(s.in_clp is False for s in states[3:])      # rising trace, but no CLP after R_end
    assert states[5].fisher_global == pytest.approx(6.0)   # still measured for metrics
    assert {(s.segment, s.segment_start_version) for s in states[3:]} == {(1, 2)}  # frozen


def test_initial_state_is_in_clp_segment_zero():
    state = ClpProbe(ClpProbeConfig()).current()
    assert state == ClpState(version=0, fisher_global=None, fisher_global_prev=None, in_clp=True,
                             segment=0, segment_start_version=0, regulating=True)


def test_fixed_length_segments():
    probe = ClpProbe(ClpProbeConfig(segment_rounds=5, segment_on_reentry=False))
    states = feed(probe, [(v, v - 1, 1.0) for v in range(1, 12)])
    assert [(s.version, s.segment, s.segment_start_version) for s in states if
            s.version == s.segment_start_version] == [(5, 1, 5), (10, 2, 10)]
    assert states[0].fisher_segment_start == pytest.approx(math.exp(-0.01))  # first traced F_G


def test_segment_on_clp_reentry():
    traces = [1.0, 2.0, 3.0, 3.0, 3.0, 6.0, 6.0]
    probe = ClpProbe(ClpProbeConfig(trace_window=1, staleness_decay=0.0, growth_threshold=0.1))
    states = feed(probe, [(v, v - 1, f) for v, f in enumerate(traces, start=1)])
    assert [s.in_clp for s in states] == [True, True, True, False, False, True, False]
    assert [s.segment for s in states] == [0, 0, 0, 0, 0, 1, 1]
    assert states[5].segment_start_version == 6
    assert states[5].fisher_segment_start == pytest.approx(6.0)

    off = ClpProbe(ClpProbeConfig(trace_window=1, staleness_decay=0.0, growth_threshold=0.1, segment_on_reentry=False))
    assert feed(off, [(v, v - 1, f) for v, f in enumerate(traces, start=1)])[-1].segment == 0


def test_as_dict_is_json_with_the_agreed_keys():
    probe = ClpProbe(ClpProbeConfig())
    d = probe.on_aggregation(1, 0, 2.5).as_dict()
    assert set(d) == AS_DICT_KEYS
    assert json.loads(json.dumps(d)) == d
    assert d["version"] == 1 and d["regulating"] is True


def test_state_round_trip_continues_identically():
    cfg = ClpProbeConfig(trace_window=3, staleness_decay=0.05, growth_threshold=0.02, segment_rounds=4, last_regulated_version=20)
    items = [(v, max(0, v - 1 - v % 3), 1.0 + 0.3 * v - 0.02 * v * v) for v in range(1, 25)]
    items[6] = (7, 5, None)
    original = ClpProbe(cfg)
    feed(original, items[:10])
    restored = ClpProbe(cfg)
    restored.load_state(json.loads(json.dumps(original.state())))
    assert restored.current() == original.current()
    assert restored.weights() == original.weights()
    assert feed(restored, items[10:]) == feed(original, items[10:])
    assert restored.state() == original.state()


def test_state_round_trip_with_growth_lag():
    cfg = ClpProbeConfig(trace_window=4, staleness_decay=0.0, growth_threshold=0.01, growth_lag=4)
    items = _noisy_hump()
    original = ClpProbe(cfg)
    feed(original, items[:30])
    restored = ClpProbe(cfg)
    restored.load_state(json.loads(json.dumps(original.state())))
    assert feed(restored, items[30:]) == feed(original, items[30:])


def test_load_state_with_smaller_window_keeps_newest():
    big = ClpProbe(ClpProbeConfig(trace_window=4, staleness_decay=0.0))
    feed(big, [(v, v - 1, float(v)) for v in range(1, 5)])
    small = ClpProbe(ClpProbeConfig(trace_window=2, staleness_decay=0.0))
    small.load_state(big.state())
    assert list(small.weights()) == [3, 4]
    assert small.fisher_global == pytest.approx(3.5)


def test_load_state_rejects_garbage():
    with pytest.raises(ValueError, match="invalid CLP probe state"):
        ClpProbe(ClpProbeConfig()).load_state({"window": [[1, 1, "x"]]})


@pytest.mark.parametrize("kwargs, field", [
    ({"trace_window": 0}, "trace_window"), ({"trace_window": 2.5}, "trace_window"), ({"staleness_decay": -0.1}, "staleness_decay"),
    ({"staleness_decay": float("nan")}, "staleness_decay"), ({"growth_threshold": -1.0}, "growth_threshold"), ({"last_regulated_version": -1}, "last_regulated_version"),
    ({"last_regulated_version": True}, "last_regulated_version"), ({"segment_rounds": -2}, "segment_rounds"),
    ({"segment_on_reentry": 1}, "segment_on_reentry"),
    ({"growth_lag": 0}, "growth_lag"), ({"growth_lag": 1.5}, "growth_lag"),
])
def test_config_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ClpProbeConfig(**kwargs)


def test_config_defaults_follow_the_paper():
    cfg = ClpProbeConfig()
    assert (cfg.staleness_decay, cfg.last_regulated_version) == (0.01, 30000)


def test_warmup_reference_is_the_mean_of_the_first_traced_estimates_then_frozen():
    probe = ClpProbe(ClpProbeConfig(trace_window=1, reference_traces=3, staleness_decay=0.0))
    probe.on_aggregation(1, 0, 2.0)
    probe.on_aggregation(2, 1, None)          # untraced: does not count
    assert probe.current().fisher_reference is None
    probe.on_aggregation(3, 2, 4.0)
    probe.on_aggregation(4, 3, 6.0)
    assert probe.current().fisher_reference == pytest.approx(4.0)
    probe.on_aggregation(5, 4, 100.0)         # frozen after the warm-up
    assert probe.current().fisher_reference == pytest.approx(4.0)
    restored = ClpProbe(ClpProbeConfig(trace_window=1, reference_traces=3, staleness_decay=0.0))
    restored.load_state(json.loads(json.dumps(probe.state())))
    assert restored.current().fisher_reference == pytest.approx(4.0)


def test_reference_traces_must_be_positive():
    with pytest.raises(ValueError, match="reference_traces"):
        ClpProbeConfig(reference_traces=0)
