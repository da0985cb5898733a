"""The wire codec: messages to frames and back, rejecting anything malformed before it reaches a core.

Frame = ``b"SFL"`` + 1 format byte + 4-byte big-endian header length + JSON header (UTF-8, padded
with spaces to 8 bytes) + a tensor block in the safetensors format. The header is
``{"type", "v", "body", "dtype"}``; ``body`` holds every non-tensor field of the message.

The tensor block's layout lives in ``streamfl.protocol.tensorblock``; nothing is ever unpickled.

The ``extras`` of a ``GlobalModel`` or an ``Update`` (plug-ins' typed payloads,
``streamfl.protocol.extras``) put their fields in the header under ``extras.<kind>`` and their
tensor groups (sums of Fisher diagonals, a device's Fisher diagonal F) in the tensor block as
``extra/<kind>/<group>/<name>``, always float32 (Fisher values underflow in float16), checked
against the architecture like the model tensors; ``Extra.parse`` then checks the fields.
"""
import json
import logging
import math
import struct
import threading
import time
from collections import Counter
from dataclasses import fields
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from streamfl.errors import ProtocolError
from streamfl.logs import RateLimitedLog
from streamfl.protocol.extras import EXTRA_PREFIX, Extra, parse_extras
from streamfl.protocol.messages import (
    MESSAGE_TYPES, PROTOCOL_VERSION, TYPE_NAMES, GlobalModel, Message, Update,
)
from streamfl.protocol.schema import check_body
from streamfl.protocol.strict_json import BLOCK_DECODER, HEADER_DECODER, depth_at_most, loads
from streamfl.protocol.tensorblock import F16, F32, ST_LEN, Entry, block_header, pad8, parse_block

log = logging.getLogger(__name__)

MAGIC = b"SFL"
#: Layout version of the frame itself (prefix + header + safetensors block); bump on change.
FORMAT_VERSION = 1
DEFAULT_MAX_FRAME_BYTES = 64 * 2 ** 20
#: Limit on each JSON text of a frame (the header, the tensor block header). Parsed JSON takes 20-40
#: times its text in Python objects (a ``{}`` of 2 bytes is a 64-byte dict), so a 64 MiB header
#: would cost gigabytes; real ones are a few KB (block headers ~100 bytes per tensor), so 1 MiB
#: leaves room for models of thousands of tensors and bounds the objects to tens of MB.
DEFAULT_MAX_HEADER_BYTES = 2 ** 20
#: Deepest nesting of lists and objects a frame header may hold. Real headers nest 4 deep
#: (header, body, extras, kind) plus whatever a command's params hold; 32 leaves room for those.
#: Without a limit, a header nested ~1000 deep parses or fails depending on the receiver's stack
#: depth, and an accepted one breaks any later recursive walk (repr, logging, encode) in a core.
DEFAULT_MAX_HEADER_DEPTH = 32
#: At most one WARNING per rejection reason this often, so a flood of bad frames cannot flood journald.
DEFAULT_WARN_INTERVAL_S = 10.0
#: ``{tensor name: (shape, dtype)}`` of one architecture, as ``streamfl.models.tensor_spec`` returns.
TensorSpec = Mapping[str, Tuple[Sequence[int], str]]
#: The ``ProtocolError.reason`` values ``Decoder`` raises and counts. ``bounds``: a typed extra
#: carries a number outside its payload type's declared range (``Extra.BOUNDS``).
REASONS = ("malformed", "oversize", "unknown_type", "bad_version", "schema", "non_finite",
           "arch_mismatch", "bounds")

_PREFIX = struct.Struct(">3sBI")
#: header "dtype" -> numpy dtype of the model tensors on the wire
WIRE_DTYPES = {"float32": F32, "float16": F16}
_TENSOR_TYPES = (GlobalModel, Update)
#: Block headers by tensor layout (encode) and parsed layouts by block header bytes (decode): a
#: fleet sends the same architecture over and over, so both sides parse its layout once.
_CACHE_SIZE = 64
#: Total block-header bytes the decoder's plan cache keeps: a frame may pad its block header (JSON
#: whitespace, ``__metadata__``), and every distinct one would otherwise stay as a key.
_PLAN_CACHE_BYTES = 4 * 2 ** 20
_BLOCK_HEADERS: Dict[Tuple[Tuple[str, np.dtype, Tuple[int, ...]], ...], bytes] = {}
_FIELDS = {cls: tuple(f.name for f in fields(cls)) for cls in MESSAGE_TYPES.values()}


