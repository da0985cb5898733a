"""``initial_model_file``: a fresh run starts from a pre-trained model, checked before it is served;
a run that already exists keeps its own model."""
import numpy as np
import pytest

from polling import wait_for

from test_coordinator_server import SPEC, Device, make_server
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.core import initial_model
from streamfl.errors import ConfigError
from streamfl.models import ModelSpec, build_model, model_to_arrays, save_checkpoint
from streamfl.protocol.transport.memory import MemoryBroker


def pretrained(seed=7):
    return model_to_arrays(build_model(SPEC, seed=seed))


def test_a_fresh_run_serves_the_pretrained_model_as_version_0_and_a_restart_keeps_its_own(tmp_path):
    path = tmp_path / "pretrained.safetensors"
    tensors = pretrained()
    save_checkpoint(path, tensors, {"arch_id": SPEC.arch_id})
    broker = MemoryBroker()
    server = make_server(broker, tmp_path, initial_model_file=str(path))
    try:
        dev = Device(broker)
        assert wait_for(lambda: dev.latest_version() == 0)
        for name, value in dev.models[-1].tensors.items():
            np.testing.assert_array_equal(value, tensors[name])
        dev.publish("update", dev.update(base_version=0, value=1.0))
        assert wait_for(lambda: server.core.version == 1)
        model = {k: v.copy() for k, v in server.core.model.items()}
    finally:
        server.stop()
    save_checkpoint(path, pretrained(seed=8), {"arch_id": SPEC.arch_id})   # changed since
    again = make_server(broker, tmp_path, initial_model_file=str(path))
    try:
        assert again.core.version == 1
        for name, value in again.core.model.items():
            np.testing.assert_array_equal(value, model[name])
    finally:
        again.stop()


def test_without_a_file_version_0_is_the_seeds_model():
    config = CoordinatorConfig(model=SPEC, seed=7)
    for name, value in initial_model(config).items():
        np.testing.assert_array_equal(value, pretrained(seed=7)[name])


def _bad_files(tmp_path):
    good = pretrained()
    other = ModelSpec(name="mlp", in_channels=2, window_len=4, num_classes=5, hidden=4)
    nan = dict(good)
    name = sorted(nan)[0]
    nan[name] = np.full_like(nan[name], np.nan)
    shape = dict(good)
    shape[name] = np.zeros(tuple(s + 1 for s in good[name].shape), dtype=np.float32)
    ints = dict(good)
    ints[name] = good[name].astype(np.int32)
    missing = {k: v for k, v in good.items() if k != name}
    cases = {
        "other-arch": (model_to_arrays(build_model(other)), {"arch_id": other.arch_id}),
        "other-arch-no-meta": (model_to_arrays(build_model(other)), {}),
        "nan": (nan, {}), "shape": (shape, {}), "ints": (ints, {}), "missing-tensor": (missing, {}),
    }
    for case, (tensors, meta) in cases.items():
        save_checkpoint(tmp_path / case, tensors, meta)
    (tmp_path / "corrupt").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    return sorted(cases) + ["corrupt", "absent"]


@pytest.mark.parametrize("case", ["other-arch", "other-arch-no-meta", "nan", "shape", "ints",
                                  "missing-tensor", "corrupt", "absent"])
def test_a_bad_pretrained_file_stops_the_start_with_an_error_naming_it(tmp_path, case):
    _bad_files(tmp_path)
    path = tmp_path / case
    with pytest.raises(ConfigError, match="initial_model_file.*%s" % case):
        initial_model(CoordinatorConfig(model=SPEC, initial_model_file=str(path)))
    broker = MemoryBroker()
    with pytest.raises(ConfigError, match=case):
        make_server(broker, tmp_path, initial_model_file=str(path))
    assert not (tmp_path / "state" / "model.safetensors").exists()      # nothing was started
