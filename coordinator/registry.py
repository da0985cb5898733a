"""Who is in the fleet: devices known from Hello/last-will status messages and their last-seen times.

FedAvg asks it which devices to wait for; metrics report how many are online; availability (the
share of time a device has been online since first seen) feeds future schedulers.

Two boards with one device id (flashed from one image, the hostname as the id) take the broker
connection from each other, and each says Hello on every connect: the Hellos alternate between
the two agent processes' ``Hello.instance``. A Hello from an instance the device had before
another took its place, within ``duplicate_window_s``, is a second process under the id (a
restart never comes back to the instance it replaced: it is random per process, and a clean stop
or a crash followed by a start shows one new instance). Each one is counted on the device
(``DeviceInfo.duplicate_id``) and returned to the core, which counts, logs and records it.
"""
import logging
from collections.abc import Set as SetABC
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import AbstractSet, Dict, Iterator, List, Optional, Set

from streamfl.protocol.messages import Hello, Offline

log = logging.getLogger(__name__)

#: Seconds within which a Hello that comes back to an instance the device had before is counted
#: as a second process under its id. One hour: two clones backing off (agent/takeover.py, up to
#: 5 minutes between take-overs) alternate well within it, and nothing else brings an old
#: instance back at all, so a longer window adds no false reports, only memory.
DUPLICATE_WINDOW_S = 3600.0
#: Instances remembered per device (a Hello's is at most ``INSTANCE_CHARS`` characters).
INSTANCES_KEPT = 8
INSTANCE_CHARS = 64


class _ReadOnlySet(SetABC):
    """A set seen through a window that cannot change it (the registry's own stays its own)."""

    def __init__(self, items: Set[str]) -> None:
        self._items = items

    def __contains__(self, item: object) -> bool:
        return item in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


@dataclass
class DeviceInfo:
    """What the coordinator knows about one device."""

    device_id: str
    online: bool
    first_seen_s: float
    last_seen_s: float
    #: Time of the last online/offline transition, for the availability estimate.
    since_s: float
    online_total_s: float = 0.0
    hello: Optional[Hello] = None
    offline_reason: str = ""
    updates: int = 0
    #: Hellos that came back to an instance another had replaced: two processes (two boards)
    #: use this device id (see the module docstring); 0 for a device alone with its id.
    duplicate_id: int = 0
    #: When the last one came (None: never), and the instances seen in the window then.
    duplicate_id_last_s: Optional[float] = None
    duplicate_id_instances: int = 0
    #: Instance -> when its last Hello came, oldest first (bounded by ``INSTANCES_KEPT``).
    instances: "OrderedDict[str, float]" = field(default_factory=OrderedDict)

    def availability(self, now: float) -> float:
        """Fraction of time online since first seen (1.0 for a device just seen online)."""
        online_s = self.online_total_s + (now - self.since_s if self.online else 0.0)
        span = now - self.first_seen_s
        if span <= 0:
            return 1.0 if self.online else 0.0
        return max(0.0, min(1.0, online_s / span))


def _copy(info: DeviceInfo) -> DeviceInfo:
    """A copy that shares nothing mutable with the registry's own."""
    return replace(info, instances=OrderedDict(info.instances))


