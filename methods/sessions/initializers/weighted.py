"""``session-init``: the saved models weighted by gradient similarity (session paper, Algorithm 1).

``w_init = sum_i c_i w_i`` over the saved sessions that have a gradient from the pilot (those after
the pilot sessions), ``c = softmax(-kappa * d_i)`` with ``d_i = ||g_i - g_s||`` (eqs. 18-19).

The paper tunes kappa per dataset ("must be set to an appropriate order of magnitude", 10 to 800),
because ``d_i`` scales with the model, the learning rate and the local steps. Choice here
(``distance: relative``, the default): ``d_i`` is divided by ``||g_s||``, so one kappa (10: a
session twice as far as another, at half the gradient's length apart, weighs e^-5 as much) serves
every model and rate. ``distance: absolute`` is the paper's form. With no saved gradient yet (the
first session after the pilot) it builds nothing and the fleet goes on from its model, as the
paper's Algorithm 1 does.
"""
from typing import Dict, Optional, Sequence

import numpy as np

from streamfl.methods.sessions.initializers.base import SessionInit
from streamfl.methods.sessions.initializers.library import SavedSession, distance, norm, weighted_model
from streamfl.protocol.messages import Tensors

#: ``distance`` values.
DISTANCES = ("relative", "absolute")


def similarity_weights(distances: Sequence[float], kappa: float) -> np.ndarray:
    """``softmax(-kappa * d)``, computed stably (the smallest distance gets exp(0))."""
    d = np.asarray(distances, dtype=np.float64)
    logits = -kappa * (d - d.min())
    w = np.exp(logits)
    return w / w.sum()


class GradientWeightedInit(SessionInit):
    """Algorithm 1's initial model; ``kappa`` >= 0 (0: the plain mean of the candidates)."""

    name = "session-init"
    needs_gradient = True

    def __init__(self, kappa: float = 10.0, distance: str = "relative"):
        if not kappa >= 0.0 or not np.isfinite(kappa):
            raise ValueError("kappa must be finite and >= 0, got %r" % (kappa,))
        if distance not in DISTANCES:
            raise ValueError("distance must be one of %s, got %r" % (", ".join(DISTANCES), distance))
        self.kappa = float(kappa)
        self.distance = distance
        self.last_weights: Dict[int, float] = {}

    def build(self, saved: Sequence[SavedSession], gradient: Optional[Tensors]) -> Optional[Tensors]:
        candidates = [s for s in saved if s.gradient is not None]
        self.last_weights = {}
        if gradient is None or not candidates:
            return None
        scale = max(norm(gradient), 1e-12) if self.distance == "relative" else 1.0
        d = [distance(s.gradient, gradient) / scale for s in candidates]
        c = similarity_weights(d, self.kappa)
        self.last_weights = {s.session: round(float(w), 6) for s, w in zip(candidates, c)}
        return weighted_model([s.model for s in candidates], [float(w) for w in c])
