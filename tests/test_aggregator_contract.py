"""One contract suite over every aggregation strategy (and each staleness function of FedAsync):
new arrays out, inputs never mutated, the same updates give the same models, an Outcome that says
what it did, state round-trips through JSON. A new strategy is covered by adding it to ``STRATEGIES``."""
import copy
import json

import numpy as np
import pytest

from factories import make_update
from streamfl.coordinator.strategies import (AGGREGATED, BUFFERED, STALE, STALENESS_NAMES, FedAsyncAggregator,
                                             FedAvgAggregator, Outcome, make_staleness)
from streamfl.protocol.messages import Update

DEVICES = ("d0", "d1", "d2")

STRATEGIES = {
    **{"fedasync-%s" % s: (lambda s=s: FedAsyncAggregator(alpha=0.6, staleness_fn=make_staleness(s),
                                                          max_staleness=6))
       for s in STALENESS_NAMES},
    "fedavg": lambda: FedAvgAggregator(deadline_s=2.0, online_devices=lambda: DEVICES),
    "fedavg-2-per-round": lambda: FedAvgAggregator(deadline_s=2.0, online_devices=lambda: DEVICES,
                                                   clients_per_round=2),
}


def model():
    rng = np.random.default_rng(0)
    return {"w": rng.normal(size=(3, 4)).astype(np.float32), "b": rng.normal(size=4).astype(np.float32)}


def feed(strategy, n=15, seed=1):
    """Drive ``strategy`` like the core does; every model it made, in order."""
    rng = np.random.default_rng(seed)
    current, version, made = model(), 0, []
    for k in range(n):
        u = make_update(current, device_id=DEVICES[k % 3], update_id="u%d" % k,
                        base_version=max(0, version - k % 3), num_samples=5 + k,
                        tensors={n_: rng.normal(size=a.shape).astype(np.float32) for n_, a in current.items()})
        for outcome in (strategy.on_update(current, version, u, float(k)), strategy.on_tick(current, version, k + 0.9)):
            if outcome is not None and outcome.model is not None:
                current, version = outcome.model, version + 1
                made.append(outcome.model)
    return made


@pytest.mark.parametrize("name", sorted(STRATEGIES))
class TestAggregatorContract:

    def test_it_aggregates_into_new_float32_arrays_of_the_model_shapes(self, name):
        made = feed(STRATEGIES[name]())
        assert made
        ref = model()
        for m in made:
            assert set(m) == set(ref)
            assert all(m[k].shape == ref[k].shape and m[k].dtype == np.float32 for k in ref)
            assert all(np.isfinite(m[k]).all() for k in ref)

    def test_inputs_are_never_mutated(self, name):
        strategy = STRATEGIES[name]()
        current = model()
        kept = copy.deepcopy(current)
        rng = np.random.default_rng(3)
        updates = [make_update(current, device_id=d, update_id=d, num_samples=4,
                               tensors={k: rng.normal(size=a.shape).astype(np.float32) for k, a in current.items()})
                   for d in DEVICES]
        shown = copy.deepcopy(updates)
        outcomes = [strategy.on_update(current, 0, u, 0.0) for u in updates] + [strategy.on_tick(current, 0, 5.0)]
        outs = [o.model for o in outcomes if o is not None]
        assert all(np.array_equal(current[k], kept[k]) for k in kept)
        for u, s in zip(updates, shown):
            assert all(np.array_equal(u.tensors[k], s.tensors[k]) for k in s.tensors)
        for out in outs:
            if out is not None:
                assert all(out[k] is not current[k] for k in out)
                assert all(not any(out[k] is u.tensors[k] for u in updates) for k in out)

    def test_the_same_updates_give_the_same_models(self, name):
        a, b = feed(STRATEGIES[name]()), feed(STRATEGIES[name]())
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert all(np.array_equal(x[k], y[k]) for k in x)

    def test_it_returns_what_it_did(self, name):
        strategy = STRATEGIES[name]()
        current, rng = model(), np.random.default_rng(5)
        for k in range(9):
            u = make_update(current, device_id=DEVICES[k % 3], update_id="u%d" % k, base_version=0,
                            num_samples=3, tensors={n_: rng.normal(size=a.shape).astype(np.float32)
                                                    for n_, a in current.items()})
            outcome = strategy.on_update(current, 0, u, float(k))
            assert isinstance(outcome, Outcome) and outcome.kind in (AGGREGATED, BUFFERED, STALE)
            ticked = strategy.on_tick(current, 0, k + 0.5)
            assert ticked is None or (isinstance(ticked, Outcome) and ticked.kind == AGGREGATED)
            for o in (outcome, ticked):
                if o is not None and o.model is not None:
                    assert o.merged and all(isinstance(m, Update) for m in o.merged)
                    assert (o.mixing_weight is None) == strategy.normalizes_weights
                elif o is not None:
                    assert o.merged == () and o.mixing_weight is None
        assert not any(hasattr(strategy, a) for a in ("last_outcome", "last_aggregated", "last_weight"))

    def test_state_round_trips_through_json(self, name):
        strategy = STRATEGIES[name]()
        feed(strategy)
        saved = strategy.state()
        fresh = STRATEGIES[name]()
        fresh.load_state(json.loads(json.dumps(saved)))
        assert fresh.state() == saved
