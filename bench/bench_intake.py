"""What the intake journal costs: updates/s of the coordinator's network thread with and without it.

The network thread's work per update (``CoordinatorServer.on_message``): decode the frame with the
server's ``Decoder``, then, with the journal (``coordinator/intake.py``, ``intake.durable``), write
it durably (write, fsync, rename, fsync of the folder) before MQTT may acknowledge it. Both loops
run on the same pre-encoded frames in the same folder; every 256 entries (the worker's queue) the
journal drops what it holds, as a save would. ``network_ratio`` is the journalled rate over the
plain one. The worker feeds the core in parallel (decode + admission + FedAsync, as
``bench_coordinator.py`` measures it: ``core_updates_per_s``), so the coordinator takes updates
at about the slower of the two threads: ``pipeline_ratio`` is ``min(journalled, core) /
min(plain, core)``, what the journal costs end to end.

The fsyncs dominate and depend on the disk: on this project's test machine (ext4 on a virtual
disk, about 3 ms per fsync, two per entry) the journal took the network thread from about 25,000
to about 90 updates/s for a small model (mlp, 6.4 kB frames: ``network_ratio`` 0.004, an append
8 ms) and from about 16,000 to about 60 for a 2.1 MB one (lstm, 900 channels); the core there
takes about 2,600 and 1,200 updates/s, so the coordinator as a whole takes updates about 25x
slower with the journal (``pipeline_ratio`` 0.04-0.05). ``--dir`` puts the journal on the disk
the state folder will use. Prints JSON.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from streamfl.coordinator.config import CoordinatorConfig  # noqa: E402
from streamfl.coordinator.core import CoordinatorCore  # noqa: E402
from streamfl.coordinator.intake import IntakeConfig, IntakeJournal  # noqa: E402
from streamfl.models import ModelSpec, tensor_spec  # noqa: E402
from streamfl.protocol.codec import Decoder, encode  # noqa: E402
from streamfl.protocol.messages import Hello, Update  # noqa: E402
from streamfl.protocol.topics import Topics  # noqa: E402

#: Entries the journal holds before a drop (the worker's queue, server.QUEUE_MAX).
DROP_EVERY = 256
FRAMES = 16

CASES = {
    "mlp": ModelSpec(name="mlp", in_channels=2, window_len=4, num_classes=2, hidden=32),
    "lstm-2.1MB": ModelSpec(name="lstm", in_channels=900, hidden=128),
}


def timed(fn, seconds: float, minimum: int = 20):
    """Calls of ``fn(i)`` per second over at least ``seconds`` and ``minimum`` calls."""
    n, start = 0, time.perf_counter()
    while True:
        fn(n)
        n += 1
        elapsed = time.perf_counter() - start
        if n >= minimum and elapsed >= seconds:
            return n / elapsed


def bench_case(label: str, spec: ModelSpec, folder: Path, seconds: float) -> dict:
    config = CoordinatorConfig(model=spec, dedup_window=FRAMES // 2)
    core = CoordinatorCore(config)
    for i in range(4):
        core.on_message(Hello(device_id="dev%d" % i, board="bench", software_version="0",
                              arch_id=spec.arch_id, buffer_capacity=1), now=0.0)
    rng = np.random.default_rng(0)
    frames = [encode(Update(device_id="dev%d" % (i % 4), update_id=uuid.uuid4().hex, base_version=0,
                            arch_id=spec.arch_id, num_samples=64, class_counts={0: 32, 1: 32},
                            loss=0.5, seconds_per_sample=0.001,
                            tensors={k: v + rng.standard_normal(v.shape).astype(np.float32) * 0.01
                                     for k, v in core.model.items()}))
              for i in range(FRAMES)]
    topic = Topics("bench").device("dev0", "update")
    decoder = Decoder({spec.arch_id: tensor_spec(spec)}, receiver_checks_finite=(Update,))
    journal = IntakeJournal(folder / label, IntakeConfig(max_bytes=2 ** 40))
    journal.open(0)
    appends = []

    def plain(i):
        decoder.decode(frames[i % FRAMES])

    def journalled(i):
        decoder.decode(frames[i % FRAMES])
        t0 = time.perf_counter()
        seq = journal.append(topic, frames[i % FRAMES])
        appends.append(time.perf_counter() - t0)
        assert seq is not None, "the journal refused an entry (disk?)"
        if seq % DROP_EVERY == 0:
            journal.drop_through(seq)

    clock = iter(range(1, 10 ** 9))

    def worker(i):
        core.on_message(decoder.decode(frames[i % FRAMES]), now=float(next(clock)))

    plain_rate = timed(plain, seconds)
    journal_rate = timed(journalled, seconds)
    core_rate = timed(worker, seconds)
    journal.drop_through(10 ** 12)
    journal.close()
    return {"model": label, "frame_bytes": len(frames[0]),
            "network_updates_per_s": round(plain_rate, 1),
            "network_updates_per_s_journalled": round(journal_rate, 1),
            "network_ratio": round(journal_rate / plain_rate, 4),
            "core_updates_per_s": round(core_rate, 1),
            "pipeline_ratio": round(min(journal_rate, core_rate) / min(plain_rate, core_rate), 4),
            "append_ms_median": round(statistics.median(appends) * 1e3, 3),
            "append_ms_p99": round(sorted(appends)[int(0.99 * (len(appends) - 1))] * 1e3, 3)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None,
                        help="folder for the journal (default: a temporary one); put it on the "
                             "state folder's disk")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per measured loop")
    parser.add_argument("--models", nargs="+", choices=sorted(CASES), default=list(CASES))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-intake-", dir=args.dir) as tmp:
        cases = [bench_case(name, CASES[name], Path(tmp), args.seconds) for name in args.models]
        where = str(Path(tmp).parent.resolve())
    print(json.dumps({"benchmark": "intake journal", "dir": where, "cases": cases}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
