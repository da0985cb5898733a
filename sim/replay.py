"""Feed a recorded order of update frames to the simulator's coordinator path.

The simulator and the daemon must agree: given the updates a real coordinator
received over MQTT, in the order it received them, the simulator's coordinator side (``SimRun``'s
event queue, ``_arrive`` and ``_publish``, the same ``CoordinatorCore`` behind the same codec)
makes the same versions with the same weights.
"""
import logging
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from streamfl.coordinator.config import CoordinatorConfig
from streamfl.protocol.messages import Tensors
from streamfl.sim.methods import Method
from streamfl.sim.runtime import SimRun
from streamfl.sim.scenario import Scenario

log = logging.getLogger(__name__)

REPLAY = Method("replay", "recorded update frames in place of a simulated fleet")


class ReplayRun(SimRun):
    """A ``SimRun`` without simulated devices: recorded frames arrive as its "update" events."""

    def __init__(self, config: CoordinatorConfig, step_s: float = 1.0,
                 emit: Optional[Callable[[Dict[str, Any]], None]] = None):
        if not step_s > 0:
            raise ValueError("step_s must be > 0, got %r" % (step_s,))
        self.step_s = float(step_s)
        self.scenario = Scenario(name="replay", tick_s=self.step_s)
        self.events: List[Dict[str, Any]] = []
        self._start(config, REPLAY, config.seed, emit or self.events.append)
        self.end_s = 0.0

    def feed(self, frames: Iterable[bytes]) -> List[Tuple[int, Tensors]]:
        """Frame k arrives at virtual time ``(k + 1) * step_s``; ``[(version, tensors)]`` published.

        The recorded devices said Hello to the real coordinator (retained status frames, not
        recorded here), so the replayed coordinator knows them from the start.
        """
        frames = [bytes(f) for f in frames]
        self.coordinator.registry.restore_greeted({self.decoder.decode(f).device_id for f in frames})
        k = -1
        for k, frame in enumerate(frames):
            self.queue.push((k + 1) * self.step_s, "update", (k, bytes(frame), 0.0, 0.0, 0.0))
        self.end_s = (k + 1) * self.step_s
        self._loop()
        log.info("replayed %d update frames: version %d", k + 1, self.coordinator.version)
        # What the simulated devices would download: every version, decoded from its frame.
        return [(gm.version, gm.tensors) for _, gm, _ in self.published]


def replay_updates(config: CoordinatorConfig, frames: Iterable[bytes],
                   step_s: float = 1.0) -> List[Tuple[int, Tensors]]:
    """``[(version, tensors)]`` from version 0 on, one entry per version the frames produced.

    Time advances ``step_s`` per frame: FedAsync ignores it; FedAvg's deadline runs in that time.
    """
    return ReplayRun(config, step_s).feed(frames)
