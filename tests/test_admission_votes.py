"""Admission against one hostile device: its updates are one vote in the norm bound, its rate is
limited, it cannot use the model-norm floor every time, and no saved state locks honest devices out."""
import numpy as np
import pytest

from factories import make_update
from streamfl.coordinator.admission import AdmissionConfig, UpdateAdmission

BASE = {"w": np.zeros(100, np.float32), "b": np.ones(10, np.float32)}
HONEST = ("pi-0", "pi-1", "pi-2")


def update(device, size, direction=0, spr=0.0, samples=0):
    """An update whose delta from BASE has norm ``size`` along ``w[direction]``."""
    w = np.zeros(100, np.float32)
    w[direction % 100] = size
    return make_update(BASE, device_id=device, tensors={"w": w, "b": BASE["b"]},
                       seconds_per_sample=spr, num_samples=samples)


def admission(**over):
    values = dict(warmup_updates=3, min_norm_ratio=1e-6, max_updates_per_s=None)
    values.update(over)
    return UpdateAdmission(AdmissionConfig(**values))


def test_a_flood_of_tiny_deltas_is_one_vote_and_never_locks_honest_devices_out():
    adm = admission()
    t = 0.0
    for rnd in range(5):
        for d in HONEST:
            t += 1.0
            assert adm.check(update(d, 1.0, rnd), BASE, True, t).update is not None
    for i in range(2000):                                        # the flood: 2000 deltas of 1e-6
        adm.check(update("mallory", 1e-6, i), BASE, True, t)
    assert adm.reference() == pytest.approx(1.0)
    for d in HONEST:                                             # honest deltas still count whole
        verdict = adm.check(update(d, 1.0, 7), BASE, True, t + 1)
        assert verdict.update is not None and not verdict.clipped


def test_a_saved_lockout_heals_within_a_few_honest_updates():
    adm = admission()
    for i in range(20):
        adm.check(update("mallory", 1e-4, i), BASE, True, 0.0)   # a state owned by the flood
    restarted = admission()
    restarted.load_state(adm.state())
    assert restarted.bound(BASE) == pytest.approx(3e-4)
    rejected = 0
    for rnd in range(4):
        for d in HONEST:
            if restarted.check(update(d, 1.0, rnd), BASE, True, 1.0 + rnd).update is None:
                rejected += 1
    assert rejected <= 1                                          # the first honest norm votes too
    assert restarted.check(update("pi-0", 1.0, 9), BASE, True, 9.0).update is not None


def test_the_floor_serves_occasional_outliers_not_a_device_whose_deltas_are_always_big():
    adm = admission(min_norm_ratio=0.25, warmup_updates=3)
    base = {"w": np.full(100, 0.5, np.float32), "b": BASE["b"]}    # norm ~5.1: floor ~1.28
    for rnd in range(3):
        for d in HONEST:
            adm.check(make_update(base, device_id=d, tensors={"w": base["w"] + 0.001 * (rnd + 1),
                                                              "b": base["b"]}), base, True, 0.0)
    fleet_bound = adm.bound(base, floor=False)
    assert fleet_bound < 0.1
    outlier = {"w": base["w"] + np.float32(0.1), "b": base["b"]}  # norm 1.0, under the floor
    verdicts = [adm.check(make_update(base, device_id="pi-0", tensors=outlier), base, True, 1.0 + i)
                for i in range(5)]
    # Its median is still its usual small delta for three outliers: they count whole...
    assert all(v.update is not None and not v.clipped for v in verdicts[:3])
    # ...then its own median is beyond the fleet's bound, and it is held to that bound.
    assert all(v.clipped and v.bound == pytest.approx(fleet_bound, rel=1e-3) for v in verdicts[3:])


def test_a_device_counts_no_faster_than_its_rounds_or_the_rate_limit():
    adm = admission(max_updates_per_s=2.0, rate_burst=4, round_time_fraction=0.5)
    accepted = sum(adm.check(update("mallory", 1.0, i), BASE, True, i / 20.0).update is not None
                   for i in range(20))                            # 20 in one second
    assert accepted == 4 + 2 - 1 or accepted == 4 + 2             # the burst, then 2/s
    assert adm.counters["rejected_rate"] == 20 - accepted
    # An honest board whose rounds take 3 s and come every 3 s is never held back.
    slow = [adm.check(update("pi-0", 1.0, i, spr=0.03, samples=100), BASE, True, 3.0 * i).update
            for i in range(10)]
    assert all(u is not None for u in slow)
    # A device that claims 3 s rounds but sends every 0.5 s counts once per 1.5 s after its burst.
    fast = [adm.check(update("pi-1", 1.0, i, spr=0.03, samples=100), BASE, True, 0.5 * i).update
            for i in range(30)]
    assert sum(u is not None for u in fast) <= 4 + 15 / 1.5 + 1


def test_a_claimed_sample_count_counts_at_most_a_multiple_of_the_peers():
    adm = admission(samples_peer_multiple=4.0)
    for d in HONEST:
        assert adm.check(update(d, 1.0, samples=320), BASE, True, 1.0).update.num_samples == 320
    forged = adm.check(update("mallory", 1.0, samples=10 ** 9), BASE, True, 2.0).update
    assert forged.num_samples == 4 * 320 and adm.counters["samples_capped"] == 1
    assert adm.check(update("pi-0", 1.0, samples=300), BASE, True, 3.0).update.num_samples == 300


def test_a_backlog_trained_from_an_old_model_counts_whole_but_a_flood_from_the_new_one_does_not():
    adm = admission(max_updates_per_s=2.0, rate_burst=4, round_time_fraction=0.5)
    # Cut off at t=0 with the model of t=0, the board trained 60 rounds of 1 s, then sent them all
    # at t=70 when it was back.
    backlog = [adm.check(update("pi-0", 1.0, i, spr=0.01, samples=100), BASE, True, 70.0,
                         base_made_s=0.0).update for i in range(60)]
    assert all(u is not None for u in backlog)
    # A device sending 60 at once from the model made just now: the slack only.
    flood = [adm.check(update("mallory", 1.0, i, spr=0.01, samples=100), BASE, True, 70.0,
                       base_made_s=69.9).update for i in range(60)]
    assert sum(u is not None for u in flood) <= 4 + 1
