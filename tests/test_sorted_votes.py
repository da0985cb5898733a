"""SortedVotes gives the same medians as statistics.median and shares.median_of over the same
values, as votes are replaced, dropped and expire."""
import random
import statistics

import pytest

from streamfl.coordinator.shares import median_of
from streamfl.coordinator.sorted_votes import SortedVotes, middle


def test_medians_match_the_reference_functions_bit_for_bit_under_random_churn():
    rng = random.Random(7)
    votes = SortedVotes()
    truth = {}
    for step in range(3000):
        device = "d%d" % rng.randrange(60)
        kind = rng.random()
        if kind < 0.8:
            value = rng.choice([rng.random() * 10 ** rng.randrange(-3, 4), float(rng.randrange(5)),
                                rng.randrange(1, 2000)])
            votes.set(device, value, at=float(step))
            truth.pop(device, None)
            truth[device] = value
        else:
            votes.discard(device)
            truth.pop(device, None)
        assert len(votes) == len(truth)
        if truth:
            assert votes.median() == statistics.median(list(truth.values()))
        probe = "d%d" % rng.randrange(60)
        others = [v for d, v in truth.items() if d != probe]
        got = votes.median_without(probe)
        assert got == (median_of(others) if others else None), (step, probe)


def test_votes_expire_after_their_time_to_live_and_untimed_ones_never():
    votes = SortedVotes()
    votes.set("old", 1.0, at=0.0)
    votes.set("mid", 2.0, at=5.0)
    votes.set("new", 9.0, at=10.0)
    assert votes.expire(now=10.0, ttl_s=10.0) == 0          # exactly ttl old: still counts
    assert votes.expire(now=12.0, ttl_s=10.0) == 1 and "old" not in votes
    assert votes.median() == 5.5
    votes.set("mid", 3.0, at=12.0)                           # a new vote moves it to the back
    assert votes.expire(now=21.0, ttl_s=10.0) == 1 and list(votes.values()) == ["mid"]
    forever = SortedVotes()
    forever.set("restored", 4.0)
    assert forever.expire(now=1e9, ttl_s=1.0) == 0 and forever.median() == 4.0


def test_empty_and_single_votes():
    votes = SortedVotes()
    assert votes.median() is None and votes.median_without("x") is None and middle([]) is None
    votes.set("only", 3)
    assert votes.median() == 3.0 and votes.median_without("only") is None
    assert votes.median_without("other") == 3.0
    votes.clear()
    assert len(votes) == 0 and votes.median() is None


@pytest.mark.parametrize("values", [[1, 1, 1, 2], [2.5, 2.5, 0.0, 7.0, 2.5]])
def test_leave_one_out_with_ties_skips_exactly_one_copy(values):
    votes = SortedVotes()
    for i, v in enumerate(values):
        votes.set("d%d" % i, v)
    for i in range(len(values)):
        others = values[:i] + values[i + 1:]
        assert votes.median_without("d%d" % i) == median_of(others)
