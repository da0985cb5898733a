"""State directory: round trip, restart at the same version and run, corrupt state, other arch."""
import json

import numpy as np
import pytest

from factories import SPEC, UNBOUNDED_ADMISSION, greet, make_update
from streamfl.coordinator.admission import AdmissionConfig
from streamfl.models import ModelSpec
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.core import CoordinatorCore
from streamfl.coordinator.persistence import Persister, StateStore
from streamfl.errors import ConfigError, StorageError

def trained_core(n=3, **kw):
    core = greet(CoordinatorCore(CoordinatorConfig(model=SPEC, admission=AdmissionConfig(**UNBOUNDED_ADMISSION),
                                                   **kw), run_id="run-a"), "d1")
    for i in range(n):
        core.on_message(make_update(update_id="u%d" % i, base_version=i, value=float(i)), now=float(i))
    return core


def restarted(state_dir, **kw):
    config = CoordinatorConfig(model=SPEC, admission=AdmissionConfig(**UNBOUNDED_ADMISSION), **kw)
    loaded = StateStore(state_dir).load(config.model)
    assert loaded is not None
    tensors, state = loaded
    core = CoordinatorCore(config, tensors=tensors)
    core.restore(tensors, state, now=100.0)
    return core


def test_fresh_directory_loads_nothing(tmp_path):
    assert StateStore(tmp_path / "state").load(SPEC) is None


def test_round_trip_and_restart_continues_at_same_version(tmp_path):
    core = trained_core(3)
    Persister(StateStore(tmp_path)).flush(core, now=3.0)
    assert (tmp_path / "model.safetensors").exists() and (tmp_path / "state.json").exists()
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["version"] == 3 and state["arch_id"] == SPEC.arch_id
    assert state["recent_update_ids"] == ["u0", "u1", "u2"]
    assert state["counters"]["aggregated"] == 3

    again = restarted(tmp_path)
    assert again.version == 3 and again.run_id == "run-a"
    assert again.registry.greeted("d1")      # its queued updates may arrive before its Hello
    assert all(np.array_equal(again.model[k], core.model[k]) for k in core.model)
    assert again.counters["aggregated"] == 3
    # an outbox resend of an update already aggregated before the restart is still a duplicate
    rec = again.on_message(make_update(update_id="u2", base_version=2), now=101.0)
    assert rec.update.outcome == "duplicate" and again.version == 3
    again.on_message(make_update(update_id="u3", base_version=3), now=102.0)
    assert again.version == 4


def test_strategy_state_survives_restart(tmp_path):
    core = trained_core(3, max_staleness=0)
    core.on_message(make_update(update_id="old", base_version=0), now=5.0)
    assert core.strategy.stale_dropped == 1
    Persister(StateStore(tmp_path)).flush(core, now=5.0)
    assert restarted(tmp_path, max_staleness=0).strategy.stale_dropped == 1


def test_other_architecture_is_a_config_error(tmp_path):
    Persister(StateStore(tmp_path)).flush(trained_core(1), now=0.0)
    other = ModelSpec(name="mlp", in_channels=2, window_len=4, num_classes=3, hidden=4)
    with pytest.raises(ConfigError, match="architecture"):
        StateStore(tmp_path).load(other)


def test_corrupt_state_json_is_a_storage_error(tmp_path):
    Persister(StateStore(tmp_path)).flush(trained_core(1), now=0.0)
    (tmp_path / "state.json").write_text("{not json")
    with pytest.raises(StorageError, match="corrupt"):
        StateStore(tmp_path).load(SPEC)


def test_truncated_model_is_a_storage_error(tmp_path):
    Persister(StateStore(tmp_path)).flush(trained_core(1), now=0.0)
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(StorageError):
        StateStore(tmp_path).load(SPEC)


def test_state_without_model_is_a_storage_error(tmp_path):
    Persister(StateStore(tmp_path)).flush(trained_core(1), now=0.0)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(StorageError, match="no model.safetensors"):
        StateStore(tmp_path).load(SPEC)


def test_crash_between_the_two_writes_trusts_the_model(tmp_path):
    store = StateStore(tmp_path)
    core = trained_core(2)
    Persister(store).flush(core, now=0.0)
    old_state = (tmp_path / "state.json").read_bytes()
    core.on_message(make_update(update_id="u9", base_version=2), now=1.0)
    Persister(store).flush(core, now=1.0)
    (tmp_path / "state.json").write_bytes(old_state)      # as if the second rename never happened
    again = restarted(tmp_path)
    assert again.version == 3 and again.run_id == "run-a"
    assert again.registry.greeted("d1")      # its queued updates may arrive before its Hello
    assert all(np.array_equal(again.model[k], core.model[k]) for k in core.model)


def test_persister_saves_every_time_and_remembers_the_version(tmp_path):
    persister = Persister(StateStore(tmp_path))
    core = trained_core(1)
    assert persister.flush(core) and persister.saved_version == 1
    core.on_message(make_update(update_id="x", base_version=1), now=10.5)
    assert persister.save(core.model, core.state()) and persister.saved_version == 2
    assert persister.saves == 2
    assert json.loads((tmp_path / "state.json").read_text())["version"] == 2


def test_unwritable_state_dir_is_counted_not_raised(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    persister = Persister(StateStore(blocker / "state"))   # parent is a file: cannot mkdir
    assert not persister.flush(trained_core(1), now=0.0)
    assert persister.errors == 1
