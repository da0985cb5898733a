"""Build models by name and know, without building them twice, which tensors each architecture has."""
from typing import Callable, Dict, Tuple

import torch

from streamfl.errors import ModelError
from streamfl.models.base import HarModel, ModelSpec
from streamfl.models.har import Cnn1dClassifier, LstmClassifier, MlpClassifier

#: name -> constructor(spec, dropout). Add an architecture here and nowhere else.
REGISTRY: Dict[str, Callable[[ModelSpec, float], HarModel]] = {
    "lstm": LstmClassifier,
    "cnn1d": Cnn1dClassifier,
    "mlp": MlpClassifier,
}

TensorSpec = Dict[str, Tuple[Tuple[int, ...], str]]
_SPEC_CACHE: Dict[ModelSpec, TensorSpec] = {}


def build_model(spec: ModelSpec, dropout: float = 0.0, seed: int = 0) -> HarModel:
    """A freshly initialized model; the same ``seed`` gives the same weights on every machine."""
    try:
        ctor = REGISTRY[spec.name]
    except KeyError:
        raise ModelError("unknown model %r (known: %s)" % (spec.name, ", ".join(sorted(REGISTRY))))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return ctor(spec, dropout)


def tensor_spec(spec: ModelSpec) -> TensorSpec:
    """``{name: (shape, dtype)}`` of the model's state dict, the codec's check on received tensors."""
    if spec not in _SPEC_CACHE:
        model = build_model(spec)
        _SPEC_CACHE[spec] = {name: (tuple(t.shape), str(t.dtype).replace("torch.", ""))
                             for name, t in model.state_dict().items()}
    return _SPEC_CACHE[spec]
