"""``streamfl export``: a global model or an agent's checkpoint as ONNX and TorchScript files.

The source is a coordinator's state folder (``model.safetensors``, whose metadata holds the arch
id and the global version, and ``state.json``), an agent's state folder (``checkpoint.safetensors``,
arch id and the global version it was trained from) or one such safetensors file. The model's
spec (``ModelSpec``) comes from the arch id in the file's metadata or from ``--config`` (a
coordinator's or an agent's YAML, whose ``model:`` section is the spec); with both, they must
agree, and the tensors must be those of the spec. The class names come from ``--classes``, from a
dataset file's ``classes`` array (``--dataset``) or are numbered; the manifest says which.

What it writes into the ``--out`` folder, each file atomically and only after it has been run on
random windows and agreed with torch within ``--check-tolerance`` (checked at batch 1 and 7, so a
batch axis that is not dynamic fails here, not on the board):

- ``model.onnx``: input ``windows`` float32 [batch, T, C], output ``logits`` float32 [batch, K],
  the batch axis dynamic; metadata_props ``arch_id``, ``class_names`` (JSON list), ``version``,
  ``streamfl_version``, ``input_layout``.
- ``model.ts``: TorchScript, with the same facts as ``streamfl.json`` in its extra files.
- ``export.json``: the manifest (source, spec, classes and where they came from, files, checks).

The model is exported in eval mode: dropout is off, as in inference on the board.
"""
import argparse
import io
import json
import logging
import math
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from streamfl import __version__
from streamfl.errors import ConfigError, ModelError

log = logging.getLogger(__name__)

HELP = "write a global model or an agent's checkpoint as ONNX and TorchScript files"
DETAILS = ("Reads a coordinator's state folder (model.safetensors), an agent's state folder "
           "(checkpoint.safetensors) or one such file, and writes model.onnx (input windows "
           "[batch, T, C] float32, output logits [batch, K], dynamic batch, the arch id and class "
           "names as metadata), model.ts (TorchScript, the same facts in its streamfl.json extra "
           "file) and export.json into the --out folder. Each file is run on random windows and "
           "compared with torch before it is written. ONNX needs the export extra "
           "(pip install 'streamfl[export]'); TorchScript needs torch alone.")

#: The ONNX graph's input and output names, the TorchScript extra file, the output files.
INPUT_NAME = "windows"
OUTPUT_NAME = "logits"
ONNX_FILE = "model.onnx"
TORCHSCRIPT_FILE = "model.ts"
MANIFEST_FILE = "export.json"
TORCHSCRIPT_EXTRA = "streamfl.json"
#: What the input tensor is: raw sensor windows as the agent's sensor makes them, no scaling.
INPUT_LAYOUT = "windows float32 [batch, time, channel] -> logits float32 [batch, class]"
FORMATS = ("onnx", "torchscript")
#: ``--onnx-exporter``: ``legacy`` is torch's TorchScript-based exporter (``dynamo=False``),
#: ``dynamo`` the torch.export-based one (torch >= 2.5 and onnxscript).
ONNX_EXPORTERS = ("legacy", "dynamo")
#: The legacy exporter is the default. Both give logits within 2e-7 of torch and a dynamic batch
#: axis for lstm, cnn1d and mlp (measured with torch 2.13), but only the legacy one writes the
#: opset asked for: the dynamo exporter starts at opset 18 and its conversion down to 17 fails on
#: cnn1d's ReduceMean (opset 18 made its axes an input), leaving 18. Opset 17 with ONNX IR 8 is
#: what the TensorRT of JetPack 5 (8.5) and older onnxruntime builds on Raspberry Pi OS read,
#: and a lower ``--opset`` serves older ones still; the legacy exporter also needs no onnxscript
#: and is twenty times faster. Torch deprecates it, so ``dynamo`` (opset 18) is the way on once a
#: torch release drops it.
DEFAULT_ONNX_EXPORTER = "legacy"
#: ONNX operator set written by default by each exporter (see ``DEFAULT_ONNX_EXPORTER``): the
#: dynamo exporter's lowest is 18.
DEFAULT_OPSET = {"legacy": 17, "dynamo": 18}
#: ``--torchscript-mode``: ``script`` compiles forward() with its shape logic (no batch size
#: baked in, no tracer warnings from nn.LSTM), the default; ``trace`` records one run, for an
#: architecture whose forward() TorchScript cannot compile.
TORCHSCRIPT_MODES = ("script", "trace")
#: Largest max abs difference between an exported file's logits and torch's that the check
#: accepts (float32 reordering stays near 1e-7 for these models).
DEFAULT_CHECK_TOLERANCE = 1e-4
#: Batch sizes of the check: 1 and a size unlike the tracing example's (2), so that a batch axis
#: fixed at export time shows.
CHECK_BATCHES = (1, 7)
#: Batch size of the example input the exporters run; not 1, which torch.export would specialize.
EXAMPLE_BATCH = 2
#: Seed of the example and check windows (the same windows at every export).
WINDOW_SEED = 0
#: The message for ONNX without its packages.
EXTRA_HINT = "install the export extra: pip install 'streamfl[export]'"


