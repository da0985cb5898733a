"""Benchmark what predicting costs the board: milliseconds per window (p50, p99), the RSS the model
and its predictor add, and the share of one CPU core at 1 and at 10 windows a second, per model
family (lstm, cnn1d, mlp at the agent's default sizes: window 50 x 6 channels, 6 classes, hidden
128) with one torch thread, as the agent runs (``torch_threads: 1``); prints JSON.

Goal: the default model (lstm) predicting 1 window a second takes under 1% of a core.

Each family runs in a fresh child process, so its RSS figures are its own: ``before_torch`` is read from
/proc/self/statm before torch is imported, ``after_warmup`` after the model and its predictor are
built and have predicted ``--warmup`` windows. Milliseconds per window: ``--windows`` single-window
predictions after the warm-up, each timed alone. CPU share: windows offered at a steady rate for
``--rate-seconds``; process CPU time (``time.process_time``, every thread: the predictor's and the
feeding loop's, which only sleeps and hands over a pre-made window) over wall time, as a fraction
of one core.

Path ``predictor`` (the default where the agent has ``streamfl.agent.predictor``): the agent's real
``Predictor``, its thread, bounded queue, token bucket, softmax, top-k and each prediction's JSON
line, handed to one publish callback that only counts it (the MQTT publish itself and the socket
are left out: ``socket=None``); ``max_per_s`` is raised to its maximum so every offered window is
predicted (the default 5 would skip half of 10 a second). Its milliseconds per window run from
``offer`` to the line reaching the publish callback, one window at a time (each waits for the
previous to be handled): the thread hand-over is in them. Path ``forward`` (``--path forward``,
and the fallback where there is no predictor module) is the per-window work done inline: tensor
from the window, forward in ``torch.inference_mode()``, softmax, argmax and a JSON encoding, timed
in the calling thread.

Boards: no shipped board profile (configs/boards/*.yaml) carries a compute speed. The one speed
field is ``measured.domains.<d>.seconds_per_sample``, written by ``streamfl-agent dvfs probe`` on a
board (training time, not inference) and absent from every shipped file. So the estimate scales
this machine's figures by the board's relative clock, this machine's clock (``--host-mhz``, else
cpufreq ``cpuinfo_max_freq``, else the highest ``cpu MHz`` of /proc/cpuinfo) over
the board's top CPU level (its profile's highest ``levels_khz`` of a cpu domain), times
``--per-clock-slowdown`` (default 2.0, a judgment: 1 would be the same work per cycle; the
vector kernels alone would give up to 4 on a machine with AVX-512 against the boards' 128-bit
NEON, but one window per forward spends much of its time in torch's per-operator overhead, which
follows single-thread speed rather than vector width; one factor for every board, from Cortex-A57
to A78AE, is a simplification). A /proc/cpuinfo clock is the nominal one: a core that boosts above
it makes the slowdown larger than estimated. The clock-only figure (factor 1) is printed beside
it as the optimistic bound, and ``per_clock_slowdown_at_goal`` the factor at which the default
model's share at 1 window a second would reach the goal on that board. Everything runs on the board's CPU (the
agent predicts on its CPU model; Jetson GPUs are not used). Run this benchmark on the board for
the real figure.

Usage: python bench/bench_inference.py [--families lstm cnn1d mlp] [--path auto] [--windows 300]
           [--rate-seconds 12] [--per-clock-slowdown 2.0] [--host-mhz MHZ] [--quick]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time
from typing import Dict, List, Optional, Tuple

FAMILIES = ("lstm", "cnn1d", "mlp")
#: Share of one core the default model may take predicting 1 window a second.
GOAL_CPU_SHARE_AT_1_HZ = 0.01
GOAL_RATE_HZ = 1.0
#: Windows of random data the timed loops cycle through.
WINDOW_POOL = 64
MIB = 1024.0 * 1024.0
#: ``predict.max_per_s`` of the measured predictor: its maximum, so no offered window is skipped.
PREDICTOR_MAX_PER_S = 10000.0
#: The shipped profiles estimated (generic-linux has no clock of its own: it is this kind of machine).
BOARDS = ("raspberry-pi-4", "raspberry-pi-5", "jetson-nano", "jetson-xavier-nx", "jetson-orin-nano",
          "jetson-orin-nano-super", "jetson-agx-orin")


def rss_bytes() -> int:
    """This process's resident set now, from /proc/self/statm (pages x page size)."""
    with open("/proc/self/statm") as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


