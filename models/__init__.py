"""HAR models, the model registry and state (de)serialization."""
from streamfl.models.base import HarModel, ModelSpec
from streamfl.models.registry import REGISTRY, build_model, tensor_spec
from streamfl.models.serialize import arrays_to_model, load_checkpoint, model_to_arrays, save_checkpoint

__all__ = ["HarModel", "ModelSpec", "REGISTRY", "build_model", "tensor_spec", "arrays_to_model",
           "model_to_arrays", "load_checkpoint", "save_checkpoint"]
