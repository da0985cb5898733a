"""FIFO: the stream's most recent ``capacity`` windows (the default; the buffer has a fast path)."""
from streamfl.agent.buffer_policies.base import BufferView, ReplacementPolicy


class FifoPolicy(ReplacementPolicy):
    """Admit everything, overwrite the oldest window."""

    name = "fifo"

    def __init__(self, seed: int = 0):
        del seed  # deterministic; the argument keeps every policy buildable the same way

    def victim(self, label: int, buffer: BufferView) -> int:
        return buffer.oldest_slot
