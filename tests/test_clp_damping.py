"""Damping a flapping CLP flag (AdaCLP eq. 3, ours): a minimum dwell holds the flag, a hysteresis
band needs the growth to cross it, the defaults are eq. 3 as written, and the log sums repeated
changes up instead of printing a line each."""
import json
import logging

import pytest

from factories import make_update
from streamfl.config import build
from streamfl.coordinator.plugins.base import Aggregation, FleetView
from streamfl.errors import ConfigError
from streamfl.methods.clp.coordinator import ClpProbePlugin
from streamfl.methods.clp.flag_log import FlagChangeLog
from streamfl.methods.clp.payloads import FisherTrace
from streamfl.methods.clp.probe import ClpProbe, ClpProbeConfig

#: With one trace a window and no decay, F_G is the trace: eq. 3 reads the traces directly.
PLAIN = dict(trace_window=1, staleness_decay=0.0, growth_threshold=0.1)
LOGGER = "streamfl.methods.clp.coordinator"


def flapping(n):
    """Traces 1, 2, 1, 2, ...: growth +100 % then -50 %, so eq. 3 flips the flag every version."""
    return [1.0 if v % 2 else 2.0 for v in range(1, n + 1)]


def flags(probe, traces, step_s=1.0):
    """The flag after each aggregation v = 1, 2, ... at v * step_s seconds."""
    return [probe.on_aggregation(v, v - 1, f, v * step_s).in_clp for v, f in enumerate(traces, start=1)]


def eq3(traces, sigma):
    """Eq. 3 by hand on F_G = the traces: in the CLP first, then growth >= sigma."""
    out = [True]
    for prev, f in zip(traces, traces[1:]):
        out.append((f - prev) / prev >= sigma)
    return out


def changes(values):
    return sum(a != b for a, b in zip(values, values[1:]))


# ---- the defaults: eq. 3 as written ------------------------------------------------------------

def test_defaults_damp_nothing_and_follow_eq_3():
    cfg = ClpProbeConfig()
    assert (cfg.growth_hysteresis, cfg.flag_min_dwell_versions, cfg.flag_min_dwell_s) == (0.0, 0, 0.0)
    traces = [1.0, 2.0, 1.0, 1.05, 1.2, 1.32, 1.3, 2.0, 2.1, 1.0]
    assert flags(ClpProbe(ClpProbeConfig(**PLAIN)), traces) == eq3(traces, 0.1)
    assert flags(ClpProbe(ClpProbeConfig(**PLAIN)), flapping(20)) == eq3(flapping(20), 0.1)
    assert changes(eq3(flapping(20), 0.1)) == 18            # every version from 3 on: the flapping


def test_a_probe_without_times_still_runs_unless_a_dwell_in_seconds_is_asked_for():
    probe = ClpProbe(ClpProbeConfig(**PLAIN))
    assert [probe.on_aggregation(v, v - 1, f).in_clp for v, f in enumerate([1.0, 2.0, 1.0], 1)] == \
        [True, True, False]
    timed = ClpProbe(ClpProbeConfig(flag_min_dwell_s=5.0, **PLAIN))
    with pytest.raises(ValueError, match="flag_min_dwell_s"):
        timed.on_aggregation(1, 0, 1.0)


# ---- minimum dwell -----------------------------------------------------------------------------

def test_a_dwell_in_versions_holds_the_flag_then_it_follows_eq_3_again():
    probe = ClpProbe(ClpProbeConfig(flag_min_dwell_versions=5, **PLAIN))
    got = flags(probe, flapping(30))
    plain = eq3(flapping(30), 0.1)
    changed_at = [v for v in range(2, 31) if got[v - 1] != got[v - 2]]
    assert changed_at == [3, 8, 13, 18, 23, 28]            # the first as eq. 3, then every 5 versions
    for v in changed_at:
        assert got[v - 1] == plain[v - 1]                  # each change is eq. 3's verdict of that version
    assert probe.flag_changes == 6 and probe.flag_since_version == 28


def test_a_dwell_in_seconds_holds_the_flag_for_that_long():
    probe = ClpProbe(ClpProbeConfig(flag_min_dwell_s=10.0, **PLAIN))
    got = flags(probe, flapping(40), step_s=2.0)          # a version every 2 s
    changed_at = [2.0 * v for v in range(2, 41) if got[v - 1] != got[v - 2]]
    assert changed_at == [6.0, 16.0, 26.0, 36.0, 46.0, 56.0, 66.0, 76.0]
    assert min(b - a for a, b in zip(changed_at, changed_at[1:])) >= 10.0


def test_both_dwells_hold_until_both_have_passed():
    probe = ClpProbe(ClpProbeConfig(flag_min_dwell_versions=3, flag_min_dwell_s=10.0, **PLAIN))
    got = flags(probe, flapping(20), step_s=1.0)
    changed_at = [v for v in range(2, 21) if got[v - 1] != got[v - 2]]
    assert changed_at == [3, 14]                          # 10 s (10 versions) outlast 3 versions


def test_a_held_flag_starts_no_segment_and_the_dwell_survives_a_restart():
    cfg = ClpProbeConfig(flag_min_dwell_versions=4, **PLAIN)
    probe = ClpProbe(cfg)
    flags(probe, flapping(6))                              # changes at 3 (out) and 7 would be next
    assert probe.current().segment == 0 and probe.flag_since_version == 3
    restored = ClpProbe(cfg)
    restored.load_state(json.loads(json.dumps(probe.state())))
    assert (restored.flag_since_version, restored.flag_changes) == (3, 1)
    rest = flapping(12)[6:]
    assert [restored.on_aggregation(v, v - 1, f, float(v)).in_clp for v, f in enumerate(rest, 7)] == \
        [probe.on_aggregation(v, v - 1, f, float(v)).in_clp for v, f in enumerate(rest, 7)]
    assert probe.current().segment == 1                    # the re-entry at 7 starts a segment


