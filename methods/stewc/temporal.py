"""ST-EWC's temporal sums on the coordinator (ST-EWC, eq. 8-9): P and Q.

The paper's device penalty ``(lambda1/2) sum_{i<t} (theta - theta*_i)^T F^i (theta - theta*_i)``
has the gradient ``lambda1 (P theta - Q)`` with ``P = sum_i F^i`` and ``Q = sum_i F^i * theta*_i``,
so however many periods pass the global model carries two tensors of the model's size.

At a period boundary a ``Consolidation`` opens: ``theta*_t`` is the global model that announces it
(devices compute their local T-FDM ``F_k^t`` at the model that carries the announcement, so both
sides use the same point), and each device's ``F_k^t`` is folded in with its sample count
``n_k,t``: ``F^t = sum_k n_k,t F_k^t / sum_k n_k,t`` (eq. 9). Guards the paper does not need (its
devices are honest and all answer): each device counts once per period; each ``F_k^t`` element is
clipped to ``max_fisher`` and each ``n_k,t`` to ``max_samples``, and at the fold a device's
``n_k,t`` counts for at most ``max_peer_multiple`` times the median of the other answers', and
so does its part of eq. 9's numerator, ``n_k,t`` times the total of its ``F_k^t`` (a forged report can stiffen the pull by a bounded share, never move its target:
``theta*_t`` is the coordinator's own model); a period is folded when
``quorum`` of the devices online at the boundary answered, or ``wait_s`` after it opened with at
least one answer, so a device that went away cannot hold the term back.
"""
import math
from dataclasses import dataclass, field
from typing import Any, Collection, Dict, Mapping, Optional, Set, Tuple

import numpy as np

from streamfl.coordinator.shares import peer_scales
from streamfl.protocol.messages import Tensors
from streamfl.methods.stewc.payloads import PeriodFisher


@dataclass
class Consolidation:
    """A period's T-FDM being collected: its anchor ``theta*_t`` and each device's answer so far."""

    period: int
    anchor: Tensors
    anchor_version: int
    started_s: float
    expected: Set[str]
    #: Each answering device's ``(n_k,t, F_k^t)``, clipped to the declared maxima.
    answers: Dict[str, Tuple[float, Tensors]] = field(default_factory=dict)

    @property
    def devices(self) -> Set[str]:
        return set(self.answers)

    @property
    def samples(self) -> float:
        return float(sum(n for n, _ in self.answers.values()))

    def meta(self) -> Dict[str, Any]:
        """JSON-able fields (the arrays go to ``arrays()``)."""
        return {"period": self.period, "anchor_version": self.anchor_version,
                "started_s": self.started_s, "expected": sorted(self.expected),
                "answers": {d: n for d, (n, _) in sorted(self.answers.items())}}


