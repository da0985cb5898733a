"""Synchronous FedAvg with a deadline: weighted average, completion, deadline, stale drop."""
import numpy as np
import pytest

from streamfl.coordinator.strategies import (AGGREGATED, BUFFERED, STALE, FedAvgAggregator, Outcome,
                                             weighted_average)
from streamfl.protocol.messages import Update

MODEL = {"w": np.zeros(2, dtype=np.float32)}


def update(device, value, num_samples=1, base_version=0):
    return Update(device_id=device, update_id="%s-%s" % (device, value), base_version=base_version,
                  arch_id="a", tensors={"w": np.full(2, value, dtype=np.float32)},
                  num_samples=num_samples, class_counts={}, loss=0.1, seconds_per_sample=0.01)


class Online:
    """The registry's online view, settable by the test."""

    def __init__(self, *devices):
        self.devices = list(devices)

    def __call__(self):
        return list(self.devices)


def test_weighted_average_by_samples():
    out = weighted_average([update("a", 0.0, 1), update("b", 4.0, 3)])
    np.testing.assert_allclose(out["w"], [3.0, 3.0])
    assert out["w"].dtype == np.float32
    equal = weighted_average([update("a", 1.0, 0), update("b", 3.0, 0)])
    np.testing.assert_allclose(equal["w"], [2.0, 2.0])


def test_weighted_average_times_the_methods_factors():
    out = weighted_average([update("a", 0.0, 1), update("b", 4.0, 3)], factors=[3.0, 1.0])
    np.testing.assert_allclose(out["w"], [2.0, 2.0])  # 1*3 against 3*1: an even split
    only_a = weighted_average([update("a", 1.0, 2), update("b", 5.0, 2)], factors=[1.0, 0.0])
    np.testing.assert_allclose(only_a["w"], [1.0, 1.0])
    no_samples = weighted_average([update("a", 1.0, 0), update("b", 4.0, 0)], factors=[2.0, 1.0])
    np.testing.assert_allclose(no_samples["w"], [2.0, 2.0])
    with pytest.raises(ValueError, match="factors"):
        weighted_average([update("a", 1.0, 1)], factors=[1.0, 1.0])


def test_a_round_weighs_each_update_by_its_factor():
    agg = FedAvgAggregator(deadline_s=30.0, online_devices=Online("a", "b"))
    agg.on_update(MODEL, 0, update("a", 2.0, 1), now=0.0, weight=3.0)
    out = agg.on_update(MODEL, 0, update("b", 6.0, 1), now=1.0, weight=1.0).model
    np.testing.assert_allclose(out["w"], [3.0, 3.0])
    # the next round starts from factors of 1 again
    agg.on_update(out, 1, update("a", 2.0, 1, base_version=1), now=2.0)
    nxt = agg.on_update(out, 1, update("b", 6.0, 1, base_version=1), now=3.0).model
    np.testing.assert_allclose(nxt["w"], [4.0, 4.0])


def test_aggregates_when_all_expected_devices_reported():
    agg = FedAvgAggregator(deadline_s=30.0, online_devices=Online("a", "b"))
    first = agg.on_update(MODEL, 0, update("a", 2.0, 1), now=0.0)
    assert first == Outcome(BUFFERED) and first.model is None and first.merged == ()
    out = agg.on_update(MODEL, 0, update("b", 6.0, 1), now=1.0)
    assert out.kind == AGGREGATED
    assert [u.device_id for u in out.merged] == ["a", "b"]
    assert out.mixing_weight is None                         # a round: no one update's share
    np.testing.assert_allclose(out.model["w"], [4.0, 4.0])
    assert agg.rounds == 1


def test_repeat_from_same_device_replaces_its_update():
    agg = FedAvgAggregator(online_devices=Online("a", "b"))
    agg.on_update(MODEL, 0, update("a", 100.0), now=0.0)
    agg.on_update(MODEL, 0, update("a", 2.0), now=0.5)
    out = agg.on_update(MODEL, 0, update("b", 4.0), now=1.0)
    np.testing.assert_allclose(out.model["w"], [3.0, 3.0])
    assert [u.update_id for u in out.merged] == ["a-2.0", "b-4.0"]


