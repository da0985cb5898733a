"""The coordinator's skip and train orders on a device: when a round may start."""
from streamfl.agent.orders import Orders


def test_a_skip_runs_from_its_first_consultation_and_is_bounded():
    o = Orders(max_skip_rounds=5, round_interval_s=2.0)
    assert o.skip({"rounds": 50}) and o.skip_rounds == 5 and o.skipping
    assert not o.allow(100.0, 3)          # consulted first at 100 s: lasts 5 x 2 s
    assert not o.allow(109.9, 3)
    assert o.allow(110.0, 3) and not o.skipping
    assert not o.skip({"rounds": "many"}) and o.allow(111.0, 3)


def test_a_train_order_waits_for_its_model_then_skips_after_its_rounds():
    o = Orders(max_skip_rounds=100, round_interval_s=1.0)
    o.skip({"rounds": 10})
    o.train({"rounds": 1, "then_skip": 4, "version": 7})
    assert not o.skipping and o.take_train_request() and not o.take_train_request()
    assert not o.allow(0.0, 6)            # the commanded model has not arrived
    assert o.allow(0.5, 7)
    o.round_started()                     # the one round spent: the skip begins
    assert o.skipping and not o.allow(1.0, 8) and o.allow(5.0, 8)


def test_a_malformed_train_budget_trains_unbounded():
    o = Orders(max_skip_rounds=3, round_interval_s=1.0)
    o.train({"rounds": 0, "then_skip": 2, "version": -1})
    assert (o.train_rounds_left, o.then_skip, o.train_from_version) == (None, 0, None)
    o.train({"rounds": 2, "then_skip": 99})
    assert (o.train_rounds_left, o.then_skip) == (2, 3)   # then_skip bounded too
    o.round_started()
    assert not o.skipping
    o.round_started()
    assert o.skipping and o.skip_rounds == 3