class ForwardPath:
    """The per-window work of a prediction done inline: forward, softmax, argmax, JSON encoding."""

    name = "forward"

    def __init__(self, model, torch_module):
        self.model = model
        self.torch = torch_module
        self.predictions = 0

    def make_window(self, x, t_s: float):
        """The array itself: nothing is wrapped."""
        return x

    def predict(self, x, t_s: float) -> None:
        """Predict one window ``x`` [T, C] recorded at ``t_s`` and encode the prediction."""
        torch = self.torch
        with torch.inference_mode():
            logits = self.model(torch.from_numpy(x).unsqueeze(0))
            probs = torch.softmax(logits, dim=1)[0]
            label = int(probs.argmax())
        json.dumps({"t_s": t_s, "label": label, "confidence": float(probs[label]),
                    "probs": [round(float(p), 4) for p in probs.tolist()]})
        self.predictions += 1

    def drain(self) -> None:
        """Nothing queued: the work is done by the time ``predict`` returns."""

    def counters(self) -> Dict[str, int]:
        """Windows predicted."""
        return {"predicted": self.predictions}

    def close(self) -> None:
        """Nothing to stop."""


class PredictorPath:
    """The agent's ``Predictor`` at work: offered windows go through its queue and thread to a
    publish callback that stamps when each line arrives."""

    name = "predictor"

    def __init__(self, spec, model, predictor_module):
        from streamfl.agent.predict_config import PredictConfig
        from streamfl.models import model_to_arrays

        #: perf_counter() when the newest prediction line reached the publish callback.
        self.published_at = 0.0
        self.lines = 0
        config = PredictConfig(enabled=True, max_per_s=PREDICTOR_MAX_PER_S, socket_path=None)
        self.predictor = predictor_module.Predictor(config, spec, "bench", publish=[self._published])
        self.predictor.start()
        self.predictor.set_model(1, model_to_arrays(model), "global", run_id="bench")
        self.drain()
        self._window = predictor_module.Window
        self._unlabelled = predictor_module.UNLABELLED

    def _published(self, line: bytes) -> None:
        self.published_at = time.perf_counter()
        self.lines += 1

    def make_window(self, x, t_s: float):
        """The ``Window`` the sensor would hand over (made before the clock starts)."""
        return self._window(x, self._unlabelled, t_s)

    def predict(self, window, t_s: float) -> None:
        """Offer one window; the prediction thread does the rest."""
        self.predictor.offer(window, t_s)

    def drain(self) -> None:
        """Wait until every offered window was handled (``RuntimeError`` after 30 s)."""
        if not self.predictor.wait_idle(30.0):
            raise RuntimeError("the predictor did not handle its windows within 30 s")

    def counters(self) -> Dict[str, int]:
        """The predictor's own counters (offered, predicted, skipped_rate, dropped, ...)."""
        return {k: v for k, v in self.predictor.stats().items() if isinstance(v, int)}

    def close(self) -> None:
        """Stop the prediction thread."""
        self.predictor.stop()


def make_path(choice: str, spec, model, torch_module):
    """``predictor`` if asked for or (``auto``) if the agent has one, else ``forward``."""
    if choice in ("auto", "predictor"):
        try:
            import streamfl.agent.predictor as predictor_module
        except ModuleNotFoundError as exc:
            if choice == "predictor" or exc.name != "streamfl.agent.predictor":
                raise
        else:
            return PredictorPath(spec, model, predictor_module)
    return ForwardPath(model, torch_module)