def add_arguments(parser) -> None:
    """The options of ``streamfl export``."""
    parser.add_argument("source", metavar="SOURCE",
                        help="a coordinator's state folder (model.safetensors, state.json), an "
                             "agent's state folder (checkpoint.safetensors) or a model file")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="output folder (created): model.onnx, model.ts, export.json")
    parser.add_argument("--config", default=None, metavar="YAML",
                        help="a coordinator's or an agent's config file: its model: section is "
                             "the spec (default: the arch id in the file's metadata)")
    names = parser.add_mutually_exclusive_group()
    names.add_argument("--classes", default=None, metavar="A,B,C",
                       help="class names in label order, comma-separated")
    names.add_argument("--dataset", default=None, metavar="NPZ",
                       help="a dataset .npz whose classes array names the classes "
                            "(default: numbered names class_0, class_1, ...)")
    parser.add_argument("--format", default=",".join(FORMATS), metavar="LIST",
                        help="comma-separated formats to write: onnx, torchscript (default both)")
    parser.add_argument("--onnx-exporter", default=DEFAULT_ONNX_EXPORTER, choices=ONNX_EXPORTERS,
                        help="torch's ONNX exporter: legacy (opset 17, what TensorRT 8.5 on "
                             "JetPack 5 reads; the default) or dynamo (opset 18 and up, needs "
                             "onnxscript)")
    parser.add_argument("--opset", type=int, default=None,
                        help="ONNX operator set (default %s)" % ", ".join(
                            "%d with %s" % (v, k) for k, v in sorted(DEFAULT_OPSET.items(), reverse=True)))
    parser.add_argument("--torchscript-mode", default=TORCHSCRIPT_MODES[0], choices=TORCHSCRIPT_MODES,
                        help="script (compile forward, the default) or trace (record one run)")
    parser.add_argument("--check-tolerance", type=float, default=DEFAULT_CHECK_TOLERANCE,
                        metavar="X",
                        help="largest max abs difference from torch's logits a written file may "
                             "show on the check windows (default %g)" % DEFAULT_CHECK_TOLERANCE)
    parser.add_argument("--log-level", default="WARNING")


def run(args: argparse.Namespace) -> int:
    """Read the source, build the model, write the files and the manifest, print where they are."""
    formats = parse_formats(args.format)
    if not (args.check_tolerance >= 0 and math.isfinite(args.check_tolerance)):
        raise ConfigError("--check-tolerance must be a number >= 0, got %r" % args.check_tolerance)
    opset = DEFAULT_OPSET[args.onnx_exporter] if args.opset is None else args.opset
    if opset < 7:
        raise ConfigError("--opset must be at least 7, got %r" % opset)
    source = read_source(Path(args.source))
    spec, spec_from = resolve_spec(source, Path(args.config) if args.config else None)
    check_tensors(source, spec)
    classes, classes_from = class_names(spec.num_classes, args.classes,
                                        Path(args.dataset) if args.dataset else None)
    model = load_model(spec, source.arrays)
    facts = {"arch_id": spec.arch_id, "class_names": classes, "version": source.version,
             "streamfl_version": __version__, "input_layout": INPUT_LAYOUT,
             "input_name": INPUT_NAME, "output_name": OUTPUT_NAME,
             "model": {"name": spec.name, "in_channels": spec.in_channels,
                       "window_len": spec.window_len, "num_classes": spec.num_classes,
                       "hidden": spec.hidden}}
    out = Path(args.out)
    files: Dict[str, Dict[str, Any]] = {}
    if "onnx" in formats:
        files["onnx"] = export_onnx(model, spec, out / ONNX_FILE, facts, args.onnx_exporter,
                                    opset, args.check_tolerance)
    if "torchscript" in formats:
        files["torchscript"] = export_torchscript(model, spec, out / TORCHSCRIPT_FILE, facts,
                                                  args.torchscript_mode, args.check_tolerance)
    manifest = dict(facts, source={"path": str(source.path), "kind": source.kind,
                                   "meta": source.meta},
                    spec_from=spec_from, classes_from=classes_from, files=files)
    write_bytes(out / MANIFEST_FILE, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode("utf-8"))
    print("model %s, version %s, from %s (%s)" % (spec.arch_id, _show(source.version), source.path,
                                                  source.kind))
    print("spec from %s" % spec_from)
    print("classes (%s): %s" % (classes_from, ", ".join(classes)))
    for fmt, info in files.items():
        print("%-11s %s (max abs difference from torch %.2g)" % (fmt, out / info["file"],
                                                                 info["max_abs_diff"]))
    print("manifest    %s" % (out / MANIFEST_FILE))
    return 0


