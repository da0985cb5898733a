"""``streamfl export``: a global model saved by the coordinator's own persistence code, or an
agent's checkpoint saved by its state folder, comes out as ONNX and TorchScript files whose logits
agree with torch's within 1e-5 at batch 1 and 7 (the batch axis is dynamic), and whose metadata
names the architecture and the classes; a wrong spec, a missing folder and an unknown format are
clear errors."""
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch

from streamfl.agent.state import StateDir
from streamfl.cli import main
from streamfl.coordinator.persistence import StateStore
from streamfl.models import ModelSpec, build_model, model_to_arrays, save_checkpoint
from streamfl.sensors.datasets import save_npz

#: The test loads the TorchScript files with torch.jit.load, which torch 2.13 marks deprecated.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")

FAMILIES = ("lstm", "cnn1d", "mlp")
CLASSES = ["walk", "run", "sit", "stand"]
#: The brief's agreement bound between an exported file's logits and torch's (max abs).
TOLERANCE = 1e-5


def small_spec(name: str, hidden: int = 8) -> ModelSpec:
    """A model small enough that three families export in seconds."""
    return ModelSpec(name=name, in_channels=6, window_len=20, num_classes=len(CLASSES), hidden=hidden)


def trained_model(spec: ModelSpec, seed: int = 7):
    """The reference: weights from ``seed``, built with a training dropout and put in eval mode,
    as a board runs it."""
    return build_model(spec, dropout=0.5, seed=seed).eval()


def save_global(state_dir: Path, spec: ModelSpec, model, version: int = 12) -> None:
    """Save ``model`` the way the coordinator saves its global model."""
    StateStore(state_dir).save(model_to_arrays(model), {"version": version, "arch_id": spec.arch_id,
                                                        "run_id": "run-test"})