def percentile(values: List[float], q: float) -> float:
    """The ``q``-th percentile (linear interpolation, as numpy's default)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def paced_share(path, windows, rate_hz: float, seconds: float) -> Dict[str, float]:
    """Offer windows at ``rate_hz`` for ``seconds``; process CPU time over wall time (one core = 1)."""
    period_s = 1.0 / rate_hz
    n = max(1, int(round(seconds * rate_hz)))
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for i in range(n):
        due = wall0 + i * period_s
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        path.predict(windows[i % len(windows)], due - wall0)
    path.drain()
    end = wall0 + n * period_s
    delay = end - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
    wall_s = time.perf_counter() - wall0
    cpu_s = time.process_time() - cpu0
    return {"rate_hz": rate_hz, "windows": n, "wall_s": round(wall_s, 3),
            "cpu_s": round(cpu_s, 6), "share": cpu_s / wall_s}


def measure_family(family: str, args) -> dict:
    """Every figure of one family, in this (fresh) process; torch is imported here, after ``before``."""
    rss_before = rss_bytes()
    import numpy as np
    import torch
    from streamfl.models import ModelSpec, build_model

    torch.set_num_threads(1)
    default_spec = ModelSpec()
    spec = ModelSpec(name=family)
    rss_import = rss_bytes()
    model = build_model(spec)
    model.eval()
    path = make_path(args.path, spec, model, torch)
    rng = np.random.default_rng(0)
    windows = [path.make_window(rng.standard_normal((spec.window_len, spec.in_channels))
                                .astype(np.float32), float(i)) for i in range(WINDOW_POOL)]
    for i in range(args.warmup):
        path.predict(windows[i % WINDOW_POOL], 0.0)
        path.drain()
    rss_warm = rss_bytes()

    times_ms = []
    for i in range(args.windows):
        t0 = time.perf_counter()
        path.predict(windows[i % WINDOW_POOL], float(i))
        path.drain()
        done = path.published_at if isinstance(path, PredictorPath) else time.perf_counter()
        times_ms.append((done - t0) * 1e3)
    shares = {}
    for rate in args.rates:
        shares["%g" % rate] = paced_share(path, windows, rate, args.rate_seconds)
    counters = path.counters()
    path.close()
    return {
        "arch_id": spec.arch_id,
        "default": family == default_spec.name,
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "path": path.name,
        "ms_per_window": {"p50": percentile(times_ms, 50), "p99": percentile(times_ms, 99),
                          "mean": sum(times_ms) / len(times_ms), "windows": len(times_ms)},
        "rss_mib": {"before_torch": rss_before / MIB, "after_import": rss_import / MIB,
                    "after_warmup": rss_warm / MIB, "added": (rss_warm - rss_before) / MIB,
                    "added_by_model_and_predictor": (rss_warm - rss_import) / MIB},
        "cpu_share": shares,
        "counters": counters,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "window": [spec.window_len, spec.in_channels],
    }


def host_mhz(override: Optional[float]) -> Tuple[Optional[float], str]:
    """This machine's CPU clock in MHz and where it came from (None where nothing tells it)."""
    if override is not None:
        return float(override), "--host-mhz"
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq") as f:
            return int(f.read()) / 1000.0, "cpufreq cpuinfo_max_freq"
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/cpuinfo") as f:
            mhz = [float(line.split(":")[1]) for line in f if line.lower().startswith("cpu mhz")]
        if mhz:
            return max(mhz), "/proc/cpuinfo cpu MHz (current clock)"
    except (OSError, ValueError, IndexError):
        pass
    return None, "unknown"


