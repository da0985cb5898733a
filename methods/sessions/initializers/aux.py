"""One auxiliary round: the updates the devices trained from one auxiliary model, merged.

The session paper runs V global rounds from the pilot model on the current devices and keeps the
last one, ``w_aux``. In a fleet a round is what comes back: the first update of each device that
trained from this round's model (or a later one: none is published during the round), until
``quorum`` of the devices online when the round opened answered, or ``wait_s`` passed with at
least one answer. The round's model is their sample-weighted mean (FedAvg's), whatever the
fleet's strategy: under FedAsync too, ``g_s`` measures one synchronous step from the pilot.
"""
import math
from typing import Collection, Dict, Optional

from streamfl.methods.sessions.initializers.library import weighted_model
from streamfl.protocol.messages import Tensors, Update


class AuxRound:
    """Collects one auxiliary round that started at ``version`` with ``expected`` devices online."""

    def __init__(self, version: int, started_s: float, expected: Collection[str], quorum: float,
                 wait_s: float):
        self.version = int(version)
        self.started_s = float(started_s)
        self.expected = frozenset(expected)
        self.quorum = float(quorum)
        self.wait_s = float(wait_s)
        self.updates: Dict[str, Update] = {}

    def offer(self, update: Update) -> bool:
        """Take ``update`` if it trained from this round's model and is its device's first."""
        if update.base_version < self.version or update.device_id in self.updates:
            return False
        self.updates[update.device_id] = update
        return True

    def done(self, now: float) -> bool:
        """Enough devices answered, or the wait is over and someone did."""
        if not self.updates:
            return False
        needed = max(1, int(math.ceil(self.quorum * len(self.expected))))
        return len(self.updates) >= needed or now - self.started_s >= self.wait_s

    def merged(self) -> Optional[Tensors]:
        """The sample-weighted mean of the answers (equal weights if none counted samples)."""
        if not self.updates:
            return None
        updates = list(self.updates.values())
        raw = [max(0, u.num_samples) for u in updates]
        total = float(sum(raw))
        weights = [r / total for r in raw] if total > 0 else [1.0 / len(updates)] * len(updates)
        return weighted_model([u.tensors for u in updates], weights)
