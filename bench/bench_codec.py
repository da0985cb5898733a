"""Codec throughput against a plain memory copy of the same bytes, measured in the same run.

Goal: encode+decode of a 2.1 MB model frame at least 0.3x the speed of copying
those bytes once. Prints one JSON object; exit status 1 if the goal is missed.
Usage: ``python bench/bench_codec.py [--repeat N]``.
"""
import argparse
import json
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List

import numpy as np

from streamfl.models import ModelSpec, tensor_spec
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import Update
from streamfl.methods.clp.payloads import FisherTrace

GOAL_RATIO = 0.3


def timings(fn: Callable[[], object], repeat: int) -> List[float]:
    """Seconds per call, ``repeat`` times (after two warm-up calls)."""
    fn()
    fn()
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def bench_model(spec: ModelSpec, repeat: int) -> Dict[str, object]:
    """Encode+decode vs memory copy for one Update of ``spec``'s tensors."""
    tspec = tensor_spec(spec)
    rng = np.random.default_rng(0)
    tensors = {k: rng.standard_normal(shape).astype(np.float32) for k, (shape, _) in tspec.items()}
    msg = Update(device_id="bench", update_id="bench-1", base_version=1, arch_id=spec.arch_id,
                 tensors=tensors, num_samples=640, class_counts={0: 320, 1: 320}, loss=0.5, seconds_per_sample=0.001,
                 extras={"fisher_trace": FisherTrace(3.5)}, clock_levels={"cpu": 2})
    decoder = Decoder({spec.arch_id: tspec})
    writable = Decoder({spec.arch_id: tspec}, writable=True)
    frame = encode(msg)
    nbytes = len(frame)
    mb = nbytes / 1e6
    codec_s, copy_s, enc_s, dec_s, wdec_s = [], [], [], [], []
    for _ in range(5):  # interleave so that both see the same machine state
        codec_s += timings(lambda: decoder.decode(encode(msg)), repeat // 5)
        copy_s += timings(lambda: bytearray(frame), repeat // 5)
        enc_s += timings(lambda: encode(msg), repeat // 5)
        dec_s += timings(lambda: decoder.decode(frame), repeat // 5)
        wdec_s += timings(lambda: writable.decode(frame), repeat // 5)
    half = len(encode(msg, float16=True))
    f16_s = timings(lambda: decoder.decode(encode(msg, float16=True)), max(5, repeat // 10))
    codec_mbps, copy_mbps = mb / min(codec_s), mb / min(copy_s)
    return {
        "arch_id": spec.arch_id,
        "frame_bytes": nbytes,
        "frame_bytes_float16": half,
        "encode_decode_mb_per_s": round(codec_mbps, 1),
        "encode_decode_median_mb_per_s": round(mb / statistics.median(codec_s), 1),
        "memory_copy_mb_per_s": round(copy_mbps, 1),
        "memory_copy_median_mb_per_s": round(mb / statistics.median(copy_s), 1),
        "ratio": round(codec_mbps / copy_mbps, 3),
        "encode_mb_per_s": round(mb / min(enc_s), 1),
        "decode_mb_per_s": round(mb / min(dec_s), 1),
        "decode_writable_mb_per_s": round(mb / min(wdec_s), 1),
        "encode_decode_float16_mb_per_s": round(mb / min(f16_s), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200, help="timed calls per measurement (default 200)")
    args = parser.parse_args()
    small = bench_model(ModelSpec(), args.repeat)
    large = bench_model(ModelSpec(name="lstm", in_channels=900), args.repeat)
    result = {
        "benchmark": "codec",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "method": "best of N perf_counter timings; memory copy = bytearray(frame); ratio = codec / copy",
        "models": {"lstm_default": small, "lstm_2mb": large},
        "goal": {"model": "lstm_2mb", "min_ratio": GOAL_RATIO, "ratio": large["ratio"],
                 "pass": large["ratio"] >= GOAL_RATIO},
    }
    print(json.dumps(result, indent=2))
    return 0 if result["goal"]["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