def parse_formats(text: str) -> List[str]:
    """The formats of ``--format``, in order, each once; ConfigError for an unknown or none."""
    out: List[str] = []
    for item in (x.strip().lower() for x in text.split(",")):
        if not item:
            continue
        if item not in FORMATS:
            raise ConfigError("--format: unknown format %r (known: %s)" % (item, ", ".join(FORMATS)))
        if item not in out:
            out.append(item)
    if not out:
        raise ConfigError("--format: name at least one of %s" % ", ".join(FORMATS))
    return out


class Source:
    """What was read: the tensors, the file's metadata, its kind and the global version."""

    def __init__(self, path: Path, kind: str, model_path: Path, arrays: Dict[str, Any],
                 meta: Dict[str, Any]):
        self.path = path
        self.kind = kind
        self.model_path = model_path
        self.arrays = arrays
        self.meta = meta

    @property
    def arch_id(self) -> Optional[str]:
        """The arch id the file's metadata names, if any."""
        value = self.meta.get("arch_id")
        return value if isinstance(value, str) else None

    @property
    def version(self) -> Optional[int]:
        """The global version: the coordinator's, or the one an agent's model was trained from."""
        value = self.meta.get("version", self.meta.get("global_version"))
        return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_source(path: Path) -> Source:
    """Read a coordinator's or an agent's state folder, or a model file; ConfigError when it is
    none of them, StorageError when the file cannot be read."""
    from streamfl.agent.state import CHECKPOINT_NAME
    from streamfl.coordinator.persistence import MODEL_FILE, STATE_FILE
    from streamfl.models import load_checkpoint
    if not path.exists():
        raise ConfigError("%s does not exist: give a coordinator's or an agent's state folder, or "
                          "a model file" % path)
    if path.is_dir():
        if (path / MODEL_FILE).is_file():
            arrays, meta = load_checkpoint(path / MODEL_FILE)
            _compare_state(path / STATE_FILE, meta)
            return Source(path, "coordinator state folder", path / MODEL_FILE, arrays, meta)
        if (path / CHECKPOINT_NAME).is_file():
            arrays, meta = load_checkpoint(path / CHECKPOINT_NAME)
            return Source(path, "agent state folder", path / CHECKPOINT_NAME, arrays, meta)
        raise ConfigError("%s holds neither %s (a coordinator's state folder) nor %s (an agent's)"
                          % (path, MODEL_FILE, CHECKPOINT_NAME))
    arrays, meta = load_checkpoint(path)
    return Source(path, "model file", path, arrays, meta)


def _compare_state(state_path: Path, meta: Dict[str, Any]) -> None:
    """Warn where a coordinator's state.json disagrees with its checkpoint, whose metadata wins
    (it describes the tensors; the coordinator reads it the same way)."""
    if not state_path.is_file():
        return
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        log.warning("cannot read %s (%s): using the checkpoint's metadata", state_path, exc)
        return
    if not isinstance(state, dict):
        return
    for key in ("arch_id", "version"):
        if key in state and key in meta and state[key] != meta[key]:
            log.warning("%s says %s %r, the checkpoint %r: using the checkpoint's", state_path, key,
                        state[key], meta[key])


