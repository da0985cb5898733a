"""Class-balanced mixing (streamfl's own): down-weight updates of the classes the global model
already holds too much of, so a fleet that sees one class at a time does not forget the others.

Under a temporally imbalanced stream most devices train on the same class at once (AdaCLP's
extreme setting); FedAsync mixes each of their updates in at full weight and the global model
drifts to that class. The coordinator knows each update's class mix (``Update.class_counts``)
and the weight it mixed it in with, so it can track the global model's class composition ``m``
as the same exponential average the model itself is:

    m <- (1 - a_t) m + a_t p_u          (a_t: the update's mixing weight, p_u: its class mix)

and scale each update's weight by how much its classes are under-represented against a uniform
target over the classes seen so far:

    f_u = clip( sum_c p_u(c) * min(1, (1/|C|) / m(c)) ** power, floor, 1 )

An update of a class the model lacks keeps the strategy's weight (f = 1); one of a class that
fills the model is mixed in lightly. Choices the idea leaves open, made here (all settings):

- the target is uniform over the classes seen in any update (the coordinator holds no label set);
- ``f <= 1``: the plug-in only takes weight away; raising a rare class's weight above the
  strategy's would let one single-class update replace the model. It also bounds what a device
  lying about its class counts can do: keep the strategy's weight, never exceed it (a stream of
  false claims can lower honest updates of the claimed class, to ``floor`` at worst);
- ``power`` (3) sharpens the shortfall: with 1, an update of a class at twice its share still
  counts half, and the model stays tilted to the class every device is on. 3 was chosen on seed 0
  of the extreme smartwatch setting among 1, 2 and 3 (mean accuracy 0.514, 0.526, 0.532 against
  FedAsync's 0.480) and checked on the synthetic and non-extreme settings (docs/results.md);
- ``floor`` (0.1) keeps every update counting a little, so a class that stays dominant for long
  (the only class anyone has) is still learned;
- updates without class counts keep weight 1 and leave ``m`` as it is.

With ``rest_below`` set, a device whose update was weighted below it is told to ``skip``
``rest_rounds`` round intervals: its next round would be mixed in as lightly, so the energy is
better saved (the energy side of the same decision). FedAvg rounds merge with ``a_t = 1`` and the
round's sample-weighted class mix.
"""
import logging
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from streamfl.config import bounded
from streamfl.coordinator.plugins.base import NOTHING, Addressed, Aggregation, CoordinatorPlugin, Effects, FleetView, \
    MethodState, Verdict
from streamfl.protocol.messages import Command, Update

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BalanceConfig:
    """floor: the smallest weight factor (0 < floor <= 1);
    power: exponent on each class's shortfall ratio (higher: sharper balancing);
    rest_below: tell a device whose update was weighted below this to rest (None: never);
    rest_rounds: round intervals such a device skips."""

    floor: float = bounded(0.1, 0.0, 1.0, lo_open=True)
    power: float = bounded(3.0, 0.0, 10.0, lo_open=True)
    rest_below: Optional[float] = bounded(None, 0.0, 1.0, lo_open=True)
    rest_rounds: int = bounded(20, 1, 10000)

    def __post_init__(self) -> None:
        if not 0.0 < self.floor <= 1.0:
            raise ValueError("floor must be in (0, 1], got %r" % (self.floor,))
        if not 0.0 < self.power <= 10.0:
            raise ValueError("power must be in (0, 10], got %r" % (self.power,))
        if self.rest_below is not None and not 0.0 < self.rest_below <= 1.0:
            raise ValueError("rest_below must be in (0, 1] or null, got %r" % (self.rest_below,))
        if self.rest_rounds < 1:
            raise ValueError("rest_rounds must be >= 1, got %r" % (self.rest_rounds,))


def class_mix(update: Update) -> Dict[int, float]:
    """The update's class counts as fractions (empty if it counted none)."""
    total = float(sum(n for n in update.class_counts.values() if n > 0))
    if total <= 0:
        return {}
    return {int(c): n / total for c, n in update.class_counts.items() if n > 0}