_methods_loaded = False


def _with_methods(extras: Any) -> Any:
    """``extras``, after loading the methods once: each registers its payload types with the
    codec as it loads (``streamfl.methods``), so the codec itself names none."""
    global _methods_loaded
    if not _methods_loaded:
        from streamfl import methods
        methods.packages()
        _methods_loaded = True
    return extras


def _json_default(obj: Any) -> Any:
    """numpy scalars and small arrays in header fields become plain JSON numbers and lists."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError("%s is not JSON serializable" % type(obj).__name__)


_HEADER_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False, default=_json_default)


def _wire_array(name: str, arr: Any, dtype: np.dtype) -> np.ndarray:
    """``arr`` as a C-contiguous little-endian array of ``dtype`` (no copy when it already is)."""
    if not name or "/" in name or name == "__metadata__":
        raise ProtocolError("schema", "invalid tensor name %r" % name)
    if dtype is F32:
        return np.ascontiguousarray(arr, dtype=dtype)
    with np.errstate(over="ignore"):
        out = np.ascontiguousarray(arr, dtype=dtype)
    if not np.isfinite(out).all():
        raise ProtocolError("non_finite", "tensor %s is not finite in float16 (overflow?)" % name)
    return out


def _extra_fields(kind: str, extra: Any, tensors: List[Tuple[str, np.ndarray]]) -> Dict[str, Any]:
    """The header fields of one extra; its tensor groups are appended to ``tensors`` (float32)."""
    if not isinstance(extra, Extra) or extra.KIND != kind:
        raise ProtocolError("schema", "extras[%r] must be an Extra of that kind, got %s"
                            % (kind, type(extra).__name__))
    for group, arrays in extra.groups().items():
        if not group or "/" in group:
            raise ProtocolError("schema", "invalid extra group %r of %s" % (group, kind))
        tensors.extend(("%s%s/%s/%s" % (EXTRA_PREFIX, kind, group, k), _wire_array(k, a, F32))
                       for k, a in arrays.items())
    return extra.fields()


def encode(msg: Message, float16: bool = False) -> bytes:
    """One frame for ``msg``; ``float16`` halves the model tensors on the wire (decoded as float32)."""
    cls = type(msg)
    type_name = TYPE_NAMES.get(cls)
    if type_name is None:
        raise ProtocolError("unknown_type", "cannot encode %s" % cls.__name__)
    wire_dtype = F16 if float16 else F32
    body: Dict[str, Any] = {}
    tensors: List[Tuple[str, np.ndarray]] = []
    for name in _FIELDS[cls]:
        value = getattr(msg, name)
        if name == "tensors":
            tensors = [(k, _wire_array(k, a, wire_dtype)) for k, a in value.items()]
        elif name == "class_counts":
            body[name] = {str(int(k)): v for k, v in value.items()}
        elif name == "extras":
            body[name] = {kind: _extra_fields(kind, extra, tensors) for kind, extra in value.items()}
        else:
            body[name] = value
    if tensors and cls not in _TENSOR_TYPES:
        raise ProtocolError("schema", "%s extras carry no tensors" % type_name)
    header = {"type": type_name, "v": PROTOCOL_VERSION, "body": body,
              "dtype": "float16" if float16 else "float32"}
    try:
        header_bytes = pad8(_HEADER_ENCODER.encode(header).encode("utf-8"), _PREFIX.size)
    except ValueError as exc:  # NaN or Inf in a header float
        raise ProtocolError("non_finite", "%s header: %s" % (type_name, exc)) from exc
    except TypeError as exc:
        raise ProtocolError("schema", "%s header: %s" % (type_name, exc)) from exc
    layout = tuple((name, arr.dtype, arr.shape) for name, arr in tensors)
    st_json = _BLOCK_HEADERS.get(layout)
    if st_json is None:
        st_json = block_header(layout)
        if len(_BLOCK_HEADERS) >= _CACHE_SIZE:
            _BLOCK_HEADERS.clear()
        _BLOCK_HEADERS[layout] = st_json
    parts: List[Any] = [_PREFIX.pack(MAGIC, FORMAT_VERSION, len(header_bytes)), header_bytes, st_json]
    parts.extend(arr for _, arr in tensors)
    return b"".join(parts)


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
    Rejection warnings are rate-limited per reason (``warn_interval_s``, clock ``clock``); the rest
    go to DEBUG and every one is counted in ``rejected``. Each JSON text of a frame is limited to
    ``max_header_bytes`` (``oversize``) and the header to ``max_header_depth`` levels of nesting
    (``schema``), so decoding allocates about the frame's size plus a bounded amount, whatever
    the frame claims (``tests/test_fuzz.py``).
    """

    def __init__(self, expected_specs: Mapping[str, TensorSpec],
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, writable: bool = False,
                 warn_interval_s: float = DEFAULT_WARN_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic,
                 max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
                 max_header_depth: int = DEFAULT_MAX_HEADER_DEPTH):
        if not warn_interval_s >= 0:
            raise ValueError("warn_interval_s must be >= 0, got %r" % (warn_interval_s,))
        self._shapes = {arch: {name: tuple(int(d) for d in shape) for name, (shape, _) in spec.items()}
                        for arch, spec in expected_specs.items()}
        self.max_frame_bytes = int(max_frame_bytes)
        self.max_header_bytes = int(max_header_bytes)
        self.max_header_depth = int(max_header_depth)
        self.writable = writable
        self.rejected: Counter = Counter()
        self.accepted = 0
        self.warn_interval_s = float(warn_interval_s)
        self._clock = clock
        #: One WARNING per rejection reason per ``warn_interval_s``, the rest at DEBUG.
        self._warnings = RateLimitedLog(log, self.warn_interval_s, clock,
                                        "(%d more %s rejections suppressed to DEBUG since the last warning)")
        self._lock = threading.Lock()
        #: checked tensor layouts by (block header bytes, data length, class, arch id, dtype)
        self._plans: Dict[Tuple[bytes, int, type, Optional[str], str], List[Tuple]] = {}
        self._plan_bytes = 0

    def try_decode(self, frame: bytes, source: str = "") -> Optional[Message]:
        """``decode`` that never raises: a bad frame is counted, logged (rate-limited) and gives None."""
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
        size = len(frame) if isinstance(frame, (bytes, bytearray, memoryview)) else -1
        with self._lock:
            self.rejected[reason] += 1
        self._warnings.event(reason, logging.WARNING, "rejected frame from %s (%d bytes): %s",
                             source or "unknown", size, detail)
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
        if header_len > self.max_header_bytes:
            raise ProtocolError("oversize", "header of %d bytes > limit %d" % (header_len, self.max_header_bytes))
        block_start = _PREFIX.size + header_len
        if block_start > n:
            raise ProtocolError("malformed", "truncated header")
        header = loads(bytes(buf[_PREFIX.size:block_start]), HEADER_DECODER, "header")
        if not isinstance(header, dict):
            raise ProtocolError("malformed", "header is not an object")
        if not depth_at_most(header, self.max_header_depth):
            raise ProtocolError("schema", "header nests deeper than %d" % self.max_header_depth)
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
        if n - block_start < ST_LEN.size:
            raise ProtocolError("malformed", "truncated tensor block")
        (st_len,) = ST_LEN.unpack_from(buf, block_start)
        if st_len > n - block_start - ST_LEN.size:
            raise ProtocolError("malformed", "truncated tensor block header")
        if st_len > self.max_header_bytes:
            raise ProtocolError("oversize", "tensor block header of %d bytes > limit %d"
                                % (st_len, self.max_header_bytes))
        data_start = block_start + ST_LEN.size + st_len
        st_json = bytes(buf[block_start + ST_LEN.size:data_start])
        arch_id = body["arch_id"] if cls in _TENSOR_TYPES else None
        key = (st_json, n - data_start, cls, arch_id, dtype_name)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan(parse_block(loads(st_json, BLOCK_DECODER, "tensor block header"), n - data_start), cls, arch_id, WIRE_DTYPES[dtype_name])
            if len(self._plans) >= _CACHE_SIZE or self._plan_bytes + len(st_json) > _PLAN_CACHE_BYTES:
                self._plans.clear()
                self._plan_bytes = 0
            if len(st_json) <= _PLAN_CACHE_BYTES:
                self._plans[key] = plan
                self._plan_bytes += len(st_json)
        if arch_id is None:
            if body.get("extras"):
                body["extras"] = parse_extras(_with_methods(body["extras"]), {})
            return cls(**body)
        tensors = self._materialize(buf, data_start, n - data_start, plan, WIRE_DTYPES[dtype_name])
        groups = tensors.pop(None, None) or {}
        if body["extras"] or groups:
            body["extras"] = parse_extras(_with_methods(body["extras"]), groups)
        return cls(tensors=tensors, **body)

    def _plan(self, entries: List[Entry], cls: type, arch_id: Optional[str],
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
        groups: Dict[Any, Dict[str, Entry]] = {"": {}}
        for entry in entries:
            name = entry[0]
            if name.startswith(EXTRA_PREFIX):
                parts = name[len(EXTRA_PREFIX):].split("/", 2)
                if len(parts) != 3 or not parts[0] or not parts[1]:
                    raise ProtocolError("schema", "bad extra tensor name %r" % name)
                group, name, want = (parts[0], parts[1]), parts[2], F32
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
        """Arrays for a checked plan after the finiteness check: ``{name: arr, None: extra groups}``
        with the extra groups as ``{kind: {group: {name: arr}}}``."""
        tensors: Dict[Any, Any] = {}
        extras: Dict[str, Dict[str, Dict[str, np.ndarray]]] = {}
        if model_dtype is F32:  # every tensor is float32: one view, one finiteness pass, slices
            if self.writable:
                buf, data_start = bytearray(memoryview(buf)[data_start:]), 0
            whole = np.frombuffer(buf, F32, count=data_len // 4, offset=data_start)
            if data_len and not _all_finite(whole):
                raise ProtocolError("non_finite", "NaN or Inf in tensors")
            for group, name, _, count, offset, shape in plan:
                arr = whole[offset // 4:offset // 4 + count].reshape(shape)
                if group:
                    extras.setdefault(group[0], {}).setdefault(group[1], {})[name] = arr
                else:
                    tensors[name] = arr
        else:
            for group, name, dtype, count, offset, shape in plan:
                arr = np.frombuffer(buf, dtype, count=count, offset=data_start + offset).astype(np.float32)
                if not _all_finite(arr):
                    raise ProtocolError("non_finite", "NaN or Inf in tensor %s" % name)
                if group:
                    extras.setdefault(group[0], {}).setdefault(group[1], {})[name] = arr.reshape(shape)
                else:
                    tensors[name] = arr.reshape(shape)
        if extras:
            tensors[None] = extras
        return tensors

    @staticmethod
    def _raise_mismatch(group: Any, members: Mapping[str, Entry], expected: Mapping[str, Tuple[int, ...]],
                        arch_id: str) -> None:
        missing = sorted(set(expected) - set(members))
        extra = sorted(set(members) - set(expected))
        if missing or extra:
            raise ProtocolError("arch_mismatch", "%s tensors for %s: missing %s, unexpected %s" % (
                "/".join(group) if group else "model", arch_id, missing, extra))
        wrong = ["%s %s (want %s)" % (name, e[2], expected[name]) for name, e in sorted(members.items())
                 if e[2] != expected[name]]
        raise ProtocolError("arch_mismatch", "%s tensors for %s: wrong shape %s" % (
            "/".join(group) if group else "model", arch_id, ", ".join(wrong)))


__all__ = ["MAGIC", "FORMAT_VERSION", "DEFAULT_MAX_FRAME_BYTES", "DEFAULT_MAX_HEADER_BYTES",
           "DEFAULT_MAX_HEADER_DEPTH", "DEFAULT_WARN_INTERVAL_S", "REASONS", "WIRE_DTYPES",
           "TensorSpec", "Decoder", "encode"]
