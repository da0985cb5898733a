"""Latent-state sources by name (``states`` in the ``sfedpo`` agent plug-in's settings).

``given`` (the window's own state, else inferred), ``inferred`` (always inferred on the device),
``single`` (one state: the null source). ``tests/test_state_sources.py`` runs one contract over all.
"""
from typing import Dict, Type

from streamfl.methods.sfedpo.latent.base import StateSource
from streamfl.methods.sfedpo.latent.given import GivenStates
from streamfl.methods.sfedpo.latent.inferred import InferredStates
from streamfl.methods.sfedpo.latent.single import SingleState

SOURCES: Dict[str, Type[StateSource]] = {cls.name: cls for cls in (GivenStates, InferredStates, SingleState)}


def make_state_source(name: str, num_classes: int, **inference) -> StateSource:
    """The source called ``name``; ``inference`` are ``InferredStates``' settings (``given`` infers
    for windows that carry no state). ``ValueError`` naming the known ones otherwise."""
    if name == "given":
        return GivenStates(InferredStates(num_classes, **inference))
    if name == "inferred":
        return InferredStates(num_classes, **inference)
    if name == "single":
        return SingleState()
    raise ValueError("unknown state source %r (known: %s)" % (name, ", ".join(SOURCES)))


__all__ = ["SOURCES", "StateSource", "GivenStates", "InferredStates", "SingleState", "make_state_source"]