# ---- hysteresis ---------------------------------------------------------------------------------

def test_hysteresis_needs_the_growth_to_cross_the_band():
    probe = ClpProbe(ClpProbeConfig(growth_hysteresis=0.05, **PLAIN))   # band [0.05, 0.15)
    f = [1.0]
    for growth in (0.07, 0.04, 0.12, 0.14, 0.16, 0.06, 0.049):
        f.append(f[-1] * (1.0 + growth))
    assert flags(probe, f) == [True,
                               True,    # +7 %: below sigma but inside the band: stays in
                               False,   # +4 %: below sigma - h: leaves
                               False,   # +12 %: above sigma but inside the band: stays out
                               False,   # +14 %
                               True,    # +16 %: crosses sigma + h: enters
                               True,    # +6 %: inside the band: stays in
                               False]   # +4.9 %: leaves
    assert flags(ClpProbe(ClpProbeConfig(**PLAIN)), f) == eq3(f, 0.1)
    assert eq3(f, 0.1) == [True, False, False, True, True, True, False, False]


def test_hysteresis_keeps_eq_3s_guard_on_a_zero_estimate():
    probe = ClpProbe(ClpProbeConfig(growth_hysteresis=5.0, **PLAIN))
    assert flags(probe, [0.0, 0.0, 1.0]) == [True, False, True]    # 0 -> 0 leaves, 0 -> 1 enters


def test_damping_settings_are_checked():
    for bad in ({"growth_hysteresis": -0.1}, {"flag_min_dwell_versions": -1},
                {"flag_min_dwell_versions": 1.5}, {"flag_min_dwell_s": -1.0},
                {"flag_min_dwell_s": float("nan")}, {"flag_log_interval_s": -5.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ClpProbeConfig(**bad)
    with pytest.raises(ConfigError, match="flag_min_dwell_s"):
        build(ClpProbeConfig, {"flag_min_dwell_s": 1e12}, "plugins.clp")
    assert build(ClpProbeConfig, {"growth_hysteresis": 0.02, "flag_min_dwell_versions": 10},
                 "plugins.clp").flag_min_dwell_versions == 10


# ---- the log -------------------------------------------------------------------------------------

def plugin(**settings):
    return ClpProbePlugin(ClpProbeConfig(**dict(PLAIN, **settings)), FleetView(lambda: ["d0"]), {})


def run(p, traces, step_s=1.0, start_v=1):
    """Aggregations of d0's traces ``step_s`` apart, each followed by a tick a little later."""
    for v, f in enumerate(traces, start=start_v):
        update = make_update(device_id="d0", base_version=v - 1, extras={"fisher_trace": FisherTrace(f)})
        p.on_model_made(Aggregation(v, (update,), v * step_s))
        p.on_tick(v * step_s + 0.5)


def info(caplog):
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.INFO]


def test_repeated_flag_changes_are_summed_up_once_a_minute(caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    p = plugin()                                           # flag_log_interval_s 60 by default
    run(p, flapping(150))                                  # 148 changes in 150 s
    lines = info(caplog)
    assert lines[0].startswith("v3: left the CLP")         # the first change, as it came
    summaries = lines[1:]
    assert summaries == ["CLP flag changed 60 times in the last 60 s; now not critical since version 63",
                         "CLP flag changed 60 times in the last 60 s; now not critical since version 123"]
    debug = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.DEBUG
             and "the CLP (F_G" in r.getMessage()]
    assert len(debug) == 147                               # each held change is still at DEBUG
    assert p.probe.flag_changes == 148
    # the flapping stops (2 -> 2 leaves once more): what was held is told at the first tick due
    caplog.clear()
    run(p, [2.0] * 80, start_v=151)
    assert info(caplog) == ["CLP flag changed 28 times in the last 60 s; now not critical since version 151"]


def test_a_lone_change_after_a_quiet_minute_is_logged_as_it_comes(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    p = plugin()
    run(p, [1.0, 2.0, 2.0] + [2.0] * 100 + [4.0])          # out at 3, in again at 104
    assert info(caplog) == ["v3: left the CLP (F_G 2 -> 2)", "v104: entered the CLP (F_G 2 -> 4)"]


def test_interval_zero_logs_every_change(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    run(plugin(flag_log_interval_s=0.0), flapping(10))
    lines = info(caplog)
    assert len(lines) == 8 and all("the CLP (F_G" in line for line in lines)


def test_the_flag_log_says_one_change_in_the_singular(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    log = FlagChangeLog(logging.getLogger(LOGGER), 10.0)
    log.changed(False, 5, 0.0, "v5: left")
    log.changed(True, 6, 1.0, "v6: entered")
    log.flush(5.0)
    log.flush(12.0)
    log.flush(30.0)
    assert info(caplog) == ["v5: left", "CLP flag changed 1 time in the last 12 s; now critical since version 6"]
    with pytest.raises(ValueError):
        FlagChangeLog(logging.getLogger(LOGGER), -1.0)


def test_damping_cuts_the_logged_changes_of_a_flapping_flag(caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    p = plugin(flag_min_dwell_s=30.0, flag_log_interval_s=0.0)
    run(p, flapping(180))                                  # 3 minutes of eq. 3 flipping every second
    assert p.probe.flag_changes == 6
    assert len(info(caplog)) == 6
    assert p.describe(181.0).fleet["flag_changes"] == 6
