"""Min/max limit writes in an order every kernel accepts, and frequency-list parsing.

Kernels before 5.4 (JetPack 4's 4.9) refuse a ``scaling_max_freq`` below the current minimum and
a minimum above the current maximum with EINVAL, and pre-QoS devfreq does the same for
``min_freq``/``max_freq``. Newer kernels accept any order.
The order below is valid on both.
"""
from typing import Tuple

from streamfl.dvfs.base import DvfsError, SysfsIO


def read_int(io: SysfsIO, rel_path: str) -> int:
    """An integer attribute; ``DvfsError`` if the content is not one (``<unknown>``, garbage)."""
    text = io.read(rel_path).strip()
    try:
        return int(text)
    except ValueError:
        raise DvfsError("%s holds %r, not an integer" % (rel_path, text)) from None


def parse_levels(text: str, divisor: int = 1) -> Tuple[int, ...]:
    """Sorted distinct frequencies from a space-separated list (trailing space allowed), divided
    by ``divisor`` (1000 turns devfreq Hz into kHz)."""
    try:
        values = {int(tok) // divisor for tok in text.split()}
    except ValueError:
        raise DvfsError("frequency list %r is not a list of integers" % text) from None
    return tuple(sorted(values))


def write_limits(io: SysfsIO, min_path: str, max_path: str, new_min: int, new_max: int) -> None:
    """Set both limits: min first unless the new min lies above the current max.

    Lowering (new min <= current max): min then max, each valid against the other's old or new
    value. Raising past the current max: max first, then min.
    """
    if new_min > new_max:
        raise DvfsError("refusing limits min %d > max %d for %s" % (new_min, new_max, max_path))
    try:
        current_max = read_int(io, max_path)
    except DvfsError:
        # Unreadable cap (a file half-written when a process was killed: never on a real sysfs,
        # whose writes are atomic, but a restore must still get through): max, min, then max
        # again is valid in either order; the first max may be refused below the current min.
        try:
            io.write(max_path, str(new_max))
        except DvfsError:
            pass
        io.write(min_path, str(new_min))
        io.write(max_path, str(new_max))
        return
    if new_min > current_max:
        io.write(max_path, str(new_max))
        io.write(min_path, str(new_min))
    else:
        io.write(min_path, str(new_min))
        io.write(max_path, str(new_max))


def lower_min_then_cap(io: SysfsIO, min_path: str, max_path: str, cap: int, floor: int) -> None:
    """Cap at ``cap``; if the current minimum is above it, drop the minimum to ``floor`` first."""
    if read_int(io, min_path) > cap:
        io.write(min_path, str(floor))
    io.write(max_path, str(cap))
