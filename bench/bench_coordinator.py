"""Coordinator throughput: FedAsync updates per second through the codec (decode + admit + aggregate).

Each measured update is a pre-encoded Update frame decoded by the real ``Decoder``, configured as
the server's (it leaves the NaN/Inf check of an update's tensors to admission's pass over them),
and handed to ``CoordinatorCore.on_message`` (admission's NaN check, value cap and norm bound,
FedAsync aggregation, version bump, history, dedup). ``updates_per_s_durable`` adds what durable publishing costs the worker
thread at most: a snapshot (``global_model()`` + ``state()``) after every aggregation; the save
itself (write, fsync, rename: ``save_ms``) runs in the publisher thread, at most every
``persist_interval_s``, so it bounds how fresh the published model is, not the update rate.
Evaluation and MQTT are excluded. Prints JSON; goal: >= 3,000 updates/s for a 2.1 MB model
(ModelSpec(name="lstm", in_channels=900, hidden=128)) with durable publishing. Since
machines differ, each case also copies the flat model (``np.copyto``) in the same run, before and
after the updates (the faster copy counts): ``durable_update_cost_in_memcpys`` is what one durable
update costs in such copies, and ``goal_update_cost_in_memcpys`` (``memcpy_per_s / 3000``) what
the goal allows on this machine.

``traffic_floor_in_memcpys`` is what no implementation of this update can go below on the machine:
the memory an update must touch, the frame's tensors, the base it was trained from and the current
model read once each and the new model written once, streamed in plain numpy passes (a dot product
over the update, one over the base, a copy of the model into a fresh buffer: three reads and one
write, the copy's own share counting as one memcpy). ``goal_within_floor`` says whether the goal
allows at least that many copies here: where it does not, the goal is out of reach for any code on
this machine, not only for ours.

``kernels`` names the loops that ran (``coordinator/kernels``: numba's where installed);
``updates_per_s_durable_numpy_kernels`` is the durable rate with numpy's instead, in the same run.

``admission_us`` is what ``UpdateAdmission.check`` alone costs per update (the rate limit, the
magnitude cap, the delta norm against the base, one device one vote for the bound, the sample
count's peer cap), and ``admission_share`` its part of one whole update's cost, both from the same
run.
"""
import itertools
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

# "On one core": numpy's BLAS and torch's OpenMP pools too, set before either is imported.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import torch

from streamfl.coordinator.admission import UpdateAdmission
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.core import CoordinatorCore
from streamfl.coordinator.kernels import NumpyKernels
from streamfl.coordinator.persistence import StateStore
from streamfl.models import ModelSpec, tensor_spec
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import Hello, Update

GOAL_UPDATES_PER_S = 3000.0
#: Distinct frames cycled through; the dedup window is smaller so no frame counts as a duplicate.
FRAMES = 24
DEDUP_WINDOW = 8
SECONDS_PER_CASE = 3.0


def make_frames(core, spec, rng):
    frames = []
    for i in range(FRAMES):
        tensors = {k: (v + rng.standard_normal(v.shape).astype(np.float32) * 0.01)
                   for k, v in core.model.items()}
        frames.append(encode(Update(device_id="dev%d" % (i % 8), update_id=uuid.uuid4().hex,
                                    base_version=0, arch_id=spec.arch_id, tensors=tensors,
                                    num_samples=640, class_counts={0: 320, 1: 320}, loss=0.5,
                                    seconds_per_sample=0.001)))
    return frames


def timed_loop(fn, seconds):
    """Run ``fn(i)`` until ``seconds`` pass (at least 20 calls); calls per second."""
    n = 0
    start = time.perf_counter()
    while True:
        fn(n)
        n += 1
        elapsed = time.perf_counter() - start
        if n >= 20 and elapsed >= seconds:
            return n / elapsed, n


def traffic_floor_rate(decoded, core):
    """Updates/s if an update only streamed what it must: read the update, its base and the
    model, write the new model (see the module docstring). Flat copies of each, laid out apart."""
    updates = [np.concatenate([a.ravel() for a in d.tensors.values()]) for d in decoded]
    base = np.concatenate([a.ravel() for a in core.history.get(core.history.versions()[0]).tensors.values()])
    model = np.concatenate([a.ravel() for a in core.model.values()])
    out = [np.empty_like(model) for _ in range(2)]

    def one(i):
        u = updates[i % len(updates)]
        np.dot(u, u)
        np.dot(base, base)
        np.copyto(out[i % 2], model)

    return timed_loop(one, SECONDS_PER_CASE / 3)[0]