def resolve_spec(source: Source, config: Optional[Path]) -> Tuple[Any, str]:
    """The ModelSpec and where it came from: ``--config``'s model: section, else the arch id in
    the file's metadata; ConfigError when neither gives one or the two disagree."""
    from streamfl.config import load
    from streamfl.models import ModelSpec
    if config is not None:
        spec = load(ModelSpec, config, section="model")
        if source.arch_id is not None and source.arch_id != spec.arch_id:
            raise ConfigError("%s holds a model of architecture %s but %s's model: section says %s"
                              % (source.model_path, source.arch_id, config, spec.arch_id))
        return spec, "%s [model]" % config
    if source.arch_id is None:
        raise ConfigError("%s names no architecture in its metadata: give --config with the "
                          "model: section it was trained with" % source.model_path)
    return parse_arch_id(source.arch_id), "the arch id in %s" % source.model_path.name


def parse_arch_id(arch_id: str):
    """The ModelSpec whose ``arch_id`` is ``arch_id`` (``NAME-cC-wT-kK-hH``); ConfigError otherwise."""
    import re

    from streamfl.models import ModelSpec
    match = re.match(r"^(.+)-c(\d+)-w(\d+)-k(\d+)-h(\d+)$", arch_id)
    if not match:
        raise ConfigError("arch id %r is not NAME-cCHANNELS-wWINDOW-kCLASSES-hHIDDEN: give --config"
                          % arch_id)
    name, c, w, k, h = match.groups()
    try:
        spec = ModelSpec(name=name, in_channels=int(c), window_len=int(w), num_classes=int(k),
                         hidden=int(h))
    except ValueError as exc:
        raise ConfigError("arch id %r: %s" % (arch_id, exc)) from exc
    if spec.arch_id != arch_id:  # leading zeros and the like
        raise ConfigError("arch id %r is not one a model spec writes (%s)" % (arch_id, spec.arch_id))
    return spec


def check_tensors(source: Source, spec) -> None:
    """ModelError naming each tensor that the spec does not have, lacks, or shapes otherwise, or
    that is not finite."""
    import numpy as np

    from streamfl.models import tensor_spec
    expected = tensor_spec(spec)
    problems = []
    missing = sorted(set(expected) - set(source.arrays))
    extra = sorted(set(source.arrays) - set(expected))
    if missing:
        problems.append("missing %s" % ", ".join(missing))
    if extra:
        problems.append("unexpected %s" % ", ".join(extra))
    for name in sorted(set(expected) & set(source.arrays)):
        shape = tuple(source.arrays[name].shape)
        if shape != tuple(expected[name][0]):
            problems.append("%s is %s, expected %s" % (name, list(shape), list(expected[name][0])))
        elif not np.all(np.isfinite(source.arrays[name])):
            problems.append("%s is not finite" % name)
    if problems:
        raise ModelError("%s does not hold the tensors of %s: %s (is the spec right? --config's "
                         "model: section must be the one it was trained with)"
                         % (source.model_path, spec.arch_id, "; ".join(problems)))


def class_names(num_classes: int, classes: Optional[str], dataset: Optional[Path]) -> Tuple[List[str], str]:
    """The K class names and where they came from: ``--classes``, a dataset's ``classes`` array, or
    numbered; fewer names than K are completed with numbered ones (warned), more are an error."""
    if classes is not None:
        names = [x.strip() for x in classes.split(",")]
        if any(not x for x in names):
            raise ConfigError("--classes %r: an empty name" % classes)
        where = "--classes"
    elif dataset is not None:
        from streamfl.sensors.datasets import load_npz
        names = [str(x) for x in load_npz(dataset).classes]
        where = "dataset %s" % dataset
    else:
        return ["class_%d" % i for i in range(num_classes)], "numbered names (no --classes or --dataset)"
    if len(set(names)) != len(names):
        raise ConfigError("%s: class names repeat: %s" % (where, ", ".join(names)))
    if len(names) > num_classes:
        raise ConfigError("%s names %d classes but the model has %d outputs"
                          % (where, len(names), num_classes))
    if len(names) < num_classes:
        log.warning("%s names %d classes, the model has %d outputs: the rest are numbered",
                    where, len(names), num_classes)
        names += ["class_%d" % i for i in range(len(names), num_classes)]
        where += ", the rest numbered"
    return names, where


def load_model(spec, arrays):
    """The registry's model for ``spec`` holding ``arrays``, in eval mode: no dropout, as in
    inference (the training dropout is a setting the coordinator sends, not in the tensors)."""
    from streamfl.models import arrays_to_model, build_model
    model = build_model(spec)
    arrays_to_model(model, arrays)
    return model.eval()


