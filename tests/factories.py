"""The tests' one source of protocol messages: well-formed by default, any field overridable.

Every test that needs an ``Update``, a ``GlobalModel`` or a ``Hello`` builds it here, so a change to
a message's fields is made once. Tensors come from a ``ModelSpec`` (the shapes the codec and the
cores check), from a ``{name: array}`` template, or as given.
"""
import itertools
from typing import Any, Mapping, Optional, Union

import numpy as np

from streamfl.models import ModelSpec, tensor_spec
from streamfl.protocol.messages import GlobalModel, Hello, Tensors, Update

#: The small MLP most unit tests use: two channels, windows of four, two classes.
SPEC = ModelSpec(name="mlp", in_channels=2, window_len=4, num_classes=2, hidden=4)

_ids = itertools.count()
Template = Union[ModelSpec, Mapping[str, np.ndarray]]


def make_tensors(like: Template = SPEC, value: Optional[float] = None, seed: Optional[int] = None,
                 positive: bool = False) -> Tensors:
    """float32 arrays of ``like``'s shapes: all ``value``, else normal (``positive``: uniform [0, 1)) from ``seed``."""
    shapes = ({k: s for k, (s, _) in tensor_spec(like).items()} if isinstance(like, ModelSpec)
              else {k: np.shape(a) for k, a in like.items()})
    if value is not None:
        return {k: np.full(s, value, dtype=np.float32) for k, s in shapes.items()}
    rng = np.random.default_rng(0 if seed is None else seed)
    draw = rng.random if positive else rng.standard_normal
    return {k: draw(s).astype(np.float32) for k, s in shapes.items()}


def make_update(like: Template = SPEC, value: Optional[float] = 0.5, *, device_id: str = "d1",
                update_id: Optional[str] = None, base_version: int = 0, seed: Optional[int] = None,
                **overrides: Any) -> Update:
    """An ``Update`` of ``like``'s architecture (weights all ``value``, or random from ``seed``
    when ``value`` is None); any field can be overridden, e.g. ``extras=`` or ``num_samples=``."""
    arch_id = like.arch_id if isinstance(like, ModelSpec) else "test-arch"
    fields = dict(device_id=device_id, update_id=update_id or "%s-u%d" % (device_id, next(_ids)),
                  base_version=base_version, arch_id=arch_id,
                  tensors=make_tensors(like, value if seed is None else None, seed),
                  num_samples=8, class_counts={0: 4, 1: 4}, loss=0.25, seconds_per_sample=0.001)
    fields.update(overrides)
    return Update(**fields)


def make_global_model(like: Template = SPEC, version: int = 1, value: Optional[float] = 0.0,
                      **overrides: Any) -> GlobalModel:
    """A ``GlobalModel`` at ``version`` of ``like``'s architecture; fields overridable."""
    arch_id = like.arch_id if isinstance(like, ModelSpec) else "test-arch"
    fields = dict(version=version, arch_id=arch_id, tensors=make_tensors(like, value))
    fields.update(overrides)
    return GlobalModel(**fields)


def make_hello(device_id: str = "d1", like: Template = SPEC, **overrides: Any) -> Hello:
    """A device's ``Hello`` announcing ``like``'s architecture."""
    arch_id = like.arch_id if isinstance(like, ModelSpec) else "test-arch"
    fields = dict(device_id=device_id, board="fake", software_version="0", arch_id=arch_id,
                  buffer_capacity=16)
    fields.update(overrides)
    return Hello(**fields)


#: Admission as loose as its declared ranges allow, for tests of aggregation arithmetic with
#: synthetic weights (all 2.0, say) that a real fleet's norm bound would clip; tests of admission
#: use the defaults.
UNBOUNDED_ADMISSION = {"max_abs_value": 1e6, "initial_norm_ratio": 100.0, "norm_multiplier": 100.0,
                       "min_norm_ratio": 10.0, "reject_multiplier": 1000.0,
                       "max_updates_per_s": None, "round_time_fraction": 0.0,
                       "samples_peer_multiple": 1e6}


def greet(core, *device_ids: str, now: float = 0.0):
    """Feed ``core`` a Hello from each device (only greeted devices' updates count); returns it."""
    for device_id in device_ids:
        core.on_message(make_hello(device_id), now)
    return core


def plugin_strategy(name: str):
    """``(strategy, plugins)``: the first strategy (fedasync, then fedavg) coordinator plug-in
    ``name`` accepts, and the ``plugins:`` mapping that runs it with what it requires, defaults
    throughout."""
    from streamfl.config import build
    from streamfl.coordinator import plugins as coordinator_plugins
    cls = coordinator_plugins.registered()[name]
    plugins = {req: {} for req in cls.requires}
    plugins[name] = {}
    for strategy in ("fedasync", "fedavg"):
        try:
            cls.check(build(cls.Config, {}, "test"), strategy)
        except ValueError:
            continue
        return strategy, plugins
    raise AssertionError("plug-in %s accepts no strategy" % name)