def cpu_model_name() -> str:
    """The CPU's model name from /proc/cpuinfo ("unknown" where absent)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def board_estimates(families: Dict[str, dict], mhz: Optional[float], per_clock_slowdown: float,
                    default_family: Optional[str]) -> dict:
    """Per shipped board: the figures here scaled by its relative clock and the per-clock factor."""
    from streamfl.dvfs.profiles import load_profile

    out = {}
    for name in BOARDS:
        profile = load_profile(name)
        tops = [d.levels_khz[-1] for d in profile.domains if d.kind == "cpu" and d.levels_khz]
        if not tops or mhz is None:
            out[name] = {"estimate": None,
                         "why_not": "no CPU clock for this machine" if tops else "no CPU levels"}
            continue
        top_mhz = max(tops) / 1000.0
        clock_only = mhz / top_mhz
        slowdown = clock_only * per_clock_slowdown
        per_family = {}
        for fam, fig in families.items():
            shares = {rate: s["share"] * slowdown for rate, s in fig["cpu_share"].items()}
            per_family[fam] = {
                "ms_p50": fig["ms_per_window"]["p50"] * slowdown,
                "ms_p99": fig["ms_per_window"]["p99"] * slowdown,
                "cpu_share": shares,
                "cpu_share_clock_only": {rate: s["share"] * clock_only
                                         for rate, s in fig["cpu_share"].items()},
            }
        entry = {"top_cpu_mhz": top_mhz, "slowdown": slowdown, "slowdown_clock_only": clock_only,
                 "families": per_family}
        rate = "%g" % GOAL_RATE_HZ
        if default_family in per_family and rate in per_family[default_family]["cpu_share"]:
            entry["goal_met_estimate"] = (per_family[default_family]["cpu_share"][rate]
                                          < GOAL_CPU_SHARE_AT_1_HZ)
            #: The per-clock factor at which the default model would just reach the goal here.
            entry["per_clock_slowdown_at_goal"] = GOAL_CPU_SHARE_AT_1_HZ / (
                families[default_family]["cpu_share"][rate]["share"] * clock_only)
        out[name] = entry
    return out


def run_child(family: str, args) -> dict:
    """One family measured in a fresh interpreter (its RSS untouched by other families)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", family,
           "--path", args.path, "--windows", str(args.windows), "--warmup", str(args.warmup),
           "--rate-seconds", repr(args.rate_seconds), "--rates"] + [repr(r) for r in args.rates]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, check=False, universal_newlines=True)
    if proc.returncode != 0:
        raise RuntimeError("measuring %s failed (exit %d)" % (family, proc.returncode))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def positive(text: str) -> float:
    """argparse type: a finite number above zero."""
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError("must be a finite number above zero, got %r" % text)
    return value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=None,
                        help="model families (default: all three; --quick: lstm)")
    parser.add_argument("--path", choices=("auto", "predictor", "forward"), default="auto",
                        help="through the agent's Predictor, or the forward pass inline "
                             "(auto: the predictor where the agent has one)")
    parser.add_argument("--windows", type=int, default=300, help="timed single-window predictions")
    parser.add_argument("--warmup", type=int, default=50, help="untimed predictions first")
    parser.add_argument("--rate-seconds", type=positive, default=12.0,
                        help="seconds at each rate of the CPU-share measurement")
    parser.add_argument("--rates", type=positive, nargs="+", default=[1.0, 10.0],
                        help="windows a second of the CPU-share measurement")
    parser.add_argument("--per-clock-slowdown", type=positive, default=2.0,
                        help="how much slower a board's core is than this one at the same clock")
    parser.add_argument("--host-mhz", type=positive, default=None,
                        help="this machine's CPU clock (default: read from cpufreq or /proc/cpuinfo)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: one family, few windows, half a second per rate")
    parser.add_argument("--child", choices=FAMILIES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.windows, args.warmup, args.rate_seconds = 20, 5, 0.5
        args.families = args.families or ["lstm"]
    if args.windows < 1 or args.warmup < 0:
        parser.error("--windows must be at least 1 and --warmup at least 0")
    if args.child:
        print(json.dumps(measure_family(args.child, args)))
        return 0

    families = {fam: run_child(fam, args) for fam in (args.families or FAMILIES)}
    default = next((fam for fam, fig in families.items() if fig["default"]), None)
    mhz, mhz_source = host_mhz(args.host_mhz)
    goal = {"model": default, "rate_hz": GOAL_RATE_HZ, "cpu_share_below": GOAL_CPU_SHARE_AT_1_HZ}
    if default is not None and "%g" % GOAL_RATE_HZ in families[default]["cpu_share"]:
        goal["share_here"] = families[default]["cpu_share"]["%g" % GOAL_RATE_HZ]["share"]
        goal["met_here"] = goal["share_here"] < GOAL_CPU_SHARE_AT_1_HZ
    boards = board_estimates(families, mhz, args.per_clock_slowdown, default)
    if "goal_met_estimate" in boards.get("raspberry-pi-4", {}):
        goal["met_on_raspberry_pi_4_estimate"] = boards["raspberry-pi-4"]["goal_met_estimate"]
    print(json.dumps({
        "benchmark": "inference",
        "path": next(iter(families.values()))["path"],
        "host": {"cpu": cpu_model_name(), "mhz": mhz, "mhz_source": mhz_source,
                 "torch_threads": 1},
        "goal": goal,
        "families": families,
        "boards": {
            "assumption": ("no shipped board profile has a compute speed (only a 'dvfs probe' "
                           "profile's measured training seconds_per_sample); each figure here is "
                           "scaled by (this CPU's MHz / the board's top CPU level) x "
                           "per_clock_slowdown, CPU only; clock-only is the optimistic bound"),
            "per_clock_slowdown": args.per_clock_slowdown,
            "estimates": boards,
        },
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
