"""What a training round draws of each clock domain's power (utilization), and the board power
per level that follows: the simulator's energy model and the ``clp-aware`` energy options read it.

Split from ``profiles`` (modules stay under ~400 lines); the profile classes stay there.
"""
from typing import Dict, Mapping, Optional, Tuple

from streamfl.dvfs.profiles import BoardProfile, MeasuredPowerModel


def training_utilization(profile: BoardProfile, gpu: float = 1.0,
                         cpu_with_gpu: Optional[float] = None,
                         cpu_without_gpu: float = 1.0) -> Dict[str, float]:
    """Domain name -> the share of its full-load watts a training round draws.

    The profiles' per-level watts are whole-domain, full-load figures (every core of a cluster
    busy; see the board YAMLs), and billing every domain at them charges a GPU-bound round for
    CPUs it leaves idle, so a lower GPU clock that stretches the round seemed to cost more. The
    shares chosen here (a modeling choice, no paper fixes it):

    - Board with a GPU: the GPU at ``gpu`` (1.0: the round is GPU-bound) and each CPU domain at
      ``cpu_with_gpu``; None means one core of that cluster, ``1/cores``. About one core feeds the
      GPU (the Python training loop launching kernels) [U: not measured on these boards]. Charged
      per cluster, a board with several clusters pays one core in each (Orin Nano two, Xavier NX
      and AGX Orin three), an upper bound that also covers each cluster's shared power (L2, clock
      tree) which one busy core keeps up; ``cpu_with_gpu = 1/(all cores)`` charges one core spread
      over the board instead.
    - CPU-only board: every CPU domain at ``cpu_without_gpu`` (1.0: PyTorch's intra-op threads use
      every core).
    - A CPU domain without ``cores`` (a discovered one) on a GPU board: 1.0, the full-load figure,
      since its share is unknown.
    - A measured power model (``dvfs probe``): 1.0 everywhere, since the probe measured the whole
      board while it trained and its watts already hold what training used.
    """
    if isinstance(profile.power_model, MeasuredPowerModel):
        return {d.name: 1.0 for d in profile.domains}
    has_gpu = any(d.kind == "gpu" for d in profile.domains)
    out = {}
    for dom in profile.domains:
        if dom.kind == "gpu":
            out[dom.name] = float(gpu)
        elif not has_gpu:
            out[dom.name] = float(cpu_without_gpu)
        elif cpu_with_gpu is not None:
            out[dom.name] = float(cpu_with_gpu)
        else:
            out[dom.name] = 1.0 / dom.cores if dom.cores else 1.0
    return out


def power_table(profile: BoardProfile,
                utilization: Mapping[str, float]) -> Dict[str, Tuple[float, ...]]:
    """Domain name -> board power while training with that domain at each of its levels and every
    other domain at its top: what the ``clp-aware`` policy's ``power_w`` option takes."""
    top = {d.name: len(d.levels_khz) - 1 for d in profile.domains}
    table = {}
    for dom in profile.domains:
        table[dom.name] = tuple(
            round(profile.utilized_w(dict(top, **{dom.name: i}), utilization), 4)
            for i in range(len(dom.levels_khz)))
    return table
