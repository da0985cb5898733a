"""Updates that arrive as deltas (``int8_delta`` frames) made whole again before anyone reads them.

A board that sends ``int8_delta`` quantizes the change from the global model it trained from, not
its weights (``streamfl.protocol.quantize``): the change is small, so its int8 steps are fine where
those of the weights would not be. Here the coordinator adds the delta to its own exact copy of
that version from the ``ModelHistory``. The board's copy may differ from it by the downlink's
rounding (a float16 or int8 model); the board's change is applied to the exact model all the
same, so that rounding never enters the global model. An update whose base has left the history
(more than ``history_size`` versions stale) cannot be made whole: it is rejected with the reason
``delta_base`` (counted like every rejection, by reason, in the fleet table and ``/metrics``), and
the WARNING says to raise ``history_size``.
"""
import logging
from dataclasses import fields
from typing import Optional, Tuple

import numpy as np

from streamfl.coordinator.admission import Verdict
from streamfl.coordinator.history import HistoryEntry, ModelHistory
from streamfl.logs import RateLimitedLog
from streamfl.protocol.messages import DeltaUpdate, Tensors, Update

log = logging.getLogger(__name__)

#: The rejection reason of a delta whose base version the coordinator no longer holds.
DELTA_BASE = "delta_base"
#: At most one WARNING this often about such deltas (the rest are counted).
WARN_INTERVAL_S = 60.0
_UPDATE_FIELDS = tuple(f.name for f in fields(Update) if f.name != "tensors")
_warnings = RateLimitedLog(log, WARN_INTERVAL_S)


def full_update(update: Update, history: ModelHistory,
                base: Optional[Tensors] = None) -> Tuple[Update, Optional[Verdict]]:
    """``(update, None)`` for a full update; a ``DeltaUpdate`` as the ``Update`` its base plus delta
    make, or ``(update, Verdict(reason=DELTA_BASE))`` when the base is gone (or of other shapes).
    The base is ``base`` where a plug-in named the model the update trained from, else global
    version ``update.base_version`` from ``history``."""
    if not isinstance(update, DeltaUpdate):
        return update, None
    entry = history.get(update.base_version) if base is None else HistoryEntry(update.base_version, base, 0.0)
    if entry is None or set(entry.tensors) != set(update.tensors) or any(
            np.shape(entry.tensors[k]) != np.shape(d) for k, d in update.tensors.items()):
        kept = history.versions()
        _warnings.event(DELTA_BASE, logging.WARNING,
                        "rejected delta update %s from %s: its base v%d is not among the %d versions "
                        "kept (%s); raise history_size above the fleet's staleness", update.update_id,
                        update.device_id, update.base_version, len(kept),
                        "v%d..v%d" % (kept[0], kept[-1]) if kept else "none")
        return update, Verdict(update=None, reason=DELTA_BASE)
    tensors = {k: np.add(entry.tensors[k], d, dtype=np.float32) for k, d in update.tensors.items()}
    return Update(tensors=tensors, **{name: getattr(update, name) for name in _UPDATE_FIELDS}), None


__all__ = ["DELTA_BASE", "full_update"]
