"""Simulator speed and memory, printed as JSON.

Goals: with ``cnn1d``, 100 devices and 5,000 aggregations finish in under 10 minutes on the 2-core
development machine; memory stays under 4 GB with 120 devices. Each figure runs in a child process
so its peak resident memory (``ru_maxrss``) is its own. The wall time is also given per aggregation
and against one local round of the same model timed in the same process, since the machine is
shared and noisy: the ratio says how much the simulator adds around the training it must do.

    python bench/sim.py                      # both figures at full size (several minutes)
    python bench/sim.py --aggregations 500   # a quicker look; the JSON says what ran
"""
import argparse
import json
import multiprocessing
import resource
import sys
import time
from typing import Any, Dict


def scenario_values(devices: int, aggregations: int) -> Dict[str, Any]:
    """FedAsync on synthetic IMU windows, a mix of Jetson and Pi boards, long enough to reach
    ``aggregations`` (the run stops there)."""
    return {
        "name": "bench-%d-devices" % devices,
        "duration_s": 1e7,
        "max_aggregations": aggregations,
        "model": {"name": "cnn1d", "hidden": 64},
        "data": {"dataset": "synthetic", "n_windows": 6000, "partition": "dirichlet", "beta": 0.5},
        "stream": {"kind": "iid", "windows_per_s": 1.0},
        "devices": [{"count": devices // 2, "board": "jetson-orin-nano"},
                    {"count": devices - devices // 2, "board": "raspberry-pi-4", "speed": 3.0}],
        "methods": ["fedasync"],
        "eval_every_s": 600.0,
        "eval_windows": 500,
        "agent": {"buffer_capacity": 256, "min_buffer": 32},
        "coordinator": {"hparams": {"lr": 0.05, "batch_size": 32, "local_steps": 10}},
    }


def _child(devices: int, aggregations: int, out: "multiprocessing.Queue") -> None:
    import tempfile
    from pathlib import Path

    import torch

    from streamfl.sim.driver import Progress, run_sim
    from streamfl.sim.scenario import scenario_from_dict
    torch.set_num_threads(1)
    scenario = scenario_from_dict(scenario_values(devices, aggregations), "bench")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        summary = run_sim(scenario, Path(tmp), progress=Progress(1, stream=open("/dev/null", "w")))
        wall_s = time.perf_counter() - t0
    run = summary["methods"]["fedasync"]["runs"][0]
    out.put({"devices": devices, "aggregations": run["versions"], "wall_s": round(wall_s, 2),
             "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
             "round_s": round(_one_round_s(), 5)})


def _one_round_s() -> float:
    """Seconds of one local round (10 steps, batch 32, cnn1d) alone: the simulator's floor."""
    import numpy as np
    import torch

    from streamfl.agent.trainer import LocalTrainer
    from streamfl.models import ModelSpec, build_model
    spec = ModelSpec(name="cnn1d", in_channels=6, window_len=50, num_classes=6, hidden=64)
    trainer = LocalTrainer(build_model(spec, seed=0), spec.num_classes)
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((32, 50, 6)).astype(np.float32),
                rng.integers(0, 6, 32)) for _ in range(10)]
    trainer.run(iter(batches), 0.01)
    t0 = time.perf_counter()
    for _ in range(20):
        trainer.run(iter(batches), 0.01)
    return (time.perf_counter() - t0) / 20


def measure(devices: int, aggregations: int) -> Dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(devices, aggregations, queue))
    proc.start()
    result = queue.get()
    proc.join()
    result["per_aggregation_s"] = round(result["wall_s"] / max(1, result["aggregations"]), 4)
    result["overhead_ratio"] = round(result["per_aggregation_s"] / result["round_s"], 2)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--aggregations", type=int, default=5000)
    p.add_argument("--memory-aggregations", type=int, default=300,
                   help="aggregations of the 120-device memory run")
    args = p.parse_args()
    speed = measure(100, args.aggregations)
    memory = measure(120, args.memory_aggregations)
    scale = 5000.0 / max(1, speed["aggregations"])
    report = {
        "speed_100_devices": speed,
        "memory_120_devices": memory,
        "goals": {
            "5000_aggregations_under_600_s": speed["wall_s"] * scale < 600.0,
            "5000_aggregations_s": round(speed["wall_s"] * scale, 1),
            "extrapolated": speed["aggregations"] != 5000,
            "memory_120_devices_under_4096_mb": memory["peak_rss_mb"] < 4096.0,
        },
        "python": sys.version.split()[0],
    }
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
