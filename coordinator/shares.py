"""No single device holds more than a bounded share of a fleet-level sum, weight or vote.

Every per-device number that reaches a fleet-wide decision (a Fisher diagonal summed into FedCurv's
U, a T-FDM into ST-EWC's P, a Fisher trace into AdaCLP's F_G, a SAW factor, a claimed sample count
or round time) is a claim. Declared bounds (``Extra.BOUNDS``) stop absurd values at decoding, but a
value inside them can still dwarf every honest one. So the one rule here: **a device's value counts
for at most ``multiple`` times the median of the other devices' values** (leave-one-out: the device
itself cannot move its own reference). With ``n`` devices whose values are about equal, one device
then holds at most ``multiple / (multiple + n - 1)`` of a sum, and never more than
``multiple / (multiple + (n - 1) / 2)`` whatever the others hold (at least half of them are at or
above their median). A device alone is the fleet and keeps its value.

``peer_scales`` gives each device's factor in (0, 1]; ``CappedSum`` keeps a sum of per-device
arrays under those factors incrementally (an honest fleet, where no factor binds, pays one
subtraction and one addition per contribution, as a plain sum would); ``capped`` caps one scalar
against its peers. Which multiple each method uses, and why, is in its settings' docstring.
"""
import math
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

import numpy as np

#: Ints below this in magnitude convert to float exactly (``median_of`` takes its fast path).
BIG_INT = 2 ** 53

#: Arrays of one contribution: ``{group: {tensor name: array}}`` (e.g. FedCurv's F and F*theta).
Groups = Mapping[str, Mapping[str, np.ndarray]]


def leave_one_out_medians(values: Mapping[str, float]) -> Dict[str, Optional[float]]:
    """For every device, the median of the OTHER devices' values (None for a device alone)."""
    items = sorted(values.items(), key=lambda kv: kv[1])
    n = len(items)
    out: Dict[str, Optional[float]] = {}
    if n < 2:
        return {k: None for k in values}
    m = n - 1
    lo, hi = (m - 1) // 2, m // 2
    for i, (key, _) in enumerate(items):
        # Position p among the others is position p (p < i) or p + 1 (p >= i) in the sorted list.
        a = items[lo if lo < i else lo + 1][1]
        b = items[hi if hi < i else hi + 1][1]
        out[key] = 0.5 * (a + b)
    return out


def peer_scales(sizes: Mapping[str, float], multiple: float) -> Dict[str, float]:
    """Each device's factor ``min(1, multiple * median_of_others / size)``; 1 for a device alone,
    a size <= 0, or peers whose median is 0 (nothing to compare a positive size to: see
    ``capped`` for a floor)."""
    medians = leave_one_out_medians(sizes)
    out = {}
    for key, size in sizes.items():
        ref = medians[key]
        if ref is None or size <= 0 or ref <= 0:
            out[key] = 1.0
        else:
            out[key] = min(1.0, multiple * ref / size)
    return out


def median_of(values: List[Any]) -> float:
    """``float(np.median(values))`` (the same float), without numpy's ~8 us per call where the
    values are plain ints (below 2**53) and finite floats (admission caps a sample count per
    update): each converted to float, the middle one or the mean of the middle two, as numpy does."""
    exact = True
    for v in values:
        kind = type(v)
        if not ((kind is float and math.isfinite(v)) or (kind is int and -BIG_INT < v < BIG_INT)):
            exact = False
            break
    if not exact or not values:
        return float(np.median(values))
    ordered = sorted(float(v) for v in values)
    half = len(ordered) // 2
    middle = ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2
    # A zero's sign depends on how numpy orders -0.0 and 0.0: let numpy decide it.
    return middle if middle != 0.0 else float(np.median(values))


def capped(value: float, peers: Iterable[float], multiple: float, floor: float = 0.0) -> float:
    """``value`` capped at ``multiple`` times the median of ``peers`` (the other devices' values),
    never below ``floor``; ``value`` itself when there are no peers."""
    peers = list(peers)
    if not peers:
        return value
    return min(value, max(floor, multiple * median_of(peers)))


class CappedSum:
    """``sum_k s_k x_k`` over each device's latest contribution ``x_k`` (arrays in groups), with
    ``s_k = peer_scales(sizes, multiple)``: kept incrementally, float64.

    A contribution is replaced whole (``put``) or dropped (``remove``). After each change every
    device's factor is recomputed from the sizes (cheap: scalars); only the contributions whose
    factor changed are re-added, so an honest fleet, where no factor binds, costs what an
    uncapped sum costs.
    """

    def __init__(self, multiple: float):
        if not multiple >= 1.0:
            raise ValueError("a share multiple must be >= 1, got %r" % (multiple,))
        self.multiple = float(multiple)
        self._parts: Dict[str, Tuple[float, Groups]] = {}
        self._scales: Dict[str, float] = {}
        self._sum: Dict[str, Dict[str, np.ndarray]] = {}

    def __len__(self) -> int:
        return len(self._parts)

    def __contains__(self, device_id: str) -> bool:
        return device_id in self._parts

    def put(self, device_id: str, size: float, groups: Groups) -> None:
        """Make ``groups`` (of magnitude ``size``, e.g. its total) the device's contribution."""
        self._drop(device_id)
        self._parts[device_id] = (float(size), groups)
        self._rescale()

    def remove(self, device_id: str) -> None:
        """Take the device's contribution out (it left for good)."""
        if device_id in self._parts:
            self._drop(device_id)
            self._rescale()

    def scale(self, device_id: str) -> float:
        """The factor the device's contribution counts with (1 if not capped)."""
        return self._scales.get(device_id, 1.0)

    def scales(self) -> Dict[str, float]:
        return dict(self._scales)

    def part(self, device_id: str) -> Optional[Groups]:
        """The device's contribution as given (unscaled), or None."""
        entry = self._parts.get(device_id)
        return None if entry is None else entry[1]

    def items(self) -> Iterable[Tuple[str, Groups]]:
        return ((k, g) for k, (_, g) in self._parts.items())

    def sums(self) -> Dict[str, Dict[str, np.ndarray]]:
        """``{group: {name: sum}}`` (float64, the live arrays: copy before changing them)."""
        return self._sum

    def clear(self) -> None:
        self._parts, self._scales, self._sum = {}, {}, {}

    # ---- internals ----------------------------------------------------------------------------
    def _add(self, groups: Groups, factor: float) -> None:
        if factor == 0.0:
            return
        for group, tensors in groups.items():
            target = self._sum.setdefault(group, {})
            for name, a in tensors.items():
                if name not in target:
                    target[name] = np.zeros(np.shape(a), dtype=np.float64)
                if factor == 1.0:
                    target[name] += a
                else:
                    target[name] += factor * np.asarray(a, dtype=np.float64)

    def _drop(self, device_id: str) -> None:
        old = self._parts.pop(device_id, None)
        if old is not None:
            self._add(old[1], -self._scales.pop(device_id, 1.0))

    def _rescale(self) -> None:
        new = peer_scales({k: s for k, (s, _) in self._parts.items()}, self.multiple)
        for device_id, factor in new.items():
            old = self._scales.get(device_id)
            if old is None:
                self._add(self._parts[device_id][1], factor)
            elif abs(factor - old) > 1e-12 * max(1.0, old):
                self._add(self._parts[device_id][1], factor - old)
            else:
                continue
            self._scales[device_id] = factor
