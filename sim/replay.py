"""Feed a recorded order of update frames to the simulator's coordinator path.

The simulator and the daemon must agree (issue 4, point 9): given the updates a real coordinator
received over MQTT, in the order it received them, the simulator's coordinator (the same
``CoordinatorCore``, behind the same codec) makes the same versions with the same weights.
"""
from typing import Iterable, List, Tuple

from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.core import CoordinatorCore
from streamfl.models import tensor_spec
from streamfl.protocol.codec import Decoder
from streamfl.protocol.messages import Tensors


def replay_updates(config: CoordinatorConfig, frames: Iterable[bytes],
                   step_s: float = 1.0) -> List[Tuple[int, Tensors]]:
    """``[(version, tensors)]`` from version 0 on, one entry per version the frames produced.

    Time advances ``step_s`` per frame: FedAsync ignores it; FedAvg's deadline would not.
    """
    core = CoordinatorCore(config)
    decoder = Decoder({config.model.arch_id: tensor_spec(config.model)})
    out = [(core.version, core.model)]
    for k, frame in enumerate(frames):
        before = core.version
        core.on_update(decoder.decode(frame), (k + 1) * step_s)
        if core.version != before:
            out.append((core.version, core.model))
    return out
