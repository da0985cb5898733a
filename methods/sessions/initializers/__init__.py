"""Sessions of a dynamic device set ("Session initialization for dynamic devices").

``membership.py`` says when a session ends (the online set changed by more than a fraction, or an
operator asked), ``library.py`` keeps the earlier sessions' models and the pilot, ``aux.py``
collects an auxiliary round, and ``base.py`` is the ``SessionInit`` ABC with one construction per
file. The ``sessions`` coordinator plug-in ties them together.
"""
from typing import Dict, Type

from streamfl.methods.sessions.initializers.average import AverageInit
from streamfl.methods.sessions.initializers.base import SessionInit
from streamfl.methods.sessions.initializers.previous import PreviousInit
from streamfl.methods.sessions.initializers.weighted import GradientWeightedInit

#: Constructions by their ``init`` name.
INITS: Dict[str, Type[SessionInit]] = {cls.name: cls for cls in (PreviousInit, AverageInit,
                                                                 GradientWeightedInit)}


def make_init(name: str, kappa: float = 10.0, distance: str = "relative") -> SessionInit:
    """The construction called ``name``; ``ValueError`` names the known ones."""
    if name not in INITS:
        raise ValueError("unknown session init %r (known: %s)" % (name, ", ".join(INITS)))
    if name == GradientWeightedInit.name:
        return GradientWeightedInit(kappa, distance)
    return INITS[name]()


__all__ = ["INITS", "make_init", "SessionInit", "PreviousInit", "AverageInit", "GradientWeightedInit"]
