"""The wire codec: messages to frames and back, rejecting anything malformed before it reaches a core.

Frame = ``b"SFL"`` + 1 format byte + 4-byte big-endian header length + JSON header (UTF-8, padded
with spaces to 8 bytes) + a tensor block in the safetensors format. The header is
``{"type", "v", "body", "dtype"}``; ``body`` holds every non-tensor field of the message.

The safetensors block is written and read here rather than through ``safetensors.numpy``: the
library copies a 2 MB model three times on encode and twice on decode, and the codec's goal
(``bench/bench_codec.py``) is encode+decode at 0.3x a plain memory copy. The layout is
byte-compatible with the library, which the tests check in both directions: 8-byte little-endian
header size, JSON ``{name: {dtype, shape, data_offsets}}``, then the tensor bytes, contiguous. The
parser checks every offset; nothing is ever unpickled.

``GlobalModel.ewc`` values that are ``{name: ndarray}`` groups (ST-EWC's U, V, P, Q sums) travel in
the tensor block as ``ewc/<key>/<name>``, always float32 (Fisher values underflow in float16), and
are checked against the architecture like the model tensors.
"""
import json
import logging
import math
import struct
import threading
from collections import Counter
from dataclasses import fields
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from streamfl.errors import ProtocolError
from streamfl.protocol.messages import (
    MESSAGE_TYPES, PROTOCOL_VERSION, TYPE_NAMES, GlobalModel, Message, Update,
)
from streamfl.protocol.schema import check_body

log = logging.getLogger(__name__)

MAGIC = b"SFL"
#: Layout version of the frame itself (prefix + header + safetensors block); bump on change.
FORMAT_VERSION = 1
DEFAULT_MAX_FRAME_BYTES = 64 * 2 ** 20
#: ``{tensor name: (shape, dtype)}`` of one architecture, as ``streamfl.models.tensor_spec`` returns.
TensorSpec = Mapping[str, Tuple[Sequence[int], str]]
#: The ``ProtocolError.reason`` values ``Decoder`` raises and counts.
REASONS = ("malformed", "oversize", "unknown_type", "bad_version", "schema", "non_finite",
           "arch_mismatch")
EWC_PREFIX = "ewc/"

_PREFIX = struct.Struct(">3sBI")
_ST_LEN = struct.Struct("<Q")
_F32, _F16 = np.dtype("<f4"), np.dtype("<f2")
#: header "dtype" -> numpy dtype of the model tensors on the wire
WIRE_DTYPES = {"float32": _F32, "float16": _F16}
_ST_NAMES = {_F32: "F32", _F16: "F16"}
_ST_DTYPES = {"F32": _F32, "F16": _F16}
_TENSOR_TYPES = (GlobalModel, Update)
#: Block headers by tensor layout (encode) and parsed layouts by block header bytes (decode): a
#: fleet sends the same architecture over and over, so both sides parse its layout once.
_CACHE_SIZE = 64
_BLOCK_HEADERS: Dict[Tuple[Tuple[str, np.dtype, Tuple[int, ...]], ...], bytes] = {}
_FIELDS = {cls: tuple(f.name for f in fields(cls)) for cls in MESSAGE_TYPES.values()}


