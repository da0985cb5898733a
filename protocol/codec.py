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
from typing import Any, Callable, Collection, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from streamfl.errors import ProtocolError
from streamfl.logs import RateLimitedLog
from streamfl.protocol.extras import EXTRA_PREFIX, Extra, parse_extras
from streamfl.protocol.messages import (
    MESSAGE_TYPES, PROTOCOL_VERSION, TYPE_NAMES, DeltaUpdate, GlobalModel, Message, Tensors, Update,
)
from streamfl.protocol.schema import check_body
from streamfl.protocol.strict_json import BLOCK_DECODER, HEADER_DECODER, depth_at_most, loads
from streamfl.protocol.tensorblock import F16, F32, I8, ST_LEN, Entry, block_header, pad8, parse_block
from streamfl.protocol import quantize as q8

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
#: Header "dtype"s of blockwise-int8 frames (``streamfl.protocol.quantize``): ``int8`` carries the
#: model tensors themselves, ``int8_delta`` (updates only) their change from the global model
#: ``base_version`` the device held, which decodes to a ``DeltaUpdate``. Their block layout:
#: extras (float32), then ``SCALES`` (float32, every model tensor's block scales in tensor order),
#: then the int8 codes of each model tensor under its own name and shape; ``__metadata__`` holds
#: the block size under ``BLOCK_KEY``.
QUANTIZED = ("int8", "int8_delta")
#: Every tensor encoding ``encode`` takes, by the name the settings use.
ENCODINGS = tuple(WIRE_DTYPES) + QUANTIZED
SCALES = "__scales__"
BLOCK_KEY = "int8_block"
_TENSOR_TYPES = (GlobalModel, Update)
#: Block headers by tensor layout (encode) and parsed layouts by block header bytes (decode): a
#: fleet sends the same architecture over and over, so both sides parse its layout once.
_CACHE_SIZE = 64
#: Total block-header bytes the decoder's plan cache keeps: a frame may pad its block header (JSON
#: whitespace, ``__metadata__``), and every distinct one would otherwise stay as a key.
_PLAN_CACHE_BYTES = 4 * 2 ** 20
_BLOCK_HEADERS: Dict[Tuple[Any, ...], bytes] = {}
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


def encode(msg: Message, float16: bool = False, encoding: Optional[str] = None,
           base: Optional[Tensors] = None, block: int = q8.DEFAULT_BLOCK) -> bytes:
    """One frame for ``msg``; ``float16`` halves the model tensors on the wire (decoded as float32).

    ``encoding`` (one of ``ENCODINGS``, overriding ``float16``): ``int8`` sends blockwise int8
    codes of ``block`` elements per scale (~3.8x fewer bytes than float32, error per element at
    most max|block| / 254); ``int8_delta`` (an ``Update`` only) sends ``tensors - base`` that way,
    ``base`` being the tensors of global model ``base_version`` as the device holds them.
    """
    cls = type(msg)
    type_name = TYPE_NAMES.get(cls)
    if type_name is None:
        raise ProtocolError("unknown_type", "cannot encode %s" % cls.__name__)
    if encoding is None:
        encoding = "float16" if float16 else "float32"
    if encoding not in ENCODINGS:
        raise ProtocolError("schema", "unknown tensor encoding %r (one of %s)" % (encoding, ", ".join(ENCODINGS)))
    quantized = encoding in QUANTIZED
    if quantized and cls not in _TENSOR_TYPES:
        raise ProtocolError("schema", "%s carries no tensors to encode as %s" % (type_name, encoding))
    if encoding == "int8_delta" and (cls is not Update or base is None):
        raise ProtocolError("schema", "int8_delta encodes an Update against the base model it trained from")
    wire_dtype = F16 if encoding == "float16" else F32
    body: Dict[str, Any] = {}
    tensors: List[Tuple[str, np.ndarray]] = []
    model: Mapping[str, Any] = {}
    for name in _FIELDS[cls]:
        value = getattr(msg, name)
        if name == "tensors" and quantized:
            model = value
        elif name == "tensors":
            tensors = [(k, _wire_array(k, a, wire_dtype)) for k, a in value.items()]
        elif name == "class_counts":
            body[name] = {str(int(k)): v for k, v in value.items()}
        elif name == "extras":
            body[name] = {kind: _extra_fields(kind, extra, tensors) for kind, extra in value.items()}
        else:
            body[name] = value
    if tensors and cls not in _TENSOR_TYPES:
        raise ProtocolError("schema", "%s extras carry no tensors" % type_name)
    metadata = None
    if quantized:
        metadata = {BLOCK_KEY: str(q8.check_block(block))}
        tensors.extend(_quantized_tensors(model, base if encoding == "int8_delta" else None, block))
    header = {"type": type_name, "v": PROTOCOL_VERSION, "body": body, "dtype": encoding}
    try:
        header_bytes = pad8(_HEADER_ENCODER.encode(header).encode("utf-8"), _PREFIX.size)
    except ValueError as exc:  # NaN or Inf in a header float
        raise ProtocolError("non_finite", "%s header: %s" % (type_name, exc)) from exc
    except TypeError as exc:
        raise ProtocolError("schema", "%s header: %s" % (type_name, exc)) from exc
    layout = tuple((name, arr.dtype, arr.shape) for name, arr in tensors)
    key = layout if metadata is None else layout + (tuple(metadata.items()),)
    st_json = _BLOCK_HEADERS.get(key)
    if st_json is None:
        st_json = block_header(layout, metadata)
        if len(_BLOCK_HEADERS) >= _CACHE_SIZE:
            _BLOCK_HEADERS.clear()
        _BLOCK_HEADERS[key] = st_json
    parts: List[Any] = [_PREFIX.pack(MAGIC, FORMAT_VERSION, len(header_bytes)), header_bytes, st_json]
    parts.extend(arr for _, arr in tensors)
    return b"".join(parts)