def test_deadline_aggregates_what_arrived():
    agg = FedAvgAggregator(deadline_s=30.0, online_devices=Online("a", "b"))
    assert agg.on_tick(MODEL, 0, now=0.0) is None            # round starts
    agg.on_update(MODEL, 0, update("a", 2.0), now=1.0)
    assert agg.on_tick(MODEL, 0, now=29.0) is None
    out = agg.on_tick(MODEL, 0, now=30.5)
    assert out.kind == AGGREGATED and [u.device_id for u in out.merged] == ["a"]
    assert out.mixing_weight is None
    np.testing.assert_allclose(out.model["w"], [2.0, 2.0])


def test_deadline_restarts_without_min_updates():
    agg = FedAvgAggregator(deadline_s=10.0, min_updates=2, online_devices=Online("a", "b"))
    agg.on_tick(MODEL, 0, now=0.0)
    agg.on_update(MODEL, 0, update("a", 1.0), now=1.0)
    assert agg.on_tick(MODEL, 0, now=11.0) is None
    assert agg.deadline_restarts == 1
    assert agg.on_tick(MODEL, 0, now=20.0) is None           # new deadline is 21
    out = agg.on_update(MODEL, 0, update("b", 3.0), now=20.5)  # everyone expected reported
    np.testing.assert_allclose(out.model["w"], [2.0, 2.0])


def test_stale_updates_dropped_and_counted():
    agg = FedAvgAggregator(online_devices=Online("a"))
    assert agg.on_update(MODEL, 3, update("a", 1.0, base_version=2), now=0.0) == Outcome(STALE)
    assert agg.stale_dropped == 1
    assert agg.on_update(MODEL, 3, update("a", 1.0, base_version=3), now=0.0).model is not None


def test_device_going_offline_is_not_waited_for():
    online = Online("a", "b")
    agg = FedAvgAggregator(deadline_s=100.0, online_devices=online)
    agg.on_update(MODEL, 0, update("a", 5.0), now=0.0)
    online.devices = ["a"]                                   # b's last will arrived
    out = agg.on_tick(MODEL, 0, now=1.0)
    np.testing.assert_allclose(out.model["w"], [5.0, 5.0])


def test_no_devices_known_waits_for_deadline():
    agg = FedAvgAggregator(deadline_s=5.0, online_devices=Online())
    assert agg.on_update(MODEL, 0, update("a", 1.0), now=0.0).kind == BUFFERED
    assert agg.on_tick(MODEL, 0, now=5.5).model is not None


def test_an_outcome_has_a_model_exactly_when_it_aggregated():
    with pytest.raises(ValueError, match="model"):
        Outcome(AGGREGATED)
    with pytest.raises(ValueError, match="model"):
        Outcome(BUFFERED, MODEL)
    with pytest.raises(ValueError, match="kind"):
        Outcome("dropped")


def test_invalid_parameters():
    with pytest.raises(ValueError):
        FedAvgAggregator(deadline_s=0)
    with pytest.raises(ValueError):
        FedAvgAggregator(min_updates=0)


class CountingOnline:
    """A set of online devices that counts membership tests and devices listed (what a round costs
    the coordinator)."""

    def __init__(self, devices):
        self.devices, self.tests = set(devices), 0

    def __contains__(self, device):
        self.tests += 1
        return device in self.devices

    def __iter__(self):
        self.tests += len(self.devices)
        return iter(self.devices)

    def __len__(self):
        return len(self.devices)


def test_a_round_of_n_devices_costs_about_n_online_checks_not_n_squared():
    """Each update asks whether a device the round waits for is still missing and online; the
    check stops at the first such device, so a round's cost grows with n, not n^2 (which at
    thousands of boards was seconds of the coordinator's time per round)."""
    n = 2000
    devices = ["dev%04d" % k for k in range(n)]
    online = CountingOnline(devices)
    agg = FedAvgAggregator(deadline_s=30.0, online_devices=lambda: online)
    outcomes = [agg.on_update(MODEL, 0, update(d, 1.0), now=float(k)) for k, d in enumerate(devices)]
    assert [o.kind for o in outcomes].count(AGGREGATED) == 1 and outcomes[-1].kind == AGGREGATED
    assert online.tests <= 4 * n
    # a missing device that went offline is no longer waited for, one still online is
    agg.on_update(outcomes[-1].model, 1, update("dev0000", 1.0, base_version=1), now=1e4)
    online.devices -= {"dev0001"}
    for d in devices[2:]:
        out = agg.on_update(outcomes[-1].model, 1, update(d, 1.0, base_version=1), now=1e4)
    assert out.kind == AGGREGATED