class TemporalSums:
    """P and Q over the consolidated periods, and the consolidation in progress (if any)."""

    def __init__(self, max_fisher: float = 1.0e4, max_samples: int = 100000,
                 max_peer_multiple: float = 4.0):
        self.max_fisher, self.max_samples = float(max_fisher), int(max_samples)
        self.max_peer_multiple = float(max_peer_multiple)
        self.P: Optional[Tensors] = None
        self.Q: Optional[Tensors] = None
        #: Periods folded into P and Q.
        self.folded = 0
        self.pending: Optional[Consolidation] = None

    def begin(self, period: int, anchor: Tensors, version: int, now: float,
              expected: Collection[str]) -> None:
        """Open period ``period``'s consolidation at ``anchor`` (replacing an open one)."""
        self.pending = Consolidation(int(period), {k: np.asarray(a, dtype=np.float32) for k, a in anchor.items()},
                                     int(version), float(now), set(expected))

    def add(self, device_id: str, fisher: PeriodFisher) -> bool:
        """Fold a device's local T-FDM in; False if none is open, it is another period's, the
        device already answered, or its tensors are not the model's."""
        c = self.pending
        if c is None or fisher.period != c.period or device_id in c.devices:
            return False
        if {k: a.shape for k, a in fisher.F.items()} != {k: a.shape for k, a in c.anchor.items()}:
            return False
        n = float(min(int(fisher.samples), self.max_samples))
        c.answers[device_id] = (n, {name: np.clip(np.asarray(f, dtype=np.float32), 0.0, self.max_fisher)
                                    for name, f in fisher.F.items()})
        return True

    def ready(self, now: float, online: Collection[str], quorum: float, wait_s: float) -> bool:
        """The open consolidation has enough answers to fold."""
        c = self.pending
        if c is None or not c.devices:
            return False
        present = [d for d in c.expected if d in set(online)] or list(c.expected)
        need = max(1, math.ceil(quorum * len(present) - 1e-9))
        return len(c.devices & set(present)) >= need or now - c.started_s >= wait_s

    def fold(self) -> Optional[Dict[str, Any]]:
        """Fold the open consolidation into P and Q (eq. 9); its summary, or None if it had no
        answer (then it is dropped). Each device's sample count, and its part of the numerator
        (sample count times the T-FDM's total), count for at most ``max_peer_multiple`` times the
        median of the other answers' (``streamfl.coordinator.shares``): one device holds at most
        m / (m + n - 1) of P among n similar answers."""
        c, self.pending = self.pending, None
        if c is None or not c.answers or c.samples <= 0:
            return None
        m = self.max_peer_multiple
        sample_scales = peer_scales({d: n for d, (n, _) in c.answers.items()}, m)
        weights = {d: n * sample_scales[d] for d, (n, _) in c.answers.items()}
        # What a device adds to eq. 9's numerator: its (capped) sample count times its T-FDM's
        # total. Capping that one product bounds its share of P at m / (m + n - 1).
        scales = peer_scales({d: weights[d] * float(sum(a.sum(dtype=np.float64) for a in f.values()))
                              for d, (_, f) in c.answers.items()}, m)
        total = sum(weights.values())
        fsum: Dict[str, np.ndarray] = {}
        for d, (_, f) in c.answers.items():
            factor = weights[d] * scales[d] / total
            for name, a in f.items():
                part = factor * a.astype(np.float64)
                fsum[name] = part if name not in fsum else fsum[name] + part
        P, Q = dict(self.P or {}), dict(self.Q or {})
        for name, s in fsum.items():
            f = s.astype(np.float32)
            P[name] = f if name not in P else P[name] + f
            fq = f * c.anchor[name]
            Q[name] = fq if name not in Q else Q[name] + fq
        self.P, self.Q = P, Q
        self.folded += 1
        capped = sorted(d for d in c.answers if weights[d] < c.answers[d][0] or scales[d] < 1.0)
        return {"period": c.period, "devices": len(c.answers), "samples": total,
                "anchor_version": c.anchor_version, "capped_devices": capped,
                "fisher_mean": float(np.mean(np.concatenate([a.ravel() for a in fsum.values()])))}

    # ---- persistence --------------------------------------------------------------------------
    def meta(self) -> Dict[str, Any]:
        return {"folded": self.folded, "pending": None if self.pending is None else self.pending.meta()}

    def arrays(self) -> Dict[str, np.ndarray]:
        """``P/name``, ``Q/name``, and the open consolidation's ``anchor/name`` and ``fsum/name``
        (by reference: every array here is replaced, never changed in place)."""
        out: Dict[str, np.ndarray] = {}
        for group, tensors in (("P", self.P), ("Q", self.Q)):
            out.update({"%s/%s" % (group, k): a for k, a in (tensors or {}).items()})
        if self.pending is not None:
            out.update({"anchor/%s" % k: a for k, a in self.pending.anchor.items()})
            for device_id, (_, f) in self.pending.answers.items():
                tag = device_id.encode("utf-8").hex()
                out.update({"answer/%s/%s" % (tag, k): a for k, a in f.items()})
        return out

    def load(self, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        """Restore ``meta()`` and ``arrays()``; ValueError (nothing changed) if any array is not
        finite, P or a T-FDM is negative, P and Q (or anchor and answers) do not pair up, or the
        open consolidation's arrays are missing. A consolidation saved as one running sum (``fsum``,
        before answers were kept per device) comes back as one answer."""
        groups: Dict[str, Dict[str, np.ndarray]] = {"P": {}, "Q": {}, "anchor": {}, "fsum": {}}
        answers: Dict[str, Dict[str, np.ndarray]] = {}
        for key, a in arrays.items():
            group, _, name = key.partition("/")
            device = None
            if group == "answer":
                tag, _, name = name.partition("/")
                try:
                    device = bytes.fromhex(tag).decode("utf-8")
                except ValueError:
                    raise ValueError("stewc: bad array key %r" % key) from None
            elif group not in groups:
                raise ValueError("stewc: bad array key %r" % key)
            if not name:
                raise ValueError("stewc: bad array key %r" % key)
            a = np.asarray(a)
            if not np.isfinite(a).all() or (group in ("P", "fsum", "answer") and (a < 0).any()):
                raise ValueError("stewc: saved %s is not finite%s" % (key, "" if group in ("Q", "anchor") else " and >= 0"))
            if device is not None:
                answers.setdefault(device, {})[name] = a.astype(np.float32)
            else:
                groups[group][name] = a.astype(np.float32 if group != "fsum" else np.float64)

        def shapes(g: Mapping[str, np.ndarray]) -> Dict[str, Any]:
            return {k: v.shape for k, v in g.items()}

        if shapes(groups["P"]) != shapes(groups["Q"]):
            raise ValueError("stewc: saved P and Q do not match")
        pending = meta.get("pending")
        c = None
        if pending is not None:
            parts = list(answers.values()) + ([groups["fsum"]] if groups["fsum"] else [])
            if not groups["anchor"] or any(not set(shapes(f)) <= set(shapes(groups["anchor"])) for f in parts):
                raise ValueError("stewc: the open consolidation's arrays are missing or torn")
            try:
                counts = {str(d): float(n) for d, n in dict(pending.get("answers") or {}).items()}
                if set(counts) != set(answers) or any(not (math.isfinite(n) and n >= 0) for n in counts.values()):
                    raise ValueError("answers and their arrays differ")
                c = Consolidation(int(pending["period"]), groups["anchor"], int(pending["anchor_version"]),
                                  float(pending["started_s"]), set(map(str, pending["expected"])),
                                  {d: (counts[d], answers[d]) for d in answers})
                if groups["fsum"]:
                    n = float(pending["samples"])
                    if not (math.isfinite(n) and n > 0):
                        raise ValueError("samples must be > 0")
                    c.answers["(saved sum)"] = (n, {k: (v / n).astype(np.float32) for k, v in groups["fsum"].items()})
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError("stewc: bad saved consolidation (%s)" % exc) from None
        self.P, self.Q = (groups["P"] or None), (groups["Q"] or None)
        self.folded = int(meta.get("folded", 0))
        self.pending = c