def export_onnx(model, spec, path: Path, facts: Dict[str, Any], exporter: str, opset: int,
                tolerance: float) -> Dict[str, Any]:
    """Write ``model.onnx`` with dynamic batch and the metadata, after checking it against torch
    in onnxruntime; what the manifest says about it."""
    try:
        import onnx
        import onnxruntime
    except ImportError as exc:
        raise ConfigError("--format onnx needs the onnx and onnxruntime packages (%s): %s"
                          % (exc, EXTRA_HINT)) from None
    import torch
    example = windows(spec, EXAMPLE_BATCH, seed=WINDOW_SEED + 1)
    with _quiet():
        if exporter == "dynamo":
            proto = _dynamo_export(model, example, opset)
        else:
            proto = _legacy_export(model, example, opset)
    batch = proto.graph.input[0].type.tensor_type.shape.dim[0]
    if not batch.dim_param:
        raise ModelError("the %s ONNX exporter fixed the batch axis at %s: try --onnx-exporter %s"
                         % (exporter, batch.dim_value,
                            [e for e in ONNX_EXPORTERS if e != exporter][0]))
    del proto.metadata_props[:]
    for key in ("arch_id", "class_names", "version", "streamfl_version", "input_layout"):
        entry = proto.metadata_props.add()
        entry.key = key
        entry.value = json.dumps(facts[key]) if key == "class_names" else _show(facts[key])
    if facts["version"] is not None:
        proto.model_version = int(facts["version"])
    proto.doc_string = "streamfl %s: %s" % (facts["arch_id"], INPUT_LAYOUT)
    onnx.checker.check_model(proto)
    data = proto.SerializeToString()
    try:
        session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's own error kinds
        raise ModelError("onnxruntime cannot load the exported model (%s: %s)"
                         % (type(exc).__name__, exc)) from exc

    def run_onnx(x: "torch.Tensor"):
        """The ONNX file's logits, as onnxruntime computes them."""
        return torch.from_numpy(session.run([OUTPUT_NAME], {INPUT_NAME: x.numpy()})[0])

    diff = _check(model, spec, run_onnx, tolerance, "model.onnx in onnxruntime")
    write_bytes(path, data)
    opsets = {o.domain or "ai.onnx": o.version for o in proto.opset_import}
    if opsets.get("ai.onnx") != opset:
        log.warning("asked for opset %d, the %s exporter wrote %s", opset, exporter,
                    opsets.get("ai.onnx"))
    return {"file": path.name, "exporter": exporter, "opset": opsets.get("ai.onnx"),
            "ir_version": proto.ir_version, "bytes": len(data), "max_abs_diff": diff,
            "check_batches": list(CHECK_BATCHES)}