def _json_default(obj: Any) -> Any:
    """numpy scalars and small arrays in header fields become plain JSON numbers and lists."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError("%s is not JSON serializable" % type(obj).__name__)


_HEADER_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False, default=_json_default)
_BLOCK_ENCODER = json.JSONEncoder(separators=(",", ":"))


def _pad8(data: bytes, already: int = 0) -> bytes:
    """Pad JSON text with spaces so that ``already + len`` is a multiple of 8 (aligned tensors)."""
    return data + b" " * (-(already + len(data)) % 8)


def _wire_array(name: str, arr: Any, dtype: np.dtype) -> np.ndarray:
    """``arr`` as a C-contiguous little-endian array of ``dtype`` (no copy when it already is)."""
    if not name or "/" in name or name == "__metadata__":
        raise ProtocolError("schema", "invalid tensor name %r" % name)
    if dtype is _F32:
        return np.ascontiguousarray(arr, dtype=dtype)
    with np.errstate(over="ignore"):
        out = np.ascontiguousarray(arr, dtype=dtype)
    if not np.isfinite(out).all():
        raise ProtocolError("non_finite", "tensor %s is not finite in float16 (overflow?)" % name)
    return out


def _block_header(layout: Sequence[Tuple[str, np.dtype, Tuple[int, ...]]]) -> bytes:
    """The safetensors header (length + padded JSON) for tensors laid out back to back."""
    st_header = {}
    offset = 0
    for name, dtype, shape in layout:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        st_header[name] = {"dtype": _ST_NAMES[dtype], "shape": shape,
                           "data_offsets": (offset, offset + nbytes)}
        offset += nbytes
    st_json = _pad8(_BLOCK_ENCODER.encode(st_header).encode("utf-8"))
    return _ST_LEN.pack(len(st_json)) + st_json


def encode(msg: Message, float16: bool = False) -> bytes:
    """One frame for ``msg``; ``float16`` halves the model tensors on the wire (decoded as float32)."""
    cls = type(msg)
    type_name = TYPE_NAMES.get(cls)
    if type_name is None:
        raise ProtocolError("unknown_type", "cannot encode %s" % cls.__name__)
    wire_dtype = _F16 if float16 else _F32
    body: Dict[str, Any] = {}
    tensors: List[Tuple[str, np.ndarray]] = []
    for name in _FIELDS[cls]:
        value = getattr(msg, name)
        if name == "tensors":
            tensors = [(k, _wire_array(k, a, wire_dtype)) for k, a in value.items()]
        elif name == "class_counts":
            body[name] = {str(int(k)): v for k, v in value.items()}
        elif name == "ewc" and value:
            body[name] = ewc = {}
            for key, group in value.items():
                if isinstance(group, Mapping) and group and all(
                        isinstance(a, np.ndarray) for a in group.values()):
                    if not key or "/" in key:
                        raise ProtocolError("schema", "invalid ewc key %r" % key)
                    tensors.extend((EWC_PREFIX + key + "/" + k, _wire_array(k, a, _F32))
                                   for k, a in group.items())
                else:
                    ewc[key] = group
        else:
            body[name] = value
    header = {"type": type_name, "v": PROTOCOL_VERSION, "body": body,
              "dtype": "float16" if float16 else "float32"}
    try:
        header_bytes = _pad8(_HEADER_ENCODER.encode(header).encode("utf-8"), _PREFIX.size)
    except ValueError as exc:  # NaN or Inf in a header float
        raise ProtocolError("non_finite", "%s header: %s" % (type_name, exc)) from exc
    except TypeError as exc:
        raise ProtocolError("schema", "%s header: %s" % (type_name, exc)) from exc
    layout = tuple((name, arr.dtype, arr.shape) for name, arr in tensors)
    st_json = _BLOCK_HEADERS.get(layout)
    if st_json is None:
        st_json = _block_header(layout)
        if len(_BLOCK_HEADERS) >= _CACHE_SIZE:
            _BLOCK_HEADERS.clear()
        _BLOCK_HEADERS[layout] = st_json
    parts: List[Any] = [_PREFIX.pack(MAGIC, FORMAT_VERSION, len(header_bytes)), header_bytes, st_json]
    parts.extend(arr for _, arr in tensors)
    return b"".join(parts)


class _NonFinite(ValueError):
    """A NaN, Infinity or overflowing number spelled in JSON text."""


def _reject_constant(text: str) -> Any:
    raise _NonFinite(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NonFinite(text)
    return value


_HEADER_DECODER = json.JSONDecoder(parse_float=_parse_float, parse_constant=_reject_constant)
_BLOCK_DECODER = json.JSONDecoder()


def _loads(raw: bytes, decoder: json.JSONDecoder, what: str) -> Any:
    """Strict JSON from UTF-8 bytes; NaN/Infinity/overflowing floats raise ``non_finite``."""
    try:
        return decoder.decode(raw.decode("utf-8"))
    except _NonFinite as exc:
        raise ProtocolError("non_finite", "%s has non-finite number %s" % (what, exc)) from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ProtocolError("malformed", "%s: %s" % (what, exc)) from None


#: One tensor of a block: (name, dtype, shape, begin offset, end offset).
_Entry = Tuple[str, np.dtype, Tuple[int, ...], int, int]


def _entry(name: str, info: Any) -> _Entry:
    """Validate one safetensors header entry: known keys, int shape and offsets, size matches."""
    try:
        dtype_name, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        bad = len(info) != 3 or not isinstance(shape, list) or type(begin) is not int \
            or type(end) is not int or begin < 0
        size = 1
        for dim in shape:
            bad = bad or type(dim) is not int or dim < 0
            size *= dim
    except (TypeError, KeyError, ValueError):
        bad = True
    if bad:
        raise ProtocolError("malformed", "tensor %r: bad safetensors entry" % name)
    dtype = _ST_DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
    if dtype is None:
        raise ProtocolError("schema", "tensor %r: dtype %r is not F32 or F16" % (name, dtype_name))
    if end - begin != size * dtype.itemsize:
        raise ProtocolError("malformed", "tensor %r: size does not match its shape" % name)
    return name, dtype, tuple(shape), begin, end


def _parse_block(st_json: bytes, data_len: int) -> List[_Entry]:
    """The entries of a safetensors block header, sorted by offset, covering ``data_len`` bytes."""
    st_header = _loads(st_json, _BLOCK_DECODER, "tensor block header")
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


def _all_finite(arr: np.ndarray) -> bool:
    """True if no NaN/Inf: one BLAS pass (a.a is finite iff every a is, unless it overflows)."""
    flat = arr.reshape(-1)
    with np.errstate(all="ignore"):
        if math.isfinite(float(np.dot(flat, flat))):
            return True
    return bool(np.isfinite(flat).all())  # overflow of huge finite values, or really non-finite


class Decoder:
    """Frames to messages for a receiver that knows which architectures it accepts.

    ``decode`` raises ``ProtocolError``; ``try_decode`` logs and counts the reason and returns None,
    so a runtime can feed it anything from the network. Decoded tensors are float32 arrays; float32
    ones are read-only views of the frame unless ``writable`` (one extra copy of the tensor bytes).
    """

    def __init__(self, expected_specs: Mapping[str, TensorSpec],
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, writable: bool = False):
        self._shapes = {arch: {name: tuple(int(d) for d in shape) for name, (shape, _) in spec.items()}
                        for arch, spec in expected_specs.items()}
        self.max_frame_bytes = int(max_frame_bytes)
        self.writable = writable
        self.rejected: Counter = Counter()
        self.accepted = 0
        self._lock = threading.Lock()
        #: checked tensor layouts by (block header bytes, data length, class, arch id, dtype)
        self._plans: Dict[Tuple[bytes, int, type, Optional[str], str], List[Tuple]] = {}

    def try_decode(self, frame: bytes, source: str = "") -> Optional[Message]:
        """``decode`` that never raises: a bad frame is logged once, counted, and gives None."""
        try:
            msg = self.decode(frame)
        except ProtocolError as exc:
            reason, detail = exc.reason, str(exc)
        except Exception as exc:  # a decoder bug must not take a runtime down
            log.debug("unexpected decoder failure", exc_info=True)
            reason, detail = "malformed", "malformed: %s: %s" % (type(exc).__name__, exc)
        else:
            with self._lock:
                self.accepted += 1
            return msg
        with self._lock:
            self.rejected[reason] += 1
        size = len(frame) if isinstance(frame, (bytes, bytearray, memoryview)) else -1
        log.warning("rejected frame from %s (%d bytes): %s", source or "unknown", size, detail)
        return None

    def decode(self, frame: bytes) -> Message:
        """The message in ``frame``, or ``ProtocolError(reason)`` with a reason from ``REASONS``."""
        n = len(frame)
        if n > self.max_frame_bytes:
            raise ProtocolError("oversize", "%d bytes > limit %d" % (n, self.max_frame_bytes))
        buf = frame if isinstance(frame, (bytes, bytearray)) else memoryview(frame).cast("B")
        if n < _PREFIX.size:
            raise ProtocolError("malformed", "truncated frame (%d bytes)" % n)
        magic, fmt, header_len = _PREFIX.unpack_from(buf, 0)
        if magic != MAGIC:
            raise ProtocolError("malformed", "bad magic %r" % (magic,))
        if fmt != FORMAT_VERSION:
            raise ProtocolError("bad_version", "frame format %d, expected %d" % (fmt, FORMAT_VERSION))
        block_start = _PREFIX.size + header_len
        if block_start > n:
            raise ProtocolError("malformed", "truncated header")
        header = _loads(bytes(buf[_PREFIX.size:block_start]), _HEADER_DECODER, "header")
        if not isinstance(header, dict):
            raise ProtocolError("malformed", "header is not an object")
        if header.keys() != {"type", "v", "body", "dtype"}:
            raise ProtocolError("schema", "header keys %s" % sorted(header))
        if type(header["v"]) is not int or header["v"] != PROTOCOL_VERSION:
            raise ProtocolError("bad_version", "protocol v=%r, expected %d" % (header["v"], PROTOCOL_VERSION))
        cls = MESSAGE_TYPES.get(header["type"]) if isinstance(header["type"], str) else None
        if cls is None:
            raise ProtocolError("unknown_type", "message type %r" % (header["type"],))
        dtype_name = header["dtype"]
        if dtype_name not in ("float32", "float16"):
            raise ProtocolError("schema", "tensor dtype %r" % (dtype_name,))
        body = check_body(cls, header["body"])
        if n - block_start < _ST_LEN.size:
            raise ProtocolError("malformed", "truncated tensor block")
        (st_len,) = _ST_LEN.unpack_from(buf, block_start)
        if st_len > n - block_start - _ST_LEN.size:
            raise ProtocolError("malformed", "truncated tensor block header")
        data_start = block_start + _ST_LEN.size + st_len
        st_json = bytes(buf[block_start + _ST_LEN.size:data_start])
        arch_id = body["arch_id"] if cls in _TENSOR_TYPES else None
        key = (st_json, n - data_start, cls, arch_id, dtype_name)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan(_parse_block(st_json, n - data_start), cls, arch_id, WIRE_DTYPES[dtype_name])
            if len(self._plans) >= _CACHE_SIZE:
                self._plans.clear()
            self._plans[key] = plan
        if arch_id is None:
            return cls(**body)
        tensors = self._materialize(buf, data_start, n - data_start, plan, WIRE_DTYPES[dtype_name])
        groups = tensors.pop(None, None)
        if groups:
            clash = set(groups) & set(body["ewc"])
            if clash:
                raise ProtocolError("schema", "ewc keys both in header and tensors: %s" % sorted(clash))
            body["ewc"].update(groups)
        return cls(tensors=tensors, **body)

    def _plan(self, entries: List[_Entry], cls: type, arch_id: Optional[str],
              model_dtype: np.dtype) -> List[Tuple[str, str, np.dtype, int, int, Tuple[int, ...]]]:
        """Check tensor names, dtypes and shapes once per layout: ``[(group, name, dtype, count,
        offset, shape)]``, group "" for the model tensors."""
        if arch_id is None:
            if entries:
                raise ProtocolError("schema", "%s carries no tensors" % TYPE_NAMES[cls])
            return []
        expected = self._shapes.get(arch_id)
        if expected is None:
            raise ProtocolError("arch_mismatch", "architecture %r not accepted here" % arch_id)
        groups: Dict[str, Dict[str, _Entry]] = {"": {}}
        for entry in entries:
            name = entry[0]
            if name.startswith(EWC_PREFIX) and cls is GlobalModel:
                parts = name[len(EWC_PREFIX):].split("/", 1)
                if len(parts) != 2 or not parts[0]:
                    raise ProtocolError("schema", "bad ewc tensor name %r" % name)
                group, name, want = parts[0], parts[1], _F32
            else:
                group, want = "", model_dtype
            if entry[1] is not want:
                raise ProtocolError("schema", "tensor %r is %s, header says %s" % (entry[0], entry[1], want))
            groups.setdefault(group, {})[name] = entry
        plan = []
        for group, members in groups.items():
            if {name: e[2] for name, e in members.items()} != expected:
                self._raise_mismatch(group, members, expected, arch_id)
            plan.extend((group, name, e[1], (e[4] - e[3]) // e[1].itemsize, e[3], e[2])
                        for name, e in members.items())
        return plan

    def _materialize(self, buf: Any, data_start: int, data_len: int, plan: Sequence[Tuple],
                     model_dtype: np.dtype) -> Dict[Any, Any]:
        """Arrays for a checked plan after the finiteness check: ``{name: arr, None: ewc groups}``."""
        tensors: Dict[Any, Any] = {}
        ewc: Dict[str, Dict[str, np.ndarray]] = {}
        if model_dtype is _F32:  # every tensor is float32: one view, one finiteness pass, slices
            if self.writable:
                buf, data_start = bytearray(memoryview(buf)[data_start:]), 0
            whole = np.frombuffer(buf, _F32, count=data_len // 4, offset=data_start)
            if data_len and not _all_finite(whole):
                raise ProtocolError("non_finite", "NaN or Inf in tensors")
            for group, name, _, count, offset, shape in plan:
                arr = whole[offset // 4:offset // 4 + count].reshape(shape)
                if group:
                    ewc.setdefault(group, {})[name] = arr
                else:
                    tensors[name] = arr
        else:
            for group, name, dtype, count, offset, shape in plan:
                arr = np.frombuffer(buf, dtype, count=count, offset=data_start + offset).astype(np.float32)
                if not _all_finite(arr):
                    raise ProtocolError("non_finite", "NaN or Inf in tensor %s" % name)
                if group:
                    ewc.setdefault(group, {})[name] = arr.reshape(shape)
                else:
                    tensors[name] = arr.reshape(shape)
        if ewc:
            tensors[None] = ewc
        return tensors

    @staticmethod
    def _raise_mismatch(group: str, members: Mapping[str, _Entry], expected: Mapping[str, Tuple[int, ...]],
                        arch_id: str) -> None:
        missing = sorted(set(expected) - set(members))
        extra = sorted(set(members) - set(expected))
        if missing or extra:
            raise ProtocolError("arch_mismatch", "%s tensors for %s: missing %s, unexpected %s" % (
                group or "model", arch_id, missing, extra))
        wrong = ["%s %s (want %s)" % (name, e[2], expected[name]) for name, e in sorted(members.items())
                 if e[2] != expected[name]]
        raise ProtocolError("arch_mismatch", "%s tensors for %s: wrong shape %s" % (
            group or "model", arch_id, ", ".join(wrong)))


__all__ = ["MAGIC", "FORMAT_VERSION", "DEFAULT_MAX_FRAME_BYTES", "REASONS", "EWC_PREFIX", "WIRE_DTYPES",
           "TensorSpec", "Decoder", "encode"]
