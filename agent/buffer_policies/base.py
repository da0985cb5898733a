"""What decides which windows a full buffer keeps: one ``ReplacementPolicy`` per buffer.

The buffer calls ``admit`` for every labelled, well-formed window and, only when it is full,
``victim`` for the slot the admitted window overwrites (until then windows fill slots in order).
``admit`` also gets the window's latent state where its source says one (``Window.state``), and
the window itself (a policy that scores windows by their content reads it; it must not keep it).
A policy reads the buffer through ``BufferView`` and must not change it. SFedPO's
distribution-guided sampling (SFedPO eq. 10) is an admission rule of this kind.
"""
import abc
from typing import ClassVar, List, Optional, Protocol

import numpy as np


class BufferView(Protocol):
    """What a policy may read of the buffer (``streamfl.agent.buffer.Buffer``)."""

    #: Windows held per class.
    counts: List[int]
    size: int
    capacity: int
    #: Windows by slot, ``[capacity, T, C]`` (valid in ``[0, size)``).
    X: np.ndarray
    #: Labels by slot (valid in ``[0, size)``).
    y: np.ndarray
    #: The next slot in ring order: the oldest window once the buffer is full.
    oldest_slot: int


class ReplacementPolicy(abc.ABC):
    """Admission of a new window, and the slot it takes in a full buffer."""

    #: The registry name (``buffer_policy`` in the agent YAML).
    name: ClassVar[str] = ""

    def admit(self, label: int, buffer: BufferView, state: int = -1,
              window: Optional[np.ndarray] = None) -> bool:
        """True to store ``window`` [T, C] (of latent ``state``, -1 if unknown); the default admits
        every labelled window."""
        return True

    @abc.abstractmethod
    def victim(self, label: int, buffer: BufferView) -> int:
        """Slot index in ``[0, capacity)`` to overwrite in a full buffer."""