def _quantized_tensors(model: Mapping[str, Any], base: Optional[Tensors],
                       block: int) -> List[Tuple[str, np.ndarray]]:
    """The scales tensor then each model tensor's int8 codes (of ``model - base`` with a base)."""
    scales, codes = [], []
    for name, arr in model.items():
        if not name or "/" in name or name == "__metadata__" or name == SCALES:
            raise ProtocolError("schema", "invalid tensor name %r" % name)
        x = np.asarray(arr, dtype=np.float32)
        if base is not None:
            ref = base.get(name)
            if ref is None or np.shape(ref) != x.shape:
                raise ProtocolError("arch_mismatch", "int8_delta: the base model has no tensor %s of "
                                    "shape %s" % (name, x.shape))
            x = x - np.asarray(ref, dtype=np.float32)
        try:
            q, s = q8.quantize(x, block)
        except ValueError as exc:
            raise ProtocolError("non_finite", "tensor %s: %s" % (name, exc)) from None
        scales.append(s)
        codes.append((name, q.reshape(x.shape)))
    if base is not None and set(base) != set(model):
        raise ProtocolError("arch_mismatch", "int8_delta: the base model's tensors differ from the update's")
    joined = np.concatenate(scales) if scales else np.zeros(0, np.float32)
    return [(SCALES, np.ascontiguousarray(joined, dtype=F32))] + codes


def encode_update(update: Update, encoding: str, *bases: Any) -> bytes:
    """The frame of an agent's ``update`` in its setting's ``encoding``; for ``int8_delta``, the
    base is the first of ``bases`` (the round's start tensors, the held ``GlobalModel``) that is
    global model ``update.base_version`` with the update's tensors. Without one (a newer model
    replaced the held one mid-round, before the first model), the update goes as float16: half
    the bytes, and never a delta the coordinator would add to the wrong model."""
    if encoding != "int8_delta":
        return encode(update, encoding=encoding)
    for candidate in bases:
        if isinstance(candidate, GlobalModel):
            if candidate.version != update.base_version or candidate.arch_id != update.arch_id:
                continue
            candidate = candidate.tensors
        if candidate is not None and set(candidate) == set(update.tensors):
            return encode(update, encoding=encoding, base=candidate)
    log.debug("update %s: no base v%d held, sent as float16", update.update_id, update.base_version)
    return encode(update, encoding="float16")


def _squares(arr: np.ndarray) -> float:
    """``a . a`` in one BLAS pass: finite iff every value is, unless huge values overflow it."""
    flat = arr.reshape(-1)
    with np.errstate(all="ignore"):
        return float(np.dot(flat, flat))


def _all_finite(arr: np.ndarray, squares: Optional[float] = None) -> bool:
    """True if no NaN/Inf: one BLAS pass (``_squares``, or the one given), isfinite if it overflowed."""
    if math.isfinite(_squares(arr) if squares is None else squares):
        return True
    return bool(np.isfinite(arr.reshape(-1)).all())  # overflow of huge finite values, or really non-finite