class BalancePlugin(CoordinatorPlugin):
    """Weights each update by its classes' shortfall in the global model's tracked composition."""

    name = "balance"
    Config = BalanceConfig

    def __init__(self, config: BalanceConfig, fleet: FleetView, peers: Mapping[str, CoordinatorPlugin]):
        super().__init__(config, fleet, peers)
        #: The global model's class composition (sums to 1 once anything was merged).
        self.composition: Dict[int, float] = {}
        self.rested = 0
        #: Each device's last update: its weight factor and the round intervals it was then told
        #: to rest (0: none). Shown to the operator, not saved (the next update sets it again).
        self.last: Dict[str, Tuple[float, int]] = {}

    def on_update_admitted(self, update: Update, now: float) -> Verdict:
        mix = class_mix(update)
        if not mix or not self.composition:
            factor = 1.0
        else:
            seen = set(self.composition) | set(mix)
            target = 1.0 / len(seen)
            factor = sum(p * min(1.0, target / max(self.composition.get(c, 0.0), 1e-9)) ** self.config.power
                         for c, p in mix.items())
            factor = min(1.0, max(self.config.floor, factor))
        rest = self.config.rest_below
        commands = ()
        if rest is not None and factor < rest:
            self.rested += 1
            commands = (Addressed(update.device_id, Command("skip", {"rounds": self.config.rest_rounds})),)
        self.last[update.device_id] = (float(factor), self.config.rest_rounds if commands else 0)
        return Verdict(weight=factor, commands=commands, fields={"balance_factor": round(factor, 4)})

    def on_model_made(self, aggregation: Aggregation) -> Effects:
        mixes = [(max(1, u.num_samples), class_mix(u)) for u in aggregation.merged]
        mixes = [(n, mix) for n, mix in mixes if mix]
        if not mixes:
            return NOTHING
        # One update (FedAsync) went in at the strategy's weight; a FedAvg round replaces the model.
        rate = 1.0 if aggregation.mixing_weight is None else aggregation.mixing_weight
        total = float(sum(n for n, _ in mixes))
        new: Dict[int, float] = {}
        for n, mix in mixes:
            for c, p in mix.items():
                new[c] = new.get(c, 0.0) + p * n / total
        if not self.composition:
            self.composition = new
            return NOTHING
        for c in set(self.composition) | set(new):
            self.composition[c] = (1.0 - rate) * self.composition.get(c, 0.0) + rate * new.get(c, 0.0)
        return NOTHING

    def describe(self, now: float) -> MethodState:
        """Classes tracked, the most held class and its share of the model, rests told; per device
        its last update's weight factor and the round intervals it was told to rest then (the
        device counts them down; the coordinator does not see how many are left)."""
        top = max(self.composition.items(), key=lambda kv: (kv[1], -kv[0]), default=None)
        return MethodState(
            fleet={"classes": len(self.composition), "top_class": None if top is None else top[0],
                   "top_class_share": None if top is None else round(float(top[1]), 4),
                   "rests_told": self.rested},
            devices={d: {"weight": round(w, 4), "resting": rest > 0, "rest_rounds": rest}
                     for d, (w, rest) in self.last.items()})

    def state(self) -> Dict[str, Any]:
        return {"composition": {str(c): m for c, m in self.composition.items()}, "rested": self.rested}

    def load_state(self, state: Mapping[str, Any]) -> None:
        comp = state.get("composition") or {}
        if not isinstance(comp, Mapping):
            raise ValueError("balance state: composition must be a mapping")
        composition = {int(c): float(m) for c, m in comp.items()}
        if any(c < 0 or not 0.0 <= m <= 1.0 + 1e-6 for c, m in composition.items()):
            raise ValueError("balance state: composition needs class ids >= 0 and shares in [0, 1]")
        self.composition = composition
        self.rested = int(state.get("rested", 0))
