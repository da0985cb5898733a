"""Fleet-view data for the monitor's tests, in the shapes of the coordinator's fleet table
(``FleetTable.snapshot()`` and ``series(since_s)``): one fixed fleet of any size, and one that
grows with the wall clock (devices join, versions arrive) for the pages and tools that poll it."""
import threading
import time
from typing import Any, Dict, List, Optional

BOARDS = ("raspberry-pi-4", "jetson-nano", "jetson-orin-nano")


def device_row(i: int, version: int, online: bool = True, t: float = 0.0) -> Dict[str, Any]:
    """Device ``i``'s row (``dev-0001`` ...) at global ``version`` and ``t`` seconds into the run."""
    jetson = i % 3 != 0
    return {
        "device": "dev-%04d" % i, "online": online, "last_seen_s": 0.5 + (i % 7) * 0.25,
        "board": BOARDS[i % 3], "software": "0.1.0",
        "version": max(0, version - (i % 3)), "staleness": i % 3, "rounds": version // 2 + i,
        "updates": {"accepted": version // 2, "clipped": i % 2, "rejected": i % 4},
        "rejected_by_reason": {"norm": i % 4} if i % 4 else {},
        "clocks_mhz": dict({"cpu": 1200.0 + 100 * (i % 4) + (50 if int(t) % 2 else 0)},
                           **({"gpu": 460.8 + 10 * (i % 5)} if jetson else {})),
        "power_w": 4.0 + 0.5 * (i % 5) if jetson else None,
        # A Jetson Nano here runs on its board profile's power model, an Orin on its INA3221.
        "power_source": ("modelled" if i % 3 == 1 else "measured") if jetson else None,
        "energy_j": 10.0 * version + i,
        "energy_j_by_source": {(("modelled" if i % 3 == 1 else "measured") if jetson else "unknown"):
                               10.0 * version + i},
        "temperature_c": 45.0 + i % 10,
        "disk_free_bytes": (4 + i % 5) * 2 ** 30, "disk_size_bytes": 32 * 2 ** 30,
        "buffer_fill": min(200, 20 * (version + i)), "buffer_capacity": 200,
        "methods": {"clp": {"lr": 0.01 * (1 + i % 3), "critical": i % 2 == 0}},
    }


def snapshot(n_devices: int, version: int = 10, t: float = 5.0, online: Optional[int] = None,
             run_id: str = "run-test") -> Dict[str, Any]:
    """A whole snapshot of ``n_devices`` devices, the first ``online`` of them online (all)."""
    online = n_devices if online is None else online
    devices = [device_row(i + 1, version, i < online, t) for i in range(n_devices)]
    return {
        "schema": 1, "fleet": "lab", "run_id": run_id, "method": "fedasync+clp",
        "strategy": "fedasync", "plugins": ["clp"], "time_s": t, "wall_s": 1795000000.0 + t,
        "version": version, "versions_per_s": 5.0, "accuracy": min(0.95, 0.3 + 0.01 * version),
        "loss": 1.5, "eval_version": version - version % 5,
        "devices_online": online, "devices_known": n_devices, "devices_offline": n_devices - online,
        "devices_unknown": 0,
        "broker": {"connected": True, "since_wall_s": 1795000000.0, "disconnects": 0, "connects": 1,
                   "reason": ""},
        "updates": {"received": 3 * version, "aggregated": version, "buffered": 0, "stale": 1,
                    "duplicate": 1, "rejected": 4, "withheld": 0, "clipped": 2},
        "rejected_by_reason": {"unknown_device": 3, "norm": 1},
        "energy_j": sum(d["energy_j"] for d in devices), "implausible": {"power_w": 1},
        "methods": {"clp": {"flag": "critical", "changes": 3, "critical": True}},
        "devices": devices, "devices_shown": n_devices, "devices_total": n_devices,
    }


class GrowingFleet:
    """A fleet that changes as a running one does: ``versions_per_s`` versions a second, a first
    device at once and another every ``join_every_s`` up to ``devices``. Safe from any thread."""

    def __init__(self, devices: int = 3, join_every_s: float = 1.0, versions_per_s: float = 5.0,
                 run_id: str = "run-growing"):
        self.devices = devices
        self.join_every_s = join_every_s
        self.versions_per_s = versions_per_s
        self.run_id = run_id
        self._t0 = time.monotonic()
        self._lock = threading.Lock()
        self.calls = 0

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def version_at(self, t: float) -> int:
        return int(t * self.versions_per_s)

    def joined(self, t: float) -> int:
        return min(self.devices, 1 + int(t / self.join_every_s))

    def snapshot(self) -> Dict[str, Any]:
        with self._lock:
            self.calls += 1
        t = self.elapsed()
        snap = snapshot(self.joined(t), self.version_at(t), t, run_id=self.run_id)
        snap["accuracy"] = min(0.9, 0.25 + 0.02 * t)
        return snap

    def series(self, since_s: float = 0.0) -> Dict[str, Any]:
        t_now = self.elapsed()
        times: List[float] = [k * 0.25 for k in range(int(t_now / 0.25) + 1)]
        times = [t for t in times if t > since_s]
        clocks = {}
        for i in range(1, self.joined(t_now) + 1):
            row_times = [t for t in times if t >= (i - 1) * self.join_every_s]
            clocks["dev-%04d" % i] = {
                domain: [[t, device_row(i, self.version_at(t), True, t)["clocks_mhz"][domain]]
                         for t in row_times]
                for domain in device_row(i, 0)["clocks_mhz"]}
        return {
            "time_s": t_now,
            "accuracy": [[t, self.version_at(t), min(0.9, 0.25 + 0.02 * t)] for t in times],
            "versions": [[t, self.version_at(t), self.versions_per_s] for t in times],
            "energy_j": [[t, 30.0 * self.version_at(t)] for t in times],
            "clocks_mhz": clocks,
            "events": [[t, "clp", "flag %s at version %d" % ("critical" if int(t) % 2 == 0 else "off",
                                                             self.version_at(t))]
                       for t in times if t > 0 and t == int(t)],
        }