class DeviceRegistry:
    """Device table updated by the core from status messages and any other traffic."""

    def __init__(self, duplicate_window_s: float = DUPLICATE_WINDOW_S) -> None:
        self.duplicate_window_s = float(duplicate_window_s)
        self._devices: Dict[str, DeviceInfo] = {}
        #: Devices that ever said Hello to this state folder (persisted): only their updates count.
        self._greeted: Set[str] = set()
        #: The ids of ``_devices`` that are online, kept as they change: admission asks their
        #: count per update, FedAvg whether one it waits for is online.
        self._online_ids: Set[str] = set()

    def _get(self, device_id: str, now: float, online: bool) -> DeviceInfo:
        info = self._devices.get(device_id)
        if info is None:
            info = DeviceInfo(device_id=device_id, online=online, first_seen_s=now, last_seen_s=now,
                              since_s=now)
            self._devices[device_id] = info
            if online:
                self._online_ids.add(device_id)
            log.info("new device %s (%s)", device_id, "online" if online else "offline")
        return info

    def _set_online(self, info: DeviceInfo, online: bool, now: float) -> None:
        if info.online == online:
            return
        if info.online:
            info.online_total_s += max(0.0, now - info.since_s)
        if online:
            self._online_ids.add(info.device_id)
        else:
            self._online_ids.discard(info.device_id)
        info.online = online
        info.since_s = now

    def on_hello(self, hello: Hello, now: float) -> bool:
        """A device announced itself (retained status on connect); True when the Hello shows a
        second process under its id (``DeviceInfo.duplicate_id`` counts it)."""
        online = bool(hello.online)
        info = self._get(hello.device_id, now, online)
        duplicate = self._note_instance(info, str(hello.instance)[:INSTANCE_CHARS], now)
        self._greeted.add(hello.device_id)
        if online and not info.online:
            log.info("device %s is back online", hello.device_id)
        self._set_online(info, online, now)
        info.hello = hello
        info.offline_reason = "" if online else "hello-offline"
        info.last_seen_s = max(info.last_seen_s, now)
        return duplicate

    def _note_instance(self, info: DeviceInfo, instance: str, now: float) -> bool:
        """Remember the Hello's instance; True when it comes back to one another had replaced."""
        if not instance:  # an agent that does not say (older versions): nothing to compare
            return False
        seen = info.instances
        for old in [i for i, t in seen.items() if now - t > self.duplicate_window_s]:
            del seen[old]
        current = next(reversed(seen)) if seen else None
        returning = instance in seen and instance != current
        seen.pop(instance, None)
        seen[instance] = now
        while len(seen) > INSTANCES_KEPT:
            seen.popitem(last=False)
        if returning:
            info.duplicate_id += 1
            info.duplicate_id_last_s = now
            info.duplicate_id_instances = len(seen)
        return returning

    def on_offline(self, offline: Offline, now: float) -> None:
        """A device's last will or clean-exit status: it is gone until its next Hello."""
        info = self._get(offline.device_id, now, False)
        if info.online:
            log.info("device %s went offline (%s)", offline.device_id, offline.reason)
        self._set_online(info, False, now)
        info.offline_reason = offline.reason
        # The will is sent by the broker, not the device: it does not refresh last_seen.

    def greeted(self, device_id: str) -> bool:
        """True if ``device_id`` said Hello, in this run or an earlier one of the same state."""
        return device_id in self._greeted

    def greeted_ids(self) -> List[str]:
        return sorted(self._greeted)

    def restore_greeted(self, device_ids) -> None:
        """Devices that said Hello before a restart (their queued updates may arrive first)."""
        self._greeted.update(str(d) for d in device_ids)

    def seen(self, device_id: str, now: float) -> DeviceInfo:
        """Any message from the device: refresh last_seen (an unknown sender is registered online)."""
        info = self._get(device_id, now, True)
        info.last_seen_s = max(info.last_seen_s, now)
        return info

    def online_count(self) -> int:
        """How many devices are online now, in constant time (``len(online())`` sorts them all)."""
        return len(self._online_ids)

    def online(self) -> List[str]:
        """Ids of the devices currently online, sorted."""
        return sorted(self._online_ids)

    def online_ids(self) -> AbstractSet[str]:
        """The ids of the devices online now, unsorted, in constant time: a live read-only view
        for membership tests per update (``online()`` sorts a copy of them all)."""
        return _ReadOnlySet(self._online_ids)

    def devices(self) -> Dict[str, DeviceInfo]:
        """A snapshot copy of the whole table."""
        return {d: _copy(info) for d, info in self._devices.items()}

    def get(self, device_id: str) -> Optional[DeviceInfo]:
        info = self._devices.get(device_id)
        return _copy(info) if info is not None else None

    def duplicate_ids(self) -> Dict[str, int]:
        """Devices whose id two processes used (``DeviceInfo.duplicate_id`` > 0), with the count."""
        return {d: info.duplicate_id for d, info in sorted(self._devices.items())
                if info.duplicate_id}

    def __len__(self) -> int:
        return len(self._devices)
