"""The generic parameters of a ``train`` command, typed, so a reader needs no plug-in to use them.

A ``train`` command (``Command(kind="train", params=...)``) may carry, whichever coordinator
plug-in sent it: ``version``, the model version to train on, and ``bandwidth_hz``, the uplink
bandwidth granted for the round's upload (a scheduler's share of a shared band). A field that is
absent or malformed reads as None: the device trains on what it has, with its own bandwidth.
"""
import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional


@dataclass(frozen=True)
class TrainRequest:
    """What a ``train`` command asks beyond "train now"."""

    #: The model version to start from (None: any).
    version: Optional[int] = None
    #: The uplink bandwidth granted for this round's upload, finite and > 0 (None: the device's own).
    bandwidth_hz: Optional[float] = None

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> "TrainRequest":
        """The request in a ``train`` command's ``params``."""
        version = params.get("version")
        grant = params.get("bandwidth_hz")
        ok = isinstance(grant, (int, float)) and not isinstance(grant, bool) and 0 < grant < math.inf
        return cls(version=version if type(version) is int else None,
                   bandwidth_hz=float(grant) if ok else None)


__all__ = ["TrainRequest"]
