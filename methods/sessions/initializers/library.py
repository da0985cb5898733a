"""The saved models of earlier sessions and the pilot model, bounded, for the state folder.

The session-init paper: after the first ``P`` sessions, ``w_pilot`` is the mean of their
final models; each later session keeps its final model and its gradient from the pilot ``g_s``,
at most ``H`` of them (the oldest go first). Every session's final model is kept here (a pilot
session's with no gradient), so the ``average`` baseline sees them too. The arrays go to the
state folder's ``plugins.safetensors`` through the plug-in's ``state_tensors`` (written atomically
by the coordinator's persister): disk use is bounded by ``(H + 1)`` models plus ``H`` gradients.
"""
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from streamfl.protocol.messages import Tensors


@dataclass(frozen=True)
class SavedSession:
    """One ended session: its number, final model and, after the pilot, its gradient ``g_s``."""

    session: int
    model: Tensors
    gradient: Optional[Tensors] = None


def mean_model(models: Sequence[Tensors]) -> Tensors:
    """The element-wise float32 mean of ``models`` (same tensor names and shapes)."""
    if not models:
        raise ValueError("mean_model needs at least one model")
    return weighted_model(models, [1.0 / len(models)] * len(models))


def weighted_model(models: Sequence[Tensors], weights: Sequence[float]) -> Tensors:
    """``sum_i weights[i] * models[i]`` in float32, into new arrays."""
    out: Tensors = {}
    for name, ref in models[0].items():
        acc = np.zeros(ref.shape, dtype=np.float32)
        for model, w in zip(models, weights):
            if w:
                acc += np.float32(w) * np.asarray(model[name], dtype=np.float32)
        out[name] = acc
    return out


def difference(a: Tensors, b: Tensors) -> Tensors:
    """``a - b`` per tensor, float32."""
    return {name: np.asarray(a[name], dtype=np.float32) - np.asarray(b[name], dtype=np.float32)
            for name in a}


def distance(a: Tensors, b: Tensors) -> float:
    """Euclidean distance between two models (all tensors as one vector)."""
    return float(np.sqrt(sum(float(np.sum(np.square(np.asarray(a[n], dtype=np.float64) - b[n])))
                             for n in a)))


def norm(a: Tensors) -> float:
    """Euclidean norm of a model's tensors as one vector."""
    return float(np.sqrt(sum(float(np.sum(np.square(np.asarray(x, dtype=np.float64)))) for x in a.values())))


class SessionLibrary:
    """Saved sessions (newest last, at most ``max_saved``) and the pilot, once ``pilot_sessions``
    sessions ended."""

    def __init__(self, pilot_sessions: int, max_saved: int):
        if pilot_sessions < 1 or max_saved < 1:
            raise ValueError("pilot_sessions and max_saved must be >= 1")
        self.pilot_sessions = int(pilot_sessions)
        self.max_saved = int(max_saved)
        self.saved: List[SavedSession] = []
        self.pilot: Optional[Tensors] = None
        #: Final models of the pilot sessions until the pilot is built from them.
        self._pilot_parts: List[Tensors] = []

    def end_session(self, session: int, model: Tensors, gradient: Optional[Tensors]) -> None:
        """Keep ``session``'s final model (and its gradient); build the pilot after the first P."""
        if self.pilot is None:
            self._pilot_parts.append(model)
            if len(self._pilot_parts) >= self.pilot_sessions:
                self.pilot = mean_model(self._pilot_parts)
                self._pilot_parts = []
        self.saved.append(SavedSession(session, model, gradient))
        del self.saved[:-self.max_saved]

    # ---- persistence --------------------------------------------------------------------------
    def state(self) -> Dict[str, object]:
        """JSON-able index of the arrays ``arrays()`` returns."""
        return {"saved": [[s.session, s.gradient is not None] for s in self.saved],
                "pilot": self.pilot is not None, "pilot_parts": len(self._pilot_parts)}

    def arrays(self) -> Dict[str, np.ndarray]:
        """Every kept array, keyed ``<what>/<index>/<tensor>`` (by reference: never changed)."""
        out: Dict[str, np.ndarray] = {}
        for i, s in enumerate(self.saved):
            out.update(prefixed("saved/%d/model" % i, s.model))
            if s.gradient is not None:
                out.update(prefixed("saved/%d/gradient" % i, s.gradient))
        if self.pilot is not None:
            out.update(prefixed("pilot", self.pilot))
        for i, part in enumerate(self._pilot_parts):
            out.update(prefixed("pilot_part/%d" % i, part))
        return out

    def load(self, index: Mapping[str, object], arrays: Mapping[str, np.ndarray],
             spec: Mapping[str, Tuple[int, ...]]) -> None:
        """Restore from ``state()`` and ``arrays()``; ``ValueError`` if they disagree with each
        other or with ``spec`` (tensor name -> shape), or hold a non-finite value."""
        saved = []
        for i, entry in enumerate(index.get("saved") or []):
            session, has_gradient = int(entry[0]), bool(entry[1])
            model = unprefixed(arrays, "saved/%d/model" % i, spec)
            gradient = unprefixed(arrays, "saved/%d/gradient" % i, spec) if has_gradient else None
            saved.append(SavedSession(session, model, gradient))
        pilot = unprefixed(arrays, "pilot", spec) if index.get("pilot") else None
        parts = [unprefixed(arrays, "pilot_part/%d" % i, spec)
                 for i in range(int(index.get("pilot_parts") or 0))]
        self.saved, self.pilot, self._pilot_parts = saved[-self.max_saved:], pilot, parts


def prefixed(prefix: str, tensors: Tensors) -> Dict[str, np.ndarray]:
    """``tensors`` keyed ``<prefix>/<name>`` (by reference), for one flat file of arrays."""
    return {"%s/%s" % (prefix, name): a for name, a in tensors.items()}


def unprefixed(arrays: Mapping[str, np.ndarray], prefix: str,
               spec: Mapping[str, Tuple[int, ...]]) -> Tensors:
    """What ``prefixed`` stored, as float32 of ``spec``'s names and shapes; ``ValueError`` if a
    tensor is missing, misshapen or not finite."""
    out: Tensors = {}
    for name, shape in spec.items():
        a = arrays.get("%s/%s" % (prefix, name))
        if a is None or tuple(a.shape) != tuple(shape):
            raise ValueError("saved session arrays: %s/%s is missing or misshapen" % (prefix, name))
        a = np.asarray(a, dtype=np.float32)
        if not np.isfinite(a).all():
            raise ValueError("saved session arrays: %s/%s holds a non-finite value" % (prefix, name))
        out[name] = a
    return out
