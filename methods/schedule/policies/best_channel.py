"""The ``best-channel`` baseline (FedTeddi paper, V-A (2), after [37]): the devices with the best link
first, taken while they fit the budget.

"Prioritize clients with the highest channel gain": order by ``snr_hz`` (P|H|^2/N0, the gain scaled
by the device's power and the noise) descending. Real boards often report no channel estimate, so
devices with an unknown SNR come after all known ones, ordered among themselves by ``latency_s``
ascending (a shorter measured round is the better link on a real board), devices with neither last;
ties go to the lower index.
"""
import logging

import numpy as np

from streamfl.methods.schedule.policies.base import (
    Budget, Candidates, RoundInfo, SchedulingPolicy, fill,
)

log = logging.getLogger(__name__)


def channel_order(c: Candidates) -> np.ndarray:
    """Known SNR descending, then unknown SNR by latency ascending, then neither; ties by index."""
    snr_known = ~np.isnan(c.snr_hz)
    lat_known = ~np.isnan(c.latency_s)
    group = np.where(snr_known, 0, np.where(lat_known, 1, 2))
    key = np.where(snr_known, -np.nan_to_num(c.snr_hz, nan=0.0),
                   np.where(lat_known, np.nan_to_num(c.latency_s, nan=0.0), 0.0))
    return np.lexsort((np.arange(c.num_devices), key, group)).astype(np.int64)


class BestChannelPolicy(SchedulingPolicy):
    """Best channel first: fast uploads, blind to the data."""

    name = "best-channel"

    def select(self, c: Candidates, budget: Budget, info: RoundInfo) -> np.ndarray:
        return fill(channel_order(c), c, budget)
