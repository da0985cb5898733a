"""When each class appears: the temporal class schedules behind continual-learning scenarios.

A ``ClassSchedule`` maps stream time to the classes a device is doing right now; the synthetic
generator picks uniformly among them. ``Rotating`` gives AdaCLP's setting where "each device sees
one or two activities at a time" and devices start at different offsets; ``Sequence`` spells out
any schedule (e.g. new-class frames) as (duration, classes) segments.
"""
import abc
import math
import typing
from typing import List, Tuple

ClassIds = typing.Sequence[int]


class ClassSchedule(abc.ABC):
    """Classes active at stream time ``t_s`` (seconds from the stream's start, or virtual time)."""

    @abc.abstractmethod
    def active_classes(self, t_s: float) -> ClassIds:
        """A non-empty sequence of class ids active at ``t_s``."""


def _check_classes(classes, where: str) -> Tuple[int, ...]:
    out = tuple(int(c) for c in classes)
    if not out:
        raise ValueError("%s: need at least one class" % where)
    if min(out) < 0:
        raise ValueError("%s: class ids must be >= 0, got %r" % (where, out))
    return out


class AllClasses(ClassSchedule):
    """Every class all the time: the i.i.d. stream."""

    def __init__(self, num_classes: int):
        if num_classes < 1:
            raise ValueError("num_classes must be >= 1, got %r" % num_classes)
        self._classes = tuple(range(num_classes))

    def active_classes(self, t_s: float) -> ClassIds:
        return self._classes


class Rotating(ClassSchedule):
    """``classes_per_phase`` consecutive classes of ``order`` per ``phase_s``, moving on each phase.

    Phase k (``k = floor(t_s / phase_s)``) holds ``order[(offset + k * classes_per_phase + j) % K]``
    for ``j < classes_per_phase``, so after ``K / classes_per_phase`` phases every class was seen
    once. ``offset`` (positions in ``order``) lets each device start somewhere else.
    """

    def __init__(self, classes_per_phase: int, phase_s: float, order: ClassIds, offset: int = 0):
        self.order = _check_classes(order, "Rotating order")
        if not 1 <= classes_per_phase <= len(self.order):
            raise ValueError("classes_per_phase must be in 1..%d, got %r" % (
                len(self.order), classes_per_phase))
        if not phase_s > 0:
            raise ValueError("phase_s must be > 0, got %r" % (phase_s,))
        self.classes_per_phase = int(classes_per_phase)
        self.phase_s = float(phase_s)
        self.offset = int(offset)

    def phase(self, t_s: float) -> int:
        """Index of the phase holding ``t_s``."""
        return int(math.floor(t_s / self.phase_s))

    def active_classes(self, t_s: float) -> ClassIds:
        k = len(self.order)
        start = self.offset + self.phase(t_s) * self.classes_per_phase
        return tuple(self.order[(start + j) % k] for j in range(self.classes_per_phase))


class Sequence(ClassSchedule):
    """Explicit segments ``[(duration_s, classes), ...]``; loops at the end, or holds the last one."""

    def __init__(self, segments: typing.Sequence[Tuple[float, ClassIds]], loop: bool = True):
        parsed: List[Tuple[float, Tuple[int, ...]]] = []
        for i, seg in enumerate(segments):
            try:
                duration_s, classes = seg
            except (TypeError, ValueError):
                raise ValueError("Sequence segment %d must be (duration_s, classes), got %r" % (
                    i, seg)) from None
            if not float(duration_s) > 0:
                raise ValueError("Sequence segment %d: duration_s must be > 0, got %r" % (
                    i, duration_s))
            parsed.append((float(duration_s), _check_classes(classes, "Sequence segment %d" % i)))
        if not parsed:
            raise ValueError("Sequence needs at least one segment")
        self.segments = parsed
        self.loop = bool(loop)
        self.total_s = sum(d for d, _ in parsed)

    def active_classes(self, t_s: float) -> ClassIds:
        t_s = max(0.0, float(t_s))
        if self.loop:
            t_s = math.fmod(t_s, self.total_s)
        for duration_s, classes in self.segments:
            if t_s < duration_s:
                return classes
            t_s -= duration_s
        return self.segments[-1][1]
