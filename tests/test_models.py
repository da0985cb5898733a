"""The model registry: every architecture builds, is reproducible, and its tensors round-trip safely."""
import numpy as np
import pytest
import torch

from streamfl.errors import ModelError, StorageError
from streamfl.models import (
    REGISTRY, HarModel, ModelSpec, arrays_to_model, build_model, load_checkpoint, model_to_arrays,
    save_checkpoint, tensor_spec,
)

NAMES = ["lstm", "cnn1d", "mlp"]
#: Small but uneven dimensions, so a swapped axis cannot pass by accident.
SMALL = dict(in_channels=3, window_len=20, num_classes=5, hidden=16)


def windows(spec, n=4, seed=0):
    """A batch [N, window_len, in_channels] of random windows."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, spec.window_len, spec.in_channels, generator=g)


def test_registry_has_the_documented_architectures():
    assert set(NAMES) <= set(REGISTRY)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dims", [{}, SMALL], ids=["default", "small"])
def test_output_shape_is_batch_by_classes(name, dims):
    spec = ModelSpec(name=name, **dims)
    model = build_model(spec)
    assert isinstance(model, HarModel)
    model.eval()
    with torch.no_grad():
        for n in (1, 7):
            out = model(windows(spec, n))
            assert out.shape == (n, spec.num_classes)
            assert out.dtype == torch.float32 and torch.isfinite(out).all()


def test_lstm_default_is_adaclp_one_layer_128_hidden():
    spec = ModelSpec()
    assert (spec.name, spec.hidden) == ("lstm", 128)
    model = build_model(spec)
    assert model.lstm.hidden_size == 128 and model.lstm.num_layers == 1
    assert model.head.in_features == 128


def test_unknown_name_is_a_model_error_listing_the_known_ones():
    spec = ModelSpec(name="transformer")
    for call in (build_model, tensor_spec):
        with pytest.raises(ModelError) as info:
            call(spec)
        message = str(info.value)
        assert "transformer" in message
        assert all(name in message for name in NAMES)


@pytest.mark.parametrize("key", ["in_channels", "window_len", "num_classes", "hidden"])
def test_spec_rejects_non_positive_dimensions(key):
    with pytest.raises(ValueError, match=key):
        ModelSpec(**{key: 0})


def test_spec_rejects_a_single_class():
    with pytest.raises(ValueError, match="num_classes"):
        ModelSpec(num_classes=1)


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_weights_other_seed_other_weights(name):
    spec = ModelSpec(name=name, **SMALL)
    a, b = model_to_arrays(build_model(spec, seed=3)), model_to_arrays(build_model(spec, seed=3))
    c = model_to_arrays(build_model(spec, seed=4))
    assert sorted(a) == sorted(b) == sorted(c)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert any(not np.array_equal(a[k], c[k]) for k in a)


def test_building_does_not_disturb_the_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_model(ModelSpec(**SMALL), seed=9)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("name", NAMES)
def test_dropout_is_settable_at_run_time(name):
    spec = ModelSpec(name=name, **SMALL)
    model = build_model(spec, dropout=0.0)
    x = windows(spec, 8)
    model.eval()
    with torch.no_grad():
        reference = model(x)
    model.train()
    with torch.no_grad():
        assert torch.allclose(model(x), reference)  # p = 0: training mode is deterministic
    model.set_dropout(0.5)
    assert model.dropout.p == 0.5
    with torch.no_grad():
        torch.manual_seed(0)
        first = model(x)
        torch.manual_seed(1)
        second = model(x)
    assert not torch.allclose(first, second)      # dropout is live in training mode
    model.eval()
    with torch.no_grad():
        assert torch.allclose(model(x), reference)  # and off in evaluation
    model.set_dropout(0.0)
    model.train()
    with torch.no_grad():
        assert torch.allclose(model(x), reference)
    assert build_model(spec, dropout=0.25).dropout.p == 0.25


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5])
def test_dropout_outside_zero_one_is_rejected(bad):
    model = build_model(ModelSpec(**SMALL))
    with pytest.raises(ValueError):
        model.set_dropout(bad)
    assert model.dropout.p == 0.0


def test_arch_id_is_stable_and_names_every_dimension():
    assert ModelSpec().arch_id == "lstm-c6-w50-k6-h128"  # on the wire: changing it splits fleets
    assert ModelSpec().arch_id == ModelSpec(name="lstm", in_channels=6, window_len=50, num_classes=6,
                                            hidden=128).arch_id
    base = ModelSpec(**SMALL)
    variants = [ModelSpec(**dict(SMALL, in_channels=4)), ModelSpec(**dict(SMALL, window_len=21)),
                ModelSpec(**dict(SMALL, num_classes=6)), ModelSpec(**dict(SMALL, hidden=17)),
                ModelSpec(name="mlp", **SMALL)]
    ids = {base.arch_id} | {v.arch_id for v in variants}
    assert len(ids) == 1 + len(variants)


@pytest.mark.parametrize("name", NAMES)
def test_tensor_spec_matches_the_state_dict(name):
    spec = ModelSpec(name=name, **SMALL)
    state = build_model(spec).state_dict()
    assert tensor_spec(spec) == {k: (tuple(t.shape), "float32") for k, t in state.items()}


@pytest.mark.parametrize("name", NAMES)
def test_arrays_round_trip_between_models(name):
    spec = ModelSpec(name=name, **SMALL)
    source, target = build_model(spec, seed=1), build_model(spec, seed=2)
    arrays = model_to_arrays(source)
    assert all(a.dtype == np.float32 for a in arrays.values())
    arrays_to_model(target, arrays)
    back = model_to_arrays(target)
    for k in arrays:
        np.testing.assert_array_equal(back[k], arrays[k])
    x = windows(spec)
    source.eval()
    target.eval()
    with torch.no_grad():
        assert torch.equal(source(x), target(x))


def test_arrays_are_copies_and_read_only_input_is_fine():
    model = build_model(ModelSpec(**SMALL))
    arrays = model_to_arrays(model)
    arrays["head.bias"] += 1.0
    assert not np.array_equal(model_to_arrays(model)["head.bias"], arrays["head.bias"])
    frozen = {k: v.copy() for k, v in arrays.items()}
    for v in frozen.values():
        v.flags.writeable = False  # as decoded frames are
    arrays_to_model(model, frozen)
    np.testing.assert_array_equal(model_to_arrays(model)["head.bias"], arrays["head.bias"])


def test_wrong_shape_missing_or_extra_tensors_are_rejected_and_leave_the_model_alone():
    spec = ModelSpec(**SMALL)
    model = build_model(spec, seed=1)
    before = model_to_arrays(model)
    good = model_to_arrays(build_model(spec, seed=2))
    wrong_shape = dict(good, **{"head.weight": np.zeros((SMALL["num_classes"] + 1, SMALL["hidden"]),
                                                        np.float32)})
    with pytest.raises(ModelError, match="head.weight"):
        arrays_to_model(model, wrong_shape)
    with pytest.raises(ModelError, match="head.bias"):
        arrays_to_model(model, {k: v for k, v in good.items() if k != "head.bias"})
    with pytest.raises(ModelError, match="extra"):
        arrays_to_model(model, dict(good, extra=np.zeros(1, np.float32)))
    other = model_to_arrays(build_model(ModelSpec(**dict(SMALL, hidden=17))))
    with pytest.raises(ModelError):
        arrays_to_model(model, other)
    after = model_to_arrays(model)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])


def test_checkpoint_round_trip_and_corrupt_file(tmp_path):
    arrays = model_to_arrays(build_model(ModelSpec(**SMALL)))
    path = tmp_path / "sub" / "model.safetensors"
    save_checkpoint(path, arrays, {"version": 3})
    loaded, meta = load_checkpoint(path)
    assert meta == {"version": 3} and sorted(loaded) == sorted(arrays)
    for k in arrays:
        np.testing.assert_array_equal(loaded[k], arrays[k])
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(StorageError):
        load_checkpoint(path)
    with pytest.raises(StorageError):
        load_checkpoint(tmp_path / "missing.safetensors")


def test_loading_keeps_the_parameters_and_casts_to_each_tensors_dtype():
    """In place, as load_state_dict: an optimizer made before the load trains the loaded weights;
    float64 sources and an integer buffer (a batch norm's count) are cast, not rejected."""
    model = build_model(ModelSpec(**SMALL), seed=1)
    params = list(model.parameters())
    source = {k: v.astype(np.float64) for k, v in model_to_arrays(build_model(ModelSpec(**SMALL), seed=2)).items()}
    arrays_to_model(model, source)
    assert all(a is b for a, b in zip(params, model.parameters()))
    for name, tensor in model.state_dict().items():
        np.testing.assert_array_equal(tensor.numpy(), source[name].astype(np.float32))
    norm = torch.nn.BatchNorm1d(3)
    state = {k: np.full(tuple(t.shape), 2.0, np.float32) for k, t in norm.state_dict().items()}
    arrays_to_model(norm, state)
    assert norm.num_batches_tracked.dtype == torch.int64 and int(norm.num_batches_tracked) == 2
    torch.testing.assert_close(norm.running_var, torch.full((3,), 2.0))
