"""CoordinatorCore: versions, duplicates, wrong architecture, bounded history, registry, FedAvg ticks."""
import dataclasses

import numpy as np
import pytest

from factories import SPEC, UNBOUNDED_ADMISSION, greet, make_hello, make_update
from streamfl.coordinator.admission import AdmissionConfig
from streamfl.coordinator.config import CoordinatorConfig, FedAvgConfig, HParams
from streamfl.coordinator.core import CoordinatorCore, initial_model
from streamfl.protocol.messages import Offline, Telemetry


def config(**kw):
    kw.setdefault("model", SPEC)
    kw.setdefault("admission", AdmissionConfig(**UNBOUNDED_ADMISSION))
    return CoordinatorConfig(**kw)


def make_core(**kw):
    """A core with open admission that has heard device d1's Hello."""
    return greet(CoordinatorCore(config(**kw)), "d1")


def test_initial_model_is_seeded():
    a = initial_model(config(seed=1))
    b = initial_model(config(seed=1))
    c = initial_model(config(seed=2))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert any(not np.array_equal(a[k], c[k]) for k in a)
    assert all(v.dtype == np.float32 for v in a.values())


def test_each_fedasync_update_increments_version():
    core = make_core(alpha=0.5, staleness="constant")
    before = {k: v.copy() for k, v in core.model.items()}
    rec = core.on_message(make_update(update_id="u1", value=2.0), now=1.0).update
    assert core.version == 1 and rec.aggregated and rec.outcome == "aggregated"
    assert rec.version == 1 and rec.staleness == 0 and rec.num_samples == 8
    for k in before:
        np.testing.assert_allclose(core.model[k], 0.5 * before[k] + 1.0, rtol=1e-6)
    rec = core.on_message(make_update(update_id="u2", base_version=0), now=2.0).update
    assert core.version == 2 and rec.staleness == 1
    assert core.counters["aggregated"] == 2 and core.counters["updates_received"] == 2


def test_duplicate_update_ids_dropped():
    core = make_core()
    core.on_message(make_update(update_id="same"), now=0.0)
    rec = core.on_message(make_update(update_id="same"), now=1.0).update
    assert rec.outcome == "duplicate" and not rec.aggregated
    assert core.version == 1 and core.counters["duplicates"] == 1


def test_dedup_window_is_bounded():
    core = make_core(dedup_window=2)
    for uid in ("a", "b", "c"):
        core.on_message(make_update(update_id=uid), now=0.0)
    core.on_message(make_update(update_id="a"), now=0.0)     # forgotten: accepted again
    core.on_message(make_update(update_id="c"), now=0.0)     # still remembered
    assert core.version == 4 and core.counters["duplicates"] == 1


def test_wrong_architecture_rejected_and_counted():
    core = make_core()
    rec = core.on_message(make_update(arch_id="lstm-c6-w50-k6-h128"), now=0.0).update
    assert rec.outcome == "rejected" and core.version == 0 and core.counters["rejected"] == 1
    bad = make_update(update_id="u2")
    bad.tensors["extra"] = np.zeros(1, dtype=np.float32)
    core.on_message(bad, now=0.0)
    assert core.version == 0 and core.counters["rejected"] == 2


def test_class_counts_outside_the_models_classes_are_rejected():
    core = make_core()
    top = SPEC.num_classes - 1
    ok = core.on_message(make_update(update_id="ok", class_counts={0: 3, top: 1}), now=0.0).update
    assert ok.outcome == "aggregated" and core.version == 1
    for k, counts in enumerate(({SPEC.num_classes: 1}, {-1: 2}, {0: 1, 10 ** 6: 1})):
        rec = core.on_message(make_update(update_id="bad%d" % k, base_version=1, class_counts=counts),
                              now=1.0).update
        assert rec.outcome == "rejected" and rec.fields["reason"] == "classes"
    assert core.version == 1 and core.counters["rejected"] == 3


def test_history_bounded():
    core = make_core(history_size=3)
    for i in range(5):
        core.on_message(make_update(update_id="u%d" % i, base_version=i), now=float(i))
    assert core.history.versions() == [3, 4, 5]
    assert core.history.get(5).tensors is core.model
    assert core.history.get(1) is None


def test_future_base_version_is_staleness_zero(caplog):
    core = make_core(max_staleness=0)
    rec = core.on_message(make_update(base_version=7), now=0.0).update
    assert rec.staleness == 0 and rec.aggregated
    assert core.counters["future_base"] == 1
    assert "lost its state" in caplog.text


def test_stale_drop_counted_in_core():
    core = make_core(max_staleness=1)
    for i in range(3):
        core.on_message(make_update(update_id="u%d" % i, base_version=i), now=0.0)
    rec = core.on_message(make_update(update_id="old", base_version=0), now=0.0).update
    assert rec.outcome == "stale" and core.counters["stale_dropped"] == 1 and core.version == 3


def test_registry_fed_by_status_and_traffic():
    core = CoordinatorCore(config())
    core.on_message(make_hello("pi1"), now=1.0)
    core.on_message(make_hello("pi2"), now=1.0)
    core.on_message(Offline(device_id="pi2"), now=2.0)
    core.on_message(Telemetry(device_id="pi1", time_s=0.0, buffer_fill=1, buffer_capacity=2), now=5.0)
    assert core.online() == ["pi1"]
    assert core.devices()["pi1"].last_seen_s == 5.0
    core.on_message(make_update(device_id="pi1"), now=7.0)
    assert core.devices()["pi1"].last_seen_s == 7.0 and core.devices()["pi1"].updates == 1


def test_global_model_carries_hparams():
    core = make_core(hparams=HParams(lr=0.05, batch_size=16, local_steps=5, dropout=0.1))
    gm = core.global_model()
    assert gm.version == 0 and gm.arch_id == SPEC.arch_id
    assert gm.hparams == {"lr": 0.05, "batch_size": 16, "local_steps": 5, "dropout": 0.1}
    assert set(gm.tensors) == set(core.model)


def test_fedavg_through_core_and_tick():
    core = CoordinatorCore(config(strategy="fedavg", fedavg=FedAvgConfig(deadline_s=10.0)))
    core.on_message(make_hello("a"), now=0.0)
    core.on_message(make_hello("b"), now=0.0)
    assert core.tick(0.0).new_version is None
    rec = core.on_message(make_update(device_id="a", value=1.0, num_samples=1), now=1.0).update
    assert rec.outcome == "buffered" and core.version == 0
    rec = core.on_message(make_update(device_id="b", update_id="u2", value=3.0, num_samples=3), now=2.0).update
    assert rec.aggregated and core.version == 1
    assert all(np.allclose(v, 2.5) for v in core.model.values())
    rec = core.on_message(make_update(device_id="a", update_id="u3", base_version=1, value=5.0), now=3.0).update
    assert rec.outcome == "buffered"            # b has not reported in this round
    assert core.tick(12.0).new_version is None                  # round started at 3.0, deadline 13.0
    assert core.tick(14.0).new_version == 2 and core.version == 2
    assert all(np.allclose(v, 5.0) for v in core.model.values())
    rec = core.on_message(make_update(device_id="b", update_id="late", base_version=0), now=15.0).update
    assert rec.outcome == "stale" and core.counters["stale_dropped"] == 1


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        config().alpha = 0.9
