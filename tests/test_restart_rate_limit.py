"""A restarted coordinator still knows how old its saved version is: the backlog boards trained
from it while the coordinator was down pays for itself in the rate limit instead of being dropped
as rejected_rate (the field lab saw half of every restart's backlog dropped)."""
import numpy as np

from factories import SPEC, greet, make_update
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.core import CoordinatorCore
from streamfl.config import build


def config():
    # One update per 2 s at most, a slack of 4: a 60 s outage pays for 30 rounds.
    return build(CoordinatorConfig, {"model": SPEC.__dict__, "strategy": "fedasync",
                                     "admission": {"max_updates_per_s": 0.5, "rate_burst": 4}}, "t")


def backlog(core, n, now):
    """``n`` updates from one board, all trained from the version the core holds, arriving at once."""
    outcomes = []
    for _ in range(n):
        near = {k: v + np.float32(0.001) for k, v in core.model.items()}
        step = core.on_update(make_update(device_id="pi-01", base_version=0, tensors=near), now)
        event = step.update.as_event()
        outcomes.append(event.get("reason") if event["outcome"] == "rejected" else event["outcome"])
    return outcomes


def saved_core(now=100.0):
    core = greet(CoordinatorCore(config(), now=now, run_id="r1"), "pi-01", now=now)
    return core, core.state()


def restored(saved_ago_s, now=5000.0):
    first, state = saved_core()
    core = CoordinatorCore(config(), now=now, tensors=first.model)
    core.restore(first.model, state, now, saved_ago_s=saved_ago_s)
    return core


def test_a_backlog_after_a_restart_pays_with_the_time_the_coordinator_was_down():
    outcomes = backlog(restored(saved_ago_s=60.0), 20, now=5000.0)
    assert outcomes.count("rate") == 0, outcomes
    assert outcomes.count("aggregated") == 20


def test_without_the_downtime_the_same_backlog_is_mostly_dropped():
    # What the restart did before: the saved version counted as made at the restart.
    outcomes = backlog(restored(saved_ago_s=0.0), 20, now=5000.0)
    assert outcomes.count("rate") >= 14, outcomes


def test_a_flood_beyond_the_downtime_is_still_dropped():
    outcomes = backlog(restored(saved_ago_s=10.0), 40, now=5000.0)
    assert 5 <= outcomes.count("aggregated") <= 12 and outcomes.count("rate") >= 28, outcomes


def test_saved_times_of_older_versions_come_back_relative_to_the_newest():
    core, _ = saved_core(now=0.0)
    for i in range(5):  # versions 1..5, made 10 s apart
        near = {k: v + np.float32(0.001) for k, v in core.model.items()}
        core.on_update(make_update(device_id="pi-01", base_version=core.version, tensors=near),
                       10.0 * (i + 1))
    assert core.version == 5
    state = core.state()
    again = CoordinatorCore(config(), now=1000.0, tensors=core.model)
    again.restore(core.model, state, 1000.0, saved_ago_s=30.0)
    assert again.history.made_s(5) == 970.0
    assert again.history.made_s(2) == 940.0
    # Malformed saved times are ignored, never a crash.
    state["version_times"] = {"first": 0, "before_s": ["x"]}
    third = CoordinatorCore(config(), now=1000.0, tensors=core.model)
    third.restore(core.model, state, 1000.0, saved_ago_s=30.0)
    assert third.history.made_s(2) is None and third.history.made_s(5) == 970.0
