"""FIFO: the stream's most recent ``capacity`` windows (the default; the buffer has a fast path)."""
from typing import TYPE_CHECKING

from streamfl.agent.buffer_policies.base import ReplacementPolicy

if TYPE_CHECKING:  # pragma: no cover
    from streamfl.agent.buffer import Buffer


class FifoPolicy(ReplacementPolicy):
    """Admit everything, overwrite the oldest window."""

    name = "fifo"

    def __init__(self, seed: int = 0):
        del seed  # deterministic; the argument keeps every policy buildable the same way

    def victim(self, label: int, buffer: "Buffer") -> int:
        return buffer.oldest_slot