def same_windows(spec: ModelSpec, batch: int, seed: int) -> torch.Tensor:
    """Random windows on the scale of an accelerometer's, the same for a seed."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, spec.window_len, spec.in_channels, generator=gen) * 3.0


def assert_onnx_agrees(path: Path, spec: ModelSpec, model) -> onnxruntime.InferenceSession:
    """The ONNX file's names and dynamic batch, and its logits within 1e-5 of torch's at batch 1
    and 7; the session, for its metadata."""
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (inp,), (out,) = session.get_inputs(), session.get_outputs()
    assert (inp.name, inp.type) == ("windows", "tensor(float)")
    assert isinstance(inp.shape[0], str) and inp.shape[1:] == [spec.window_len, spec.in_channels]
    assert out.name == "logits" and isinstance(out.shape[0], str) and out.shape[1] == spec.num_classes
    for batch, seed in ((1, 101), (7, 102)):
        x = same_windows(spec, batch, seed)
        with torch.no_grad():
            expected = model(x).numpy()
        got = session.run(["logits"], {"windows": x.numpy()})[0]
        assert got.shape == (batch, spec.num_classes)
        assert np.abs(got - expected).max() <= TOLERANCE, (batch, np.abs(got - expected).max())
    return session


def assert_torchscript_agrees(path: Path, spec: ModelSpec, model) -> dict:
    """The TorchScript file's logits within 1e-5 of torch's at batch 1 and 7; its streamfl.json."""
    extra = {"streamfl.json": ""}
    loaded = torch.jit.load(str(path), _extra_files=extra)
    for batch, seed in ((1, 201), (7, 202)):
        x = same_windows(spec, batch, seed)
        with torch.no_grad():
            expected, got = model(x), loaded(x)
        assert got.shape == (batch, spec.num_classes)
        assert float((got - expected).abs().max()) <= TOLERANCE
    return json.loads(extra["streamfl.json"])


@pytest.mark.parametrize("family", FAMILIES)
def test_global_model_exports_to_onnx_and_torchscript(tmp_path, family, capsys):
    spec = small_spec(family)
    model = trained_model(spec)
    save_global(tmp_path / "state", spec, model, version=12)
    out = tmp_path / "out"
    assert main(["export", str(tmp_path / "state"), "--out", str(out),
                 "--classes", ",".join(CLASSES)]) == 0
    assert "model.onnx" in capsys.readouterr().out

    session = assert_onnx_agrees(out / "model.onnx", spec, model)
    meta = session.get_modelmeta().custom_metadata_map
    assert meta["arch_id"] == spec.arch_id
    assert json.loads(meta["class_names"]) == CLASSES
    assert meta["version"] == "12"
    assert meta["streamfl_version"] and "[batch, time, channel]" in meta["input_layout"]

    facts = assert_torchscript_agrees(out / "model.ts", spec, model)
    assert facts["arch_id"] == spec.arch_id and facts["class_names"] == CLASSES
    assert facts["version"] == 12

    manifest = json.loads((out / "export.json").read_text())
    assert manifest["classes_from"] == "--classes"
    assert manifest["source"]["kind"] == "coordinator state folder"
    assert manifest["files"]["onnx"]["opset"] == 17
    assert manifest["files"]["onnx"]["max_abs_diff"] <= TOLERANCE


@pytest.mark.parametrize("family", FAMILIES)
def test_dynamo_exporter_gives_the_same_logits_and_a_dynamic_batch(tmp_path, family):
    spec = small_spec(family)
    model = trained_model(spec, seed=3)
    save_global(tmp_path / "state", spec, model)
    out = tmp_path / "out"
    assert main(["export", str(tmp_path / "state"), "--out", str(out), "--format", "onnx",
                 "--onnx-exporter", "dynamo"]) == 0
    session = assert_onnx_agrees(out / "model.onnx", spec, model)
    assert json.loads(session.get_modelmeta().custom_metadata_map["class_names"]) == [
        "class_%d" % i for i in range(spec.num_classes)]
    assert not (out / "model.ts").exists()
    assert json.loads((out / "export.json").read_text())["files"]["onnx"]["opset"] == 18


def test_agent_checkpoint_with_config_and_dataset_classes(tmp_path):
    spec = small_spec("cnn1d", hidden=16)
    model = trained_model(spec, seed=11)
    meta = {"global_version": 5, "round_index": 40, "device_id": "pi-07", "arch_id": spec.arch_id}
    StateDir(tmp_path / "agent").prepare().save_checkpoint(model_to_arrays(model), meta)
    config = tmp_path / "agent.yaml"
    config.write_text("device_id: pi-07\nmodel:\n  name: cnn1d\n  in_channels: 6\n  window_len: 20\n"
                      "  num_classes: 4\n  hidden: 16\n")
    dataset = save_npz(tmp_path / "data.npz", np.zeros((3, 20, 6), np.float32),
                       np.array([0, 1, 2]), np.zeros(3, np.int64), ["lie", "sit", "walk"])
    out = tmp_path / "out"
    assert main(["export", str(tmp_path / "agent"), "--out", str(out), "--config", str(config),
                 "--dataset", str(dataset), "--torchscript-mode", "trace"]) == 0
    session = assert_onnx_agrees(out / "model.onnx", spec, model)
    facts = assert_torchscript_agrees(out / "model.ts", spec, model)
    names = ["lie", "sit", "walk", "class_3"]  # three named, the fourth output numbered
    assert json.loads(session.get_modelmeta().custom_metadata_map["class_names"]) == names
    assert facts["class_names"] == names and facts["version"] == 5
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["source"]["kind"] == "agent state folder"
    assert manifest["spec_from"].startswith(str(config))
    assert manifest["classes_from"].startswith("dataset ") and "numbered" in manifest["classes_from"]


def test_model_file_without_arch_id_takes_the_config(tmp_path, capsys):
    spec = small_spec("mlp")
    model = trained_model(spec)
    path = tmp_path / "model.safetensors"
    save_checkpoint(path, model_to_arrays(model), {})
    assert main(["export", str(path), "--out", str(tmp_path / "a")]) == 2
    assert "--config" in capsys.readouterr().err
    config = tmp_path / "c.yaml"
    config.write_text("model: {name: mlp, in_channels: 6, window_len: 20, num_classes: 4, hidden: 8}\n")
    assert main(["export", str(path), "--out", str(tmp_path / "b"), "--config", str(config),
                 "--format", "torchscript"]) == 0
    assert_torchscript_agrees(tmp_path / "b" / "model.ts", spec, model)
    assert not (tmp_path / "b" / "model.onnx").exists()


def test_tensors_that_do_not_fit_the_spec_are_refused(tmp_path, capsys):
    spec = small_spec("lstm", hidden=8)
    path = tmp_path / "model.safetensors"
    save_checkpoint(path, model_to_arrays(trained_model(spec)), {"version": 3})
    config = tmp_path / "c.yaml"
    config.write_text("model: {name: lstm, in_channels: 6, window_len: 20, num_classes: 4, hidden: 16}\n")
    out = tmp_path / "out"
    assert main(["export", str(path), "--out", str(out), "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert "lstm-c6-w20-k4-h16" in err and "head.weight is [4, 8], expected [4, 16]" in err
    assert not out.exists()


def test_config_for_another_architecture_is_refused(tmp_path, capsys):
    spec = small_spec("lstm")
    save_global(tmp_path / "state", spec, trained_model(spec))
    config = tmp_path / "c.yaml"
    config.write_text("model: {name: cnn1d, in_channels: 6, window_len: 20, num_classes: 4, hidden: 8}\n")
    assert main(["export", str(tmp_path / "state"), "--out", str(tmp_path / "out"),
                 "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert spec.arch_id in err and "cnn1d-c6-w20-k4-h8" in err


def test_missing_folder_unknown_format_and_too_many_classes(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["export", str(tmp_path / "empty"), "--out", str(tmp_path / "out")]) == 2
    assert "neither model.safetensors" in capsys.readouterr().err
    spec = small_spec("mlp")
    save_global(tmp_path / "state", spec, trained_model(spec))
    assert main(["export", str(tmp_path / "state"), "--out", str(tmp_path / "out"),
                 "--format", "onnx,tflite"]) == 2
    assert "unknown format 'tflite'" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "state"), "--out", str(tmp_path / "out"),
                 "--classes", "a,b,c,d,e"]) == 2
    assert "names 5 classes but the model has 4 outputs" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_onnx_without_its_packages_names_the_extra_and_torchscript_still_works(tmp_path, capsys,
                                                                                monkeypatch):
    spec = small_spec("mlp")
    model = trained_model(spec)
    save_global(tmp_path / "state", spec, model)
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx now raises ImportError
    assert main(["export", str(tmp_path / "state"), "--out", str(tmp_path / "out"),
                 "--format", "onnx"]) == 2
    assert "streamfl[export]" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "state"), "--out", str(tmp_path / "out"),
                 "--format", "torchscript"]) == 0
    assert_torchscript_agrees(tmp_path / "out" / "model.ts", spec, model)