def _legacy_export(model, example, opset: int):
    """torch's TorchScript-based exporter (``dynamo=False`` where torch has the switch)."""
    import inspect

    import onnx
    import torch
    kwargs = {"input_names": [INPUT_NAME], "output_names": [OUTPUT_NAME],
              "dynamic_axes": {INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
              "opset_version": opset, "do_constant_folding": True}
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        kwargs["dynamo"] = False
    buf = io.BytesIO()
    try:
        torch.onnx.export(model, (example,), buf, **kwargs)
    except Exception as exc:  # torch raises many kinds; the user needs the exporter's words
        raise ModelError("the legacy ONNX exporter failed (%s: %s); try --onnx-exporter dynamo"
                         % (type(exc).__name__, exc)) from exc
    return onnx.load_from_string(buf.getvalue())


def _dynamo_export(model, example, opset: int):
    """torch's torch.export-based exporter, the batch axis declared dynamic."""
    import torch
    try:
        import onnxscript  # noqa: F401  (the dynamo exporter's own dependency)
    except ImportError:
        raise ConfigError("--onnx-exporter dynamo needs onnxscript: %s" % EXTRA_HINT) from None
    try:
        program = torch.onnx.export(model, (example,), None, dynamo=True, verbose=False,
                                    input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                                    dynamic_shapes=({0: torch.export.Dim("batch", min=1)},),
                                    opset_version=opset)
    except TypeError as exc:  # a torch without the dynamo switch
        raise ConfigError("this torch (%s) has no dynamo ONNX exporter (%s): use --onnx-exporter "
                          "legacy" % (torch.__version__, exc)) from exc
    except Exception as exc:
        raise ModelError("the dynamo ONNX exporter failed (%s: %s); try --onnx-exporter legacy"
                         % (type(exc).__name__, exc)) from exc
    return program.model_proto


def export_torchscript(model, spec, path: Path, facts: Dict[str, Any], mode: str,
                       tolerance: float) -> Dict[str, Any]:
    """Write ``model.ts`` with the facts in its ``streamfl.json`` extra file, after checking the
    saved file against torch; what the manifest says about it."""
    import torch
    with _quiet():
        try:
            if mode == "trace":
                module = torch.jit.trace(model, windows(spec, EXAMPLE_BATCH, seed=WINDOW_SEED + 1))
            else:
                module = torch.jit.script(model)
        except Exception as exc:  # TorchScript's compile errors come in several kinds
            raise ModelError("torch.jit.%s failed on %s (%s: %s); try --torchscript-mode %s"
                             % (mode, spec.arch_id, type(exc).__name__, exc,
                                "trace" if mode == "script" else "script")) from exc
        buf = io.BytesIO()
        torch.jit.save(module, buf, _extra_files={TORCHSCRIPT_EXTRA: json.dumps(facts, sort_keys=True)})
        data = buf.getvalue()
        loaded = torch.jit.load(io.BytesIO(data), map_location="cpu")
    loaded.eval()

    def run_ts(x: "torch.Tensor"):
        """The saved TorchScript file's logits."""
        with torch.no_grad():
            return loaded(x)

    diff = _check(model, spec, run_ts, tolerance, "model.ts in torch.jit")
    write_bytes(path, data)
    return {"file": path.name, "mode": mode, "extra_file": TORCHSCRIPT_EXTRA, "bytes": len(data),
            "max_abs_diff": diff, "check_batches": list(CHECK_BATCHES)}


def windows(spec, batch: int, seed: int):
    """``batch`` random float32 windows [batch, T, C] from ``seed``: the same ones every time."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, spec.window_len, spec.in_channels, generator=gen, dtype=torch.float32)


def _check(model, spec, run_exported: Callable, tolerance: float, what: str) -> float:
    """The max abs difference between the exported model's logits and torch's over the check
    batches; ModelError above ``tolerance`` or on a wrong output shape."""
    import torch
    worst = 0.0
    for i, batch in enumerate(CHECK_BATCHES):
        x = windows(spec, batch, seed=WINDOW_SEED + 10 + i)
        with torch.no_grad():
            expected = model(x)
        try:
            got = run_exported(x)
        except Exception as exc:  # onnxruntime and TorchScript raise their own kinds
            raise ModelError("%s fails on %d windows (%s: %s): not written"
                             % (what, batch, type(exc).__name__, exc)) from exc
        if tuple(got.shape) != (batch, spec.num_classes):
            raise ModelError("%s gives logits of shape %s for %d windows, expected %s"
                             % (what, list(got.shape), batch, [batch, spec.num_classes]))
        diff = float((got.to(torch.float32) - expected).abs().max())
        if not diff <= tolerance:
            raise ModelError("%s differs from torch by %.3g at batch %d (tolerance %g): not written"
                             % (what, diff, batch, tolerance))
        worst = max(worst, diff)
    return worst


class _quiet(warnings.catch_warnings):
    """Hides torch's deprecation notices for the exporters and TorchScript while they run (this
    command picks those APIs on purpose, see ``DEFAULT_ONNX_EXPORTER``), and the legacy exporter's
    notice that an LSTM exported at a batch size other than 1 may fail at another: ``_check`` runs
    every file at two batch sizes against torch and refuses it if so."""

    def __enter__(self):
        """Install the filters on top of the caller's, restored on exit."""
        result = super().__enter__()
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.filterwarnings("ignore", message="Exporting a model to ONNX with a batch_size other "
                                                  "than 1")
        # nn.LSTM's own input checks, seen by the legacy exporter's tracer (and --torchscript-mode
        # trace): shape checks fixed at the traced shapes, which the check at two batch sizes
        # covers; another module's tracer warnings still show.
        import torch
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning,
                                module=r"torch\.nn\.modules\.rnn")
        # torch.export's note on nn.LSTM's flat weight list, which the check covers as well.
        warnings.filterwarnings("ignore", message="The tensor attributes .* were assigned during export")
        return result


def write_bytes(path: Path, data: bytes) -> None:
    """Write one output file atomically (StorageError naming it if the disk refuses)."""
    from streamfl.models.serialize import atomic_write_bytes
    atomic_write_bytes(path, data)


def _show(value: Any) -> str:
    """A fact as a metadata string; ``unknown`` for none (a file without a version)."""
    return "unknown" if value is None else str(value)