class DecodedTensors(dict):
    """The tensors of a float32 frame, with the sum of squares its finiteness check computed anyway.

    ``squares`` is the float32 dot product of the whole tensor block with itself (model tensors
    and extras, ``elements`` terms), so at least the sum of these tensors' squares up to float32
    rounding; a receiver's magnitude check (the coordinator's admission) may reuse it instead of a
    pass of its own. Only read-only views carry it, and it holds only
    while the dict still holds the decoded ``arrays`` (``measured_squares``).

    ``finite`` False: the decoder left the NaN/Inf check of these tensors to the receiver
    (``Decoder(receiver_checks_finite=...)``) and ``squares`` is None; until the receiver has
    checked them they may hold anything a float32 can.
    """

    __slots__ = ("squares", "elements", "arrays", "finite")

    def __init__(self, tensors: Dict[str, np.ndarray], squares: Optional[float], elements: int,
                 finite: bool = True):
        super().__init__(tensors)
        self.squares = squares
        self.elements = elements
        self.arrays = tuple(tensors.values())
        self.finite = finite

    def measured_squares(self) -> Optional[Tuple[float, int]]:
        """``(squares, elements)`` while the dict holds the arrays it was decoded with, else None."""
        if self.squares is None:
            return None
        if len(self) == len(self.arrays) and all(a is b for a, b in zip(self.values(), self.arrays)):
            return self.squares, self.elements
        return None


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

    ``receiver_checks_finite``: message types (the coordinator passes ``Update``) whose float32
    model tensors this decoder does not check for NaN/Inf, because the receiver checks them in a
    pass it makes over them anyway (admission, with the delta's norm: one read of a 2 MB update
    instead of two). They come as ``DecodedTensors`` with ``finite`` False; their extras, and
    every tensor of a writable, float16 or int8 frame, are checked here as always.
    """

    def __init__(self, expected_specs: Mapping[str, TensorSpec],
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, writable: bool = False,
                 warn_interval_s: float = DEFAULT_WARN_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic,
                 max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
                 max_header_depth: int = DEFAULT_MAX_HEADER_DEPTH,
                 receiver_checks_finite: Collection[type] = ()):
        if not warn_interval_s >= 0:
            raise ValueError("warn_interval_s must be >= 0, got %r" % (warn_interval_s,))
        self._shapes = {arch: {name: tuple(int(d) for d in shape) for name, (shape, _) in spec.items()}
                        for arch, spec in expected_specs.items()}
        self.max_frame_bytes = int(max_frame_bytes)
        self.max_header_bytes = int(max_header_bytes)
        self.max_header_depth = int(max_header_depth)
        self.writable = writable
        self.receiver_checks_finite = frozenset(receiver_checks_finite)
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
        if dtype_name not in ENCODINGS:
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
        if dtype_name in QUANTIZED:
            return self._decode_quantized(buf, data_start, n - data_start, st_json, cls, body,
                                          arch_id, dtype_name)
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
        tensors = self._materialize(buf, data_start, n - data_start, plan, WIRE_DTYPES[dtype_name],
                                    cls in self.receiver_checks_finite)
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
                     model_dtype: np.dtype, receiver_checks: bool = False) -> Dict[Any, Any]:
        """Arrays for a checked plan after the finiteness check: ``{name: arr, None: extra groups}``
        with the extra groups as ``{kind: {group: {name: arr}}}``. ``receiver_checks``: leave the
        model tensors of a read-only float32 frame unchecked (``receiver_checks_finite``)."""
        tensors: Dict[Any, Any] = {}
        extras: Dict[str, Dict[str, Dict[str, np.ndarray]]] = {}
        if model_dtype is F32:  # every tensor is float32: one view, one finiteness pass, slices
            if self.writable:
                buf, data_start = bytearray(memoryview(buf)[data_start:]), 0
            whole = np.frombuffer(buf, F32, count=data_len // 4, offset=data_start)
            deferred = receiver_checks and not whole.flags.writeable
            squares: Optional[float] = None
            if not deferred:
                squares = _squares(whole) if data_len else 0.0
                if data_len and not _all_finite(whole, squares):
                    raise ProtocolError("non_finite", "NaN or Inf in tensors")
            for group, name, _, count, offset, shape in plan:
                arr = whole[offset // 4:offset // 4 + count].reshape(shape)
                if group:
                    if deferred and not _all_finite(arr):  # extras are checked here always
                        raise ProtocolError("non_finite", "NaN or Inf in tensor %s" % name)
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
        if model_dtype is F32 and not whole.flags.writeable and tensors:
            # read-only: the sum stays true, and unchecked tensors stay marked so
            tensors = DecodedTensors(tensors, squares, whole.size, finite=not deferred)
        if extras:
            tensors[None] = extras
        return tensors

    def _decode_quantized(self, buf: Any, data_start: int, data_len: int, st_json: bytes, cls: type,
                          body: Dict[str, Any], arch_id: Optional[str], encoding: str) -> Message:
        """A blockwise-int8 frame (``QUANTIZED``) as float32 tensors, every count and value checked
        before use: the block size in range, one finite scale in ``0..quantize.MAX_SCALE`` per
        block of the architecture's tensors, codes in -127..127; ``int8_delta`` gives a
        ``DeltaUpdate`` (the coordinator adds its base, ``coordinator/deltas.py``)."""
        if arch_id is None or (encoding == "int8_delta" and cls is not Update):
            raise ProtocolError("schema", "%s frames carry no %s tensors" % (TYPE_NAMES[cls], encoding))
        expected = self._shapes.get(arch_id)
        if expected is None:
            raise ProtocolError("arch_mismatch", "architecture %r not accepted here" % arch_id)
        st_header = loads(st_json, BLOCK_DECODER, "tensor block header")
        meta = st_header.get("__metadata__") if isinstance(st_header, dict) else None
        text = meta.get(BLOCK_KEY) if isinstance(meta, dict) else None
        if not isinstance(text, str) or not text.isdigit() or len(text) > 8 \
                or not q8.MIN_BLOCK <= int(text) <= q8.MAX_BLOCK:
            raise ProtocolError("schema", "%s frame: %s must name a block size in %d..%d, got %r"
                                % (encoding, BLOCK_KEY, q8.MIN_BLOCK, q8.MAX_BLOCK, text))
        block = int(text)
        groups: Dict[Any, Dict[str, Entry]] = {"": {}}
        scales_entry = None
        for entry in parse_block(st_header, data_len):  # in offset order
            name = entry[0]
            if name == SCALES:
                scales_entry = entry
                want = F32
            elif name.startswith(EXTRA_PREFIX):
                parts = name[len(EXTRA_PREFIX):].split("/", 2)
                if len(parts) != 3 or not parts[0] or not parts[1]:
                    raise ProtocolError("schema", "bad extra tensor name %r" % name)
                groups.setdefault((parts[0], parts[1]), {})[parts[2]] = entry
                want = F32
            else:
                groups[""][name] = entry
                want = I8
            if entry[1] is not want:
                raise ProtocolError("schema", "tensor %r is %s, %s frames send it as %s"
                                    % (name, entry[1], encoding, want))
        for group, members in groups.items():
            if {name: e[2] for name, e in members.items()} != expected:
                self._raise_mismatch(group, members, expected, arch_id)
        model = sorted(groups.pop("").values(), key=lambda e: e[3])
        counts = [q8.num_blocks(int(np.prod(e[2], dtype=np.int64)), block) for e in model]
        if scales_entry is None or scales_entry[2] != (sum(counts),):
            raise ProtocolError("schema", "%s frame: %s must be [%d] (one per %d-element block), got %s"
                                % (encoding, SCALES, sum(counts), block,
                                   None if scales_entry is None else list(scales_entry[2])))
        scales = np.frombuffer(buf, F32, count=sum(counts), offset=data_start + scales_entry[3])
        with np.errstate(invalid="ignore"):
            if not (scales >= 0).all() or not (scales <= q8.MAX_SCALE).all():  # NaN fails both
                raise ProtocolError("bounds", "%s frame: a block scale is negative, NaN, Inf or above %.3g"
                                    % (encoding, q8.MAX_SCALE))
        tensors: Dict[str, np.ndarray] = {}
        first = 0
        for (name, _, shape, begin, end), count in zip(model, counts):
            codes = np.frombuffer(buf, I8, count=end - begin, offset=data_start + begin)
            if codes.size and int(codes.min()) < -q8.QMAX:
                raise ProtocolError("bounds", "%s frame: tensor %s holds the code -128 (codes are "
                                    "-127..127)" % (encoding, name))
            tensors[name] = q8.dequantize(codes, scales[first:first + count], shape, block)
            first += count
        extras: Dict[str, Dict[str, Dict[str, np.ndarray]]] = {}
        for (kind, group), members in groups.items():
            for name, (_, dtype, shape, begin, end) in members.items():
                arr = np.frombuffer(buf, F32, count=(end - begin) // 4, offset=data_start + begin)
                if not _all_finite(arr):
                    raise ProtocolError("non_finite", "NaN or Inf in tensor %s" % name)
                extras.setdefault(kind, {}).setdefault(group, {})[name] = \
                    arr.copy().reshape(shape) if self.writable else arr.reshape(shape)
        if body["extras"] or extras:
            body["extras"] = parse_extras(_with_methods(body["extras"]), extras)
        return (DeltaUpdate if encoding == "int8_delta" else cls)(tensors=tensors, **body)

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
           "ENCODINGS", "QUANTIZED", "TensorSpec", "Decoder", "encode", "encode_update"]
