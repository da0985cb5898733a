"""What decides which windows a full buffer keeps: one ``ReplacementPolicy`` per buffer.

The buffer calls ``admit`` for every labelled, well-formed window and, only when it is full,
``victim`` for the slot the admitted window overwrites (until then windows fill slots in order).
A policy sees the buffer (its ``counts`` per class, ``size``, ``capacity``, ``y``, ``oldest_slot``)
and must not change it. SFedPO's distribution-guided sampling (sfedpo.txt eq. 10) is an admission
rule of this kind.
"""
import abc
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # pragma: no cover
    from streamfl.agent.buffer import Buffer


class ReplacementPolicy(abc.ABC):
    """Admission of a new window, and the slot it takes in a full buffer."""

    #: The registry name (``buffer_policy`` in the agent YAML).
    name: ClassVar[str] = ""

    def admit(self, label: int, buffer: "Buffer") -> bool:
        """True to store the window; the default admits every labelled window."""
        return True

    @abc.abstractmethod
    def victim(self, label: int, buffer: "Buffer") -> int:
        """Slot index in ``[0, capacity)`` to overwrite in a full buffer."""
