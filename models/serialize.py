"""Model state as numpy arrays for the wire, and safetensors checkpoints written atomically."""
import json
from pathlib import Path
from typing import Dict, Mapping, Optional, Tuple

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from streamfl.errors import ModelError, StorageError
from streamfl.fileio import atomic_write

Tensors = Dict[str, np.ndarray]

#: Tensor dtypes whose CPU tensors have a numpy view (``Tensor.numpy``) that can be written in place.
_NUMPY_DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.int64, torch.int32,
                           torch.int16, torch.int8, torch.uint8, torch.bool})


def model_to_arrays(model: torch.nn.Module) -> Tensors:
    """A detached float32 numpy copy of every tensor of the model's state dict."""
    return {name: t.detach().to("cpu", torch.float32).numpy().copy()
            for name, t in model.state_dict().items()}


def arrays_to_model(model: torch.nn.Module, arrays: Mapping[str, np.ndarray]) -> None:
    """Load ``arrays`` into ``model`` in place; names and shapes must match exactly."""
    copy_into_state(model.state_dict(), arrays)


def copy_into_state(state: Mapping[str, torch.Tensor], arrays: Mapping[str, np.ndarray]) -> None:
    """``arrays_to_model`` on a model's state dict (its tensors share the model's storage), for a
    caller that keeps one; ``ModelError`` naming the tensor if names or shapes differ, and then
    nothing is written."""
    if set(state) != set(arrays):
        missing = sorted(set(state) - set(arrays))
        extra = sorted(set(arrays) - set(state))
        raise ModelError("tensor names do not match the model (missing %s, unexpected %s)" % (missing, extra))
    sources = {}
    for name, current in state.items():
        sources[name] = arr = np.asarray(arrays[name])
        if tuple(arr.shape) != tuple(current.shape):
            raise ModelError("tensor %s has shape %s, model expects %s" % (
                name, tuple(arr.shape), tuple(current.shape)))
    # Copied into the tensors in place, as load_state_dict copies (cast to each tensor's dtype): a
    # state dict's tensors share the model's storage, and on the CPU their numpy views are written
    # straight, which costs a fifth of building new tensors and loading them (a simulated fleet
    # loads every global model into every device's model). Read-only sources are fine either way.
    with torch.no_grad():
        for name, current in state.items():
            if current.device.type == "cpu" and current.dtype in _NUMPY_DTYPES:
                np.copyto(current.numpy(), sources[name], casting="unsafe")
            else:
                current.copy_(torch.tensor(sources[name], dtype=current.dtype, device=current.device))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file, fsync and rename, so a crash leaves old or new."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data, sync_dir=True)
    except OSError as exc:
        raise StorageError("cannot write %s: %s" % (path, exc.strerror or exc)) from exc


def save_checkpoint(path: Path, arrays: Mapping[str, np.ndarray], meta: Optional[dict] = None) -> None:
    """Save tensors and a JSON-able ``meta`` dict as one safetensors file, atomically."""
    header = {"streamfl": json.dumps(meta or {}, sort_keys=True)}
    contiguous = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    atomic_write_bytes(Path(path), st_save(contiguous, metadata=header))


def load_checkpoint(path: Path) -> Tuple[Tensors, dict]:
    """Load a checkpoint written by ``save_checkpoint``: ``(arrays, meta)``; never unpickles."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise StorageError("cannot read checkpoint %s: %s" % (path, exc.strerror or exc)) from exc
    try:
        arrays = st_load(data)
        raw_meta = _read_metadata(data).get("streamfl", "{}")
        meta = json.loads(raw_meta)
    except (SafetensorError, ValueError, json.JSONDecodeError) as exc:
        raise StorageError("checkpoint %s is corrupt: %s" % (path, exc)) from exc
    return arrays, meta


def _read_metadata(data: bytes) -> Dict[str, str]:
    """The ``__metadata__`` of a safetensors blob (the numpy loader drops it)."""
    if len(data) < 8:
        raise ValueError("truncated safetensors header")
    n = int.from_bytes(data[:8], "little")
    if n > len(data) - 8:
        raise ValueError("truncated safetensors header")
    return json.loads(data[8:8 + n].decode("utf-8")).get("__metadata__", {}) or {}