def bench_case(label, spec):
    config = CoordinatorConfig(model=spec, strategy="fedasync", staleness="polynomial",
                               dedup_window=DEDUP_WINDOW, eval_path=None)
    core = CoordinatorCore(config)
    for i in range(8):                              # admission counts only devices that said Hello
        core.on_message(Hello(device_id="dev%d" % i, board="bench", software_version="0",
                              arch_id=spec.arch_id, buffer_capacity=1), now=0.0)
    rng = np.random.default_rng(0)
    frames = make_frames(core, spec, rng)
    decoder = Decoder({spec.arch_id: tensor_spec(spec)}, receiver_checks_finite=(Update,))  # as the server's
    model_bytes = sum(v.nbytes for v in core.model.values())

    clock = itertools.count()   # one virtual second per update, increasing across the loops
    flat = np.concatenate([v.ravel() for v in core.model.values()])
    dst = np.empty_like(flat)
    copy_rate_before, _ = timed_loop(lambda i: np.copyto(dst, flat), SECONDS_PER_CASE / 6)

    def one_update(i):
        msg = decoder.decode(frames[i % FRAMES])
        core.on_message(msg, now=float(next(clock)))

    def one_durable_update(i):
        one_update(i)
        core.global_model()
        core.state()

    one_update(FRAMES - 1)                          # warm-up (not in the dedup window later)
    rate, n = timed_loop(one_update, SECONDS_PER_CASE)
    assert core.counters["duplicates"] == 0 and core.counters["aggregated"] == n + 1
    assert core.admission.counters["clipped"] == 0
    durable_rate, _ = timed_loop(one_durable_update, SECONDS_PER_CASE)
    kernels = core.strategy.kernels.name
    fast = (core.strategy.kernels, core.admission._delta_norm.kernels)
    core.strategy.kernels = core.admission._delta_norm.kernels = NumpyKernels()
    numpy_rate, _ = timed_loop(one_durable_update, SECONDS_PER_CASE)
    core.strategy.kernels, core.admission._delta_norm.kernels = fast
    assert core.counters["rejected"] == 0, core.admission.counters
    with tempfile.TemporaryDirectory() as tmp:
        store = StateStore(Path(tmp))
        save_s = []
        for _ in range(10):
            t0 = time.perf_counter()
            store.save(core.model, core.state())
            save_s.append(time.perf_counter() - t0)
    decode_rate, _ = timed_loop(lambda i: decoder.decode(frames[i % FRAMES]), SECONDS_PER_CASE / 3)
    admission = UpdateAdmission(config.admission)
    decoded = [decoder.decode(f) for f in frames]
    base = core.model
    admission_rate, _ = timed_loop(lambda i: admission.check(decoded[i % FRAMES], base, True, float(i)),
                                   SECONDS_PER_CASE / 3)
    assert admission.counters["accepted"] > 0 and not any(
        k.startswith("rejected_") and v for k, v in admission.counters.items())
    floor_rate = traffic_floor_rate(decoded, core)
    copy_rate_after, _ = timed_loop(lambda i: np.copyto(dst, flat), SECONDS_PER_CASE / 6)
    copy_rate = max(copy_rate_before, copy_rate_after)
    return {"model": label, "arch_id": spec.arch_id, "model_bytes": model_bytes,
            "frame_bytes": len(frames[0]), "updates": n, "updates_per_s": round(rate, 1),
            "updates_per_s_durable": round(durable_rate, 1),
            "kernels": kernels,
            "updates_per_s_durable_numpy_kernels": round(numpy_rate, 1),
            "save_ms": round(1e3 * float(np.median(save_s)), 2),
            "decode_only_per_s": round(decode_rate, 1),
            "memcpy_per_s": round(copy_rate, 1),
            "update_cost_in_memcpys": round(copy_rate / rate, 2),
            "durable_update_cost_in_memcpys": round(copy_rate / durable_rate, 2),
            "traffic_floor_in_memcpys": round(copy_rate / floor_rate, 2),
            "admission_us": round(1e6 / admission_rate, 1),
            "admission_share": round(rate / admission_rate, 3),
            "admission_cost_in_memcpys": round(copy_rate / admission_rate, 2)}


def main() -> int:
    torch.set_num_threads(1)
    cases = [bench_case("default lstm", ModelSpec()),
             bench_case("2.1 MB lstm", ModelSpec(name="lstm", in_channels=900, hidden=128))]
    big = cases[1]
    passed = big["updates_per_s_durable"] >= GOAL_UPDATES_PER_S
    print(json.dumps({"benchmark": "coordinator_fedasync_updates_per_s", "cases": cases,
                      "goal_updates_per_s": GOAL_UPDATES_PER_S,
                      "measured_updates_per_s": big["updates_per_s_durable"],
                      "goal_update_cost_in_memcpys": round(big["memcpy_per_s"] / GOAL_UPDATES_PER_S, 2),
                      "measured_update_cost_in_memcpys": big["durable_update_cost_in_memcpys"],
                      "traffic_floor_in_memcpys": big["traffic_floor_in_memcpys"],
                      "goal_within_floor": big["memcpy_per_s"] / GOAL_UPDATES_PER_S >= big["traffic_floor_in_memcpys"],
                      "pass": passed}, indent=2))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
