"""The coordinator's cost per update must not grow with the fleet: 100 devices against 100,000.

Admission reads fleet-wide medians for every update (the reference of its norm bound, the cap of a
claimed sample count) and the number of devices online. Read from fresh lists, each update paid
for sorting the whole fleet; now they are kept sorted as votes come (coordinator/sorted_votes.py)
and counted as devices come and go (coordinator/registry.py). Here a ``CoordinatorCore`` (FedAsync,
a tiny ``mlp`` so that the fleet-wide work, not the model's size, is what is measured) first hears
a Hello and one update from every device of the fleet, then times updates from devices drawn at
random. FedAvg too: a synchronous round asks per update whether a device it waits for is still
missing and online, which once built the online set from a sorted list of the whole fleet (O(n)
per update). Prints JSON: microseconds per update at each fleet size and their ratio, per
strategy; goal: the 100,000-device fleet costs at most 2x the 100-device one per update under
each strategy (the O(log n) parts remain).

    python bench/bench_fleet_scaling.py
"""
import json
import os
import random
import sys
import time
import uuid

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from streamfl.coordinator.config import CoordinatorConfig  # noqa: E402
from streamfl.coordinator.core import CoordinatorCore  # noqa: E402
from streamfl.models import ModelSpec  # noqa: E402
from streamfl.protocol.messages import Hello, Update  # noqa: E402

SPEC = ModelSpec(name="mlp", hidden=4)
FLEETS = (100, 100000)
GOAL_RATIO = 2.0
MEASURED_UPDATES = 3000
STRATEGIES = ("fedasync", "fedavg")


def update_from(core, device, rng, noise):
    """A fresh update of ``device``: the current model plus one of a few noise arrays."""
    tensors = {k: v + noise[k] for k, v in core.global_model().tensors.items()}
    return Update(device_id=device, update_id=uuid.uuid4().hex, base_version=core.version,
                  arch_id=SPEC.arch_id, tensors=tensors, num_samples=rng.randrange(32, 96),
                  class_counts={0: 16, 1: 16}, loss=0.5, seconds_per_sample=1e-4)


def per_update_us(fleet: int, seed: int = 0, strategy: str = "fedasync") -> float:
    """Microseconds per update once ``fleet`` devices have said Hello and voted. Under FedAvg the
    rounds wait for every device online, so at the large fleet the measured updates all join one
    open round (each device's newest replaces its last), at the small one rounds close as they
    fill."""
    rng = random.Random(seed)
    np_rng = np.random.default_rng(seed)
    core = CoordinatorCore(CoordinatorConfig(model=SPEC, strategy=strategy, eval_path=None))
    noise = [{k: (np_rng.standard_normal(v.shape) * 1e-3).astype(np.float32)
              for k, v in core.model.items()} for _ in range(4)]
    devices = ["dev-%06d" % i for i in range(fleet)]
    now = 0.0
    for i, device in enumerate(devices):
        core.on_message(Hello(device_id=device, board="bench", software_version="0",
                              arch_id=SPEC.arch_id, buffer_capacity=64), now=now)
    for i, device in enumerate(devices):   # one vote each: the medians hold the whole fleet
        now += 0.001
        core.on_message(update_from(core, device, rng, noise[i % 4]), now=now)
    elapsed = 0.0
    for i in range(MEASURED_UPDATES):
        # Made from the current version just before it is sent (untimed), so that no update is
        # stale when FedAvg's rounds close between them.
        update = update_from(core, rng.choice(devices), rng, noise[i % 4])
        now += 10.0    # far apart in time: no device meets its rate limit
        start = time.perf_counter()
        core.on_message(update, now=now)
        elapsed += time.perf_counter() - start
    assert core.counters["rejected"] == 0, core.admission.counters
    assert getattr(core.strategy, "stale_dropped", 0) == 0
    return 1e6 * elapsed / MEASURED_UPDATES


def main() -> int:
    cases = {}
    for strategy in STRATEGIES:
        costs = {fleet: per_update_us(fleet, strategy=strategy) for fleet in FLEETS}
        ratio = costs[FLEETS[-1]] / costs[FLEETS[0]]
        cases[strategy] = {"us_per_update": {str(k): round(v, 1) for k, v in costs.items()},
                           "ratio": round(ratio, 2), "pass": ratio <= GOAL_RATIO}
    passed = all(case["pass"] for case in cases.values())
    print(json.dumps({"benchmark": "coordinator_cost_per_update_against_fleet_size",
                      "model": SPEC.arch_id, "strategies": cases, "goal_ratio": GOAL_RATIO,
                      "pass": passed}, indent=2))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
