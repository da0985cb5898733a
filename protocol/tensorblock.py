"""The safetensors tensor block of a frame: its header written and parsed with every offset checked.

Written here rather than through ``safetensors.numpy``: the library copies a 2 MB model three times
on encode and twice on decode, and the codec's goal (``bench/bench_codec.py``) is encode+decode at
0.3x a plain memory copy. The layout is byte-compatible with the library, which the tests check in
both directions: 8-byte little-endian header size, JSON ``{name: {dtype, shape, data_offsets}}``
padded to 8 bytes, then the tensor bytes, contiguous.
"""
import json
import struct
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from streamfl.errors import ProtocolError

ST_LEN = struct.Struct("<Q")
F32, F16 = np.dtype("<f4"), np.dtype("<f2")
#: int8 codes of blockwise-quantized tensors (``streamfl.protocol.quantize``).
I8 = np.dtype("i1")
_ST_NAMES = {F32: "F32", F16: "F16", I8: "I8"}
_ST_DTYPES = {"F32": F32, "F16": F16, "I8": I8}
_BLOCK_ENCODER = json.JSONEncoder(separators=(",", ":"))
#: Element counts are capped here while multiplying a shape (safetensors' own u64 limit): linear
#: time on a shape of huge dims, and a capped size still fails ``parse_block``'s coverage check,
#: since no block holds 2**64 bytes.
MAX_ELEMENTS = 2 ** 64


def pad8(data: bytes, already: int = 0) -> bytes:
    """Pad JSON text with spaces so that ``already + len`` is a multiple of 8 (aligned tensors)."""
    return data + b" " * (-(already + len(data)) % 8)


def block_header(layout: Sequence[Tuple[str, np.dtype, Tuple[int, ...]]],
                 metadata: Optional[Mapping[str, str]] = None) -> bytes:
    """The safetensors header (length + padded JSON) for tensors laid out back to back, with
    safetensors' string-to-string ``__metadata__`` when given (quantized frames' block size)."""
    st_header: Dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, dtype, shape in layout:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        st_header[name] = {"dtype": _ST_NAMES[dtype], "shape": shape,
                           "data_offsets": (offset, offset + nbytes)}
        offset += nbytes
    st_json = pad8(_BLOCK_ENCODER.encode(st_header).encode("utf-8"))
    return ST_LEN.pack(len(st_json)) + st_json


#: One tensor of a block: (name, dtype, shape, begin offset, end offset).
Entry = Tuple[str, np.dtype, Tuple[int, ...], int, int]


def _entry(name: str, info: Any) -> Entry:
    """Validate one safetensors header entry: known keys, int shape and offsets, size matches."""
    try:
        dtype_name, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        bad = len(info) != 3 or not isinstance(shape, list) or type(begin) is not int \
            or type(end) is not int or begin < 0
        size = 1
        for dim in shape:  # stop at the first bad dim: "x" * 10**9 would allocate by a claimed size
            if type(dim) is not int or dim < 0:
                bad = True
                break
            size = min(size * dim, MAX_ELEMENTS)
    except (TypeError, KeyError, ValueError):
        bad = True
    if bad:
        raise ProtocolError("malformed", "tensor %r: bad safetensors entry" % name)
    dtype = _ST_DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
    if dtype is None:
        raise ProtocolError("schema", "tensor %r: dtype %r is not F32, F16 or I8" % (name, dtype_name))
    if end - begin != size * dtype.itemsize:
        raise ProtocolError("malformed", "tensor %r: size does not match its shape" % name)
    return name, dtype, tuple(shape), begin, end


def parse_block(st_header: Any, data_len: int) -> List[Entry]:
    """The entries of a parsed safetensors block header, sorted by offset, covering ``data_len``."""
    if not isinstance(st_header, dict):
        raise ProtocolError("malformed", "tensor block header is not an object")
    entries = sorted((_entry(name, info) for name, info in st_header.items() if name != "__metadata__"),
                     key=lambda e: e[3])
    expected = 0
    for name, _, _, begin, end in entries:
        if begin != expected:
            raise ProtocolError("malformed", "tensor %r: data not contiguous" % name)
        expected = end
    if expected != data_len:
        raise ProtocolError("malformed", "tensor data is %d bytes, header says %d" % (data_len, expected))
    return entries
