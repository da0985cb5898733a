"""One contract suite over every period boundary source (``methods/stewc/periods``), then each one's own
rules: the schedule keeps its phase, drift needs a quorum and a minimum period length."""
import json

import pytest

from streamfl.methods.stewc.periods import BOUNDARIES, DriftBoundary, ScheduleBoundary
from streamfl.methods.stewc.payloads import DriftSignal

DEVICES = ["a", "b", "c"]


def make(name):
    return {"schedule": lambda: ScheduleBoundary(10.0),
            "drift": lambda: DriftBoundary(quorum=0.5, min_period_s=10.0)}[name]()


def drive(boundary, until_s, drift_every_s=12.0):
    """Feed ticks (and, every ``drift_every_s``, a drift of every device); the boundary times."""
    fired = []
    counts = dict.fromkeys(DEVICES, 0)
    for step in range(int(until_s * 2) + 1):
        now = step / 2.0
        if now and now % drift_every_s == 0:
            counts = {d: c + 1 for d, c in counts.items()}
        for d in DEVICES:
            boundary.on_signal(d, DriftSignal(counts[d]), now)
        if boundary.due(now, DEVICES):
            boundary.started(now)
            fired.append(now)
    return fired


@pytest.mark.parametrize("name", BOUNDARIES)
def test_no_boundary_before_a_period_has_run(name):
    boundary = make(name)
    assert not boundary.due(0.0, DEVICES) and not boundary.due(5.0, DEVICES)


@pytest.mark.parametrize("name", BOUNDARIES)
def test_boundaries_fire_and_a_started_period_is_not_over_at_once(name):
    boundary = make(name)
    fired = drive(boundary, 60.0)
    assert fired and all(b - a >= 10.0 for a, b in zip(fired, fired[1:]))
    assert not boundary.due(fired[-1], DEVICES)


@pytest.mark.parametrize("name", BOUNDARIES)
def test_state_round_trips_through_json_and_answers_the_same(name):
    one, two = make(name), make(name)
    drive(one, 30.0)
    two.load_state(json.loads(json.dumps(one.state())))
    assert two.state() == one.state()
    assert drive(one, 80.0) == drive(two, 80.0)


@pytest.mark.parametrize("name", BOUNDARIES)
def test_malformed_state_is_refused(name):
    with pytest.raises(ValueError):
        make(name).load_state({"ended": -1, "start_s": "soon", "base": [], "latest": {"a": -2}})


def test_the_schedule_keeps_its_phase_however_late_it_is_asked():
    boundary = ScheduleBoundary(10.0)
    assert not boundary.due(0.0, [])
    assert boundary.due(13.0, [])            # asked late
    boundary.started(13.0)
    assert not boundary.due(19.9, []) and boundary.due(20.0, [])


def test_drift_needs_a_quorum_a_minimum_length_and_rebases_restarted_devices():
    boundary = DriftBoundary(quorum=0.5, min_period_s=10.0)
    assert not boundary.due(0.0, DEVICES + ["d"])
    for d in DEVICES + ["d"]:
        boundary.on_signal(d, DriftSignal(5), 1.0)       # history before the first report counts not
    boundary.on_signal("a", DriftSignal(6), 2.0)
    boundary.on_signal("b", DriftSignal(6), 2.0)
    assert not boundary.due(9.0, DEVICES + ["d"])         # too early
    assert boundary.due(10.0, DEVICES + ["d"])            # 2 of 4
    assert not boundary.due(10.0, ["a", "c", "d"])        # 1 of 3 online
    boundary.started(10.0)
    boundary.on_signal("c", DriftSignal(0), 11.0)          # c restarted: its count fell
    boundary.on_signal("c", DriftSignal(1), 50.0)
    assert boundary.drifted(["c"], 50.0) == 1
    assert boundary.drifted(["c"], 81.0) == 0              # too long ago to join a quorum
    with pytest.raises(ValueError):
        DriftBoundary(quorum=0.0)


def test_late_noticers_belong_to_the_boundary_just_cut_and_old_alarms_do_not_add_up():
    boundary = DriftBoundary(quorum=0.5, min_period_s=10.0, window_s=5.0)
    devices = ["a", "b", "c", "d"]
    boundary.due(0.0, devices)
    for d in devices:
        boundary.on_signal(d, DriftSignal(0), 0.0)
    for d in ("a", "b"):
        boundary.on_signal(d, DriftSignal(1), 20.0)
    assert boundary.due(20.0, devices)
    boundary.started(20.0)
    for d in ("c", "d"):                                   # the same move, noticed 3 s later
        boundary.on_signal(d, DriftSignal(1), 23.0)
    assert not boundary.due(40.0, devices)
    boundary.on_signal("a", DriftSignal(2), 41.0)          # false alarms, far apart
    boundary.on_signal("b", DriftSignal(2), 50.0)
    assert boundary.drifted(devices, 50.0) == 1 and not boundary.due(50.0, devices)
