"""What the simulator's runtime tracks of each device besides its cores (busy time, round counts,
training joules, the scheduler's grant), and the per-device figures of a run made from them.

Energy is split by time: training is each round's whole-board power (idle floor included, as a
meter on the board measures a round) times its time; idle is idle power over the rest of the
device's online time.
"""
import dataclasses
from typing import Any, Dict, List, Optional

from streamfl.agent.core import AgentCore
from streamfl.config import build
from streamfl.dvfs.simulated import SimulatedBackend
from streamfl.sim.device import DeviceModel, DeviceSpec
from streamfl.sim.scenario import Scenario


def device_specs(scenario: Scenario) -> List[DeviceSpec]:
    """One ``DeviceSpec`` per device, the groups expanded in order."""
    specs = []
    for k, group in enumerate(scenario.devices):
        values = {key: value for key, value in group.items() if key != "count"}
        spec = build(DeviceSpec, values, "%s: devices[%d]" % (scenario.name, k))
        specs.extend([spec] * int(group.get("count", 1)))
    return specs


@dataclasses.dataclass
class DeviceState:
    """What the runtime tracks of one simulated device besides its cores."""

    model: DeviceModel
    agent: AgentCore
    backend: SimulatedBackend
    stream: Any
    fed_until_s: float = 0.0
    online: bool = False
    busy_s: float = 0.0
    #: Whole-board joules of every round it ran (finished, lost or diverged): ``train_w`` x time.
    train_j: float = 0.0
    rounds: int = 0
    lost_rounds: int = 0
    diverged_rounds: int = 0
    latency_s: float = 0.0
    #: A scheduler's grant of the shared band for the next upload (the ``train`` command's).
    grant_hz: Optional[float] = None
    #: Round events of an older generation are void (a ``train`` command started one early).
    round_gen: int = 0
    #: When the round in progress finishes computing.
    busy_until_s: float = 0.0

    def idle_s(self, t: float) -> float:
        """Seconds online and not training up to ``t``."""
        return max(0.0, self.model.presence.online_s(t) - self.busy_s)

    def totals(self, end_s: float) -> Dict[str, Any]:
        """Training time, idle time, energy (in all, training and idle), rounds and mean round
        latency up to ``end_s``."""
        idle_s = self.idle_s(end_s)
        return {"board": self.model.profile.name, "rounds": self.rounds,
                "lost_rounds": self.lost_rounds, "diverged_rounds": self.diverged_rounds,
                "train_s": round(self.busy_s, 3), "idle_s": round(idle_s, 3),
                "energy_j": round(self.train_j + self.model.idle_w * idle_s, 3),
                "train_energy_j": round(self.train_j, 3),
                "idle_energy_j": round(self.model.idle_w * idle_s, 3),
                "round_latency_s": round(self.latency_s / self.rounds, 4) if self.rounds else None}
