"""XLA literals: LiteralProto <-> numpy, and the literal text XLA prints and parses.

* ``literal_to_numpy(proto)`` / ``numpy_to_literal(array, shape)``: every array element
  type (PRED, S/U 1..64 incl. sub-byte, F16/BF16/F32/F64, the F8 family, F4E2M1FN,
  C64/C128) and tuples.  Proto payloads are in the literal's physical layout order
  (``minor_to_major``); numpy arrays are in logical (row-major) order.
* ``format_literal(proto)``: XLA's ``Literal::PrintWithoutShapeOneline`` (what follows
  ``constant(`` in HLO text), ``format_literal_with_shape`` its ``PrintWithLayoutOneline``.
* ``parse_literal(cursor, shape)``: XLA's dense / tuple literal syntax.

Element text follows XLA exactly: integers in decimal; floats with ``%.*g`` (F32 tries 6
digits then 9, F64 15 then 17, narrow types use their ``max_digits10``), ``inf``,
``-inf``, ``nan``/``-nan`` and a ``(0x..)`` NaN payload where XLA prints one; PRED as
``1``/``0`` inside arrays and ``true``/``false`` for scalars; complex as ``(re, im)``.
"""
from __future__ import annotations

import math
import re
from typing import Any, Sequence

import numpy as np

from hlo_spmd.ir.primitive_types import PrimitiveType, text_name
from hlo_spmd.ir.primitive_types import numpy_dtype as _numpy_dtype
from hlo_spmd.proto import xla_data_pb2

__all__ = ["literal_to_numpy", "numpy_to_literal", "format_literal", "format_literal_with_shape",
           "format_element", "parse_literal", "literal_shape_proto", "LITERAL_FIELDS"]

P = PrimitiveType

# LiteralProto payload field per element type.
LITERAL_FIELDS: dict[PrimitiveType, str] = {
    P.PRED: "preds", P.S8: "s8s", P.U8: "u8s", P.S16: "s16s", P.U16: "u16s",
    P.S32: "s32s", P.U32: "u32s", P.S64: "s64s", P.U64: "u64s",
    P.F16: "f16s", P.BF16: "bf16s", P.F32: "f32s", P.F64: "f64s",
    P.C64: "c64s", P.C128: "c128s",
    P.F8E5M2: "f8e5m2s", P.F8E4M3FN: "f8e4m3fns", P.F8E4M3B11FNUZ: "f8e4m3b11fnuzs",
    P.F8E5M2FNUZ: "f8e5m2fnuzs", P.F8E4M3FNUZ: "f8e4m3fnuzs", P.F8E4M3: "f8e4m3s",
    P.F8E3M4: "f8e3m4s", P.F8E8M0FNU: "f8e8m0fnus", P.F4E2M1FN: "f4e2m1fns",
    P.S4: "s4s", P.U4: "u4s", P.S2: "s2s", P.U2: "u2s", P.S1: "s1s", P.U1: "u1s",
}
# Repeated (non-bytes) payload fields and the numpy dtype they hold.
_REPEATED = {P.PRED: np.bool_, P.S32: np.int32, P.U32: np.uint32, P.S64: np.int64,
             P.U64: np.uint64, P.F32: np.float32, P.F64: np.float64,
             P.C64: np.float32, P.C128: np.float64}
# Bytes payloads: wire dtype (little endian) read with np.frombuffer.
_BYTES_WIRE = {P.S8: "i1", P.U8: "u1", P.S16: "<i2", P.U16: "<u2", P.F16: "<f2", P.BF16: "<u2"}
_SUB_BYTE_BITS = {P.S4: 4, P.U4: 4, P.S2: 2, P.U2: 2, P.S1: 1, P.U1: 1, P.F4E2M1FN: 4}
_SIGNED_SUB_BYTE = {P.S4, P.S2, P.S1}
_UNSIGNED = {P.U1, P.U2, P.U4, P.U8, P.U16, P.U32, P.U64}
_SIGNED = {P.S1, P.S2, P.S4, P.S8, P.S16, P.S32, P.S64}
_COMPLEX = {P.C64: np.complex64, P.C128: np.complex128}

# Float payload fields: (field number, little-endian wire dtype).
_FLOAT_FIELDS = {P.F32: (8, "<f4"), P.F64: (9, "<f8"), P.C64: (12, "<f4"), P.C128: (18, "<f8")}


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    v = shift = 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def _float_field_bytes(lit: xla_data_pb2.LiteralProto, et: PrimitiveType) -> bytes:
    """Raw little-endian payload of a float/double repeated field (packed or not)."""
    number, wire = _FLOAT_FIELDS[et]
    if not len(getattr(lit, LITERAL_FIELDS[et])):
        return b""
    only = xla_data_pb2.LiteralProto()
    getattr(only, LITERAL_FIELDS[et]).MergeFrom(getattr(lit, LITERAL_FIELDS[et]))
    buf = only.SerializeToString()
    size = 4 if wire == "<f4" else 8
    chunks = []
    i = 0
    n = len(buf)
    while i < n:
        key, i = _read_varint(buf, i)
        fnum, wtype = key >> 3, key & 7
        if wtype == 2:
            ln, i = _read_varint(buf, i)
            if fnum == number:
                chunks.append(buf[i:i + ln])
            i += ln
        elif wtype in (1, 5):
            step = 8 if wtype == 1 else 4
            if fnum == number and step == size:
                chunks.append(buf[i:i + step])
            i += step
        elif wtype == 0:
            _, i = _read_varint(buf, i)
        else:
            raise ValueError(f"unexpected wire type {wtype} in a literal")
    return b"".join(chunks)


# max_digits10 of the narrow float types; F32 / F64 are handled separately.
_MAX_DIGITS10 = {P.F16: 5, P.BF16: 4, P.F8E5M2: 2, P.F8E4M3FN: 3, P.F8E4M3B11FNUZ: 3,
                 P.F8E5M2FNUZ: 2, P.F8E4M3FNUZ: 3, P.F8E4M3: 3, P.F8E3M4: 3,
                 P.F8E8M0FNU: 2, P.F4E2M1FN: 2}
# (bit width, NaN payload mask, quiet-NaN payload) for types whose NaN payloads XLA
# prints as "nan(0x..)"; types absent here print a bare "nan".
_NAN_PAYLOAD = {P.F32: (32, (1 << 23) - 1, 1 << 22), P.F64: (64, (1 << 52) - 1, 1 << 51),
                P.F16: (16, (1 << 10) - 1, 1 << 9), P.BF16: (16, (1 << 7) - 1, 1 << 6),
                P.F8E5M2: (8, 3, 2), P.F8E4M3: (8, 7, 4), P.F8E3M4: (8, 15, 8)}


def numpy_dtype(t: PrimitiveType | int) -> np.dtype:
    """numpy dtype holding element type ``t`` (S1/U1, which ml_dtypes lacks, use int8/uint8)."""
    t = PrimitiveType(t)
    if t == P.S1:
        return np.dtype(np.int8)
    if t == P.U1:
        return np.dtype(np.uint8)
    return _numpy_dtype(t)


def _int_range(t: PrimitiveType) -> tuple[int, int]:
    bits = {P.S1: 1, P.S2: 2, P.S4: 4, P.S8: 8, P.S16: 16, P.S32: 32, P.S64: 64,
            P.U1: 1, P.U2: 2, P.U4: 4, P.U8: 8, P.U16: 16, P.U32: 32, P.U64: 64}[t]
    if t in _UNSIGNED:
        return 0, (1 << bits) - 1
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


# -- proto <-> numpy -----------------------------------------------------------------
def _major_to_minor(shape: Any) -> list[int] | None:
    """Physical (major-to-minor) dim order if the layout is not the default, else None."""
    if not shape.HasField("layout"):
        return None
    m2m = list(shape.layout.minor_to_major)
    rank = len(shape.dimensions)
    if len(m2m) != rank or m2m == list(range(rank - 1, -1, -1)):
        return None
    return m2m[::-1]


def literal_to_numpy(lit: xla_data_pb2.LiteralProto) -> Any:
    """numpy array (logical order) of an array literal; a tuple of them for tuples."""
    shape = lit.shape
    et = PrimitiveType(shape.element_type)
    if et == P.TUPLE:
        return tuple(literal_to_numpy(c) for c in lit.tuple_literals)
    if et == P.TOKEN:
        return None
    dims = tuple(int(d) for d in shape.dimensions)
    count = math.prod(dims)
    dtype = numpy_dtype(et)
    field = LITERAL_FIELDS.get(et)
    if field is None:
        raise ValueError(f"literal element type {text_name(et)} is not supported")
    if et in _FLOAT_FIELDS:
        # Read the raw wire bytes: going through Python floats would quiet signaling NaNs.
        flat = np.frombuffer(_float_field_bytes(lit, et), dtype=_FLOAT_FIELDS[et][1]).astype(
            _REPEATED[et])
        if et in _COMPLEX:
            flat = flat.view(_COMPLEX[et]) if flat.size else np.zeros(0, _COMPLEX[et])
    elif et in _REPEATED:
        src = getattr(lit, field)
        flat = np.array(src, dtype=_REPEATED[et])
    else:
        raw = getattr(lit, field)
        if et in _SUB_BYTE_BITS:
            bits = _SUB_BYTE_BITS[et]
            u = np.frombuffer(raw, dtype=np.uint8) & ((1 << bits) - 1)
            if et in _SIGNED_SUB_BYTE:
                s = u.astype(np.int8)
                s = np.where(s >= (1 << (bits - 1)), s - (1 << bits), s).astype(np.int8)
                flat = s.astype(dtype)
            elif et == P.F4E2M1FN:
                flat = u.view(dtype)
            else:
                flat = u.astype(dtype)
        elif et in _BYTES_WIRE:
            wire = np.frombuffer(raw, dtype=_BYTES_WIRE[et])
            flat = wire.view(dtype) if et == P.BF16 else wire.astype(dtype)
        else:  # one-byte float types
            flat = np.frombuffer(raw, dtype=np.uint8).view(dtype)
    if flat.size != count:
        raise ValueError(f"literal of shape {text_name(et)}{list(dims)} has {flat.size} "
                         f"elements in '{field}', expected {count}")
    m2m = _major_to_minor(shape)
    if m2m is None:
        return flat.reshape(dims).copy()
    phys = flat.reshape([dims[d] for d in m2m])
    return np.ascontiguousarray(phys.transpose(np.argsort(m2m)))


def literal_shape_proto(element_type: PrimitiveType | int, dims: Sequence[int],
                        minor_to_major: Sequence[int] | None = None) -> xla_data_pb2.ShapeProto:
    """ShapeProto as XLA writes it for a dense array (layout + tail padding 1)."""
    s = xla_data_pb2.ShapeProto(element_type=int(element_type))
    s.dimensions.extend(int(d) for d in dims)
    s.is_dynamic_dimension.extend([False] * len(dims))
    if minor_to_major is None:
        minor_to_major = range(len(dims) - 1, -1, -1)
    s.layout.minor_to_major.extend(minor_to_major)
    s.layout.tail_padding_alignment_in_elements = 1
    return s


def numpy_to_literal(value: Any, shape: Any = None,
                     element_type: PrimitiveType | int | None = None) -> xla_data_pb2.LiteralProto:
    """LiteralProto for an array (or a tuple/list of arrays -> tuple literal).

    ``shape`` may be a ShapeProto or an IR Shape (its layout is honoured); otherwise the
    element type comes from ``element_type`` or the array's dtype, with default layout.
    """
    from hlo_spmd.ir.primitive_types import from_numpy_dtype

    lit = xla_data_pb2.LiteralProto()
    if shape is not None and not isinstance(shape, xla_data_pb2.ShapeProto):
        from hlo_spmd.ir.proto_io import shape_to_proto

        shape = shape_to_proto(shape)
    if isinstance(value, (tuple, list)) and (
            (shape is not None and shape.element_type == P.TUPLE) or
            (shape is None and value and not np.isscalar(value[0]) and
             isinstance(value[0], (np.ndarray, tuple, list)) and element_type is None)):
        subshapes = list(shape.tuple_shapes) if shape is not None else [None] * len(value)
        tshape = lit.shape
        tshape.element_type = P.TUPLE
        for v, s in zip(value, subshapes):
            child = numpy_to_literal(v, s)
            lit.tuple_literals.add().CopyFrom(child)
            tshape.tuple_shapes.add().CopyFrom(child.shape)
        if shape is not None:
            lit.shape.CopyFrom(shape)
        return lit
    if shape is not None:
        et = PrimitiveType(shape.element_type)
        arr = np.asarray(value, dtype=numpy_dtype(et))
        dims = tuple(int(d) for d in shape.dimensions)
        if arr.shape != dims:
            arr = np.broadcast_to(arr, dims) if arr.size == 1 else arr.reshape(dims)
        lit.shape.CopyFrom(shape)
    else:
        if element_type is not None:
            et = PrimitiveType(element_type)
            arr = np.asarray(value, dtype=numpy_dtype(et))
        else:
            arr = np.asarray(value)
            et = from_numpy_dtype(arr.dtype)
        lit.shape.CopyFrom(literal_shape_proto(et, arr.shape))
    _fill_payload(lit, et, arr)
    return lit


def _fill_payload(lit: xla_data_pb2.LiteralProto, et: PrimitiveType, arr: np.ndarray) -> None:
    m2m = _major_to_minor(lit.shape)
    flat = (arr.transpose(m2m) if m2m is not None else arr).reshape(-1)
    field = LITERAL_FIELDS.get(et)
    if field is None:
        raise ValueError(f"literal element type {text_name(et)} is not supported")
    if et in _FLOAT_FIELDS:
        number, wire = _FLOAT_FIELDS[et]
        data = np.ascontiguousarray(flat).view(_REPEATED[et]).astype(wire).tobytes()
        if data:
            # Packed field written as raw bytes so NaN payloads keep their exact bits.
            lit.ClearField(field)
            lit.MergeFromString(_varint((number << 3) | 2) + _varint(len(data)) + data)
        return
    if et in _REPEATED:
        getattr(lit, field).extend(flat.tolist())
        return
    if et in _SUB_BYTE_BITS:
        bits = _SUB_BYTE_BITS[et]
        u = np.ascontiguousarray(flat).view(np.uint8) & ((1 << bits) - 1)
        setattr(lit, field, u.tobytes())
    elif et in _BYTES_WIRE:
        wire = flat.view(np.uint16) if et == P.BF16 else flat
        setattr(lit, field, np.ascontiguousarray(wire).astype(_BYTES_WIRE[et]).tobytes())
    else:
        setattr(lit, field, np.ascontiguousarray(flat).view(np.uint8).tobytes())


# -- element text ----------------------------------------------------------------------
def _nan_text(t: PrimitiveType, raw_bits: int, negative: bool) -> str:
    text = "-nan" if negative else "nan"
    info = _NAN_PAYLOAD.get(t)
    if info is not None:
        _, mask, quiet = info
        payload = raw_bits & mask
        if payload != quiet:
            text += "(0x%x)" % payload
    return text


def _float_formatter(t: PrimitiveType):
    if t == P.F32:
        f32 = np.float32

        def fmt(v: float) -> str:
            s = "%.6g" % v
            if f32(float(s)) != f32(v):
                s = "%.9g" % v
            return s
        return fmt
    if t == P.F64:
        def fmt64(v: float) -> str:
            s = "%.15g" % v
            if float(s) != v:
                s = "%.17g" % v
            return s
        return fmt64
    digits = _MAX_DIGITS10[t]
    pattern = "%%.%dg" % digits
    return lambda v: pattern % v


def _format_floats(t: PrimitiveType, flat: np.ndarray) -> list[str]:
    fmt = _float_formatter(t)
    with np.errstate(invalid="ignore"):
        values = flat.astype(np.float64).tolist()
    out = [fmt(v) if v == v and v not in (math.inf, -math.inf) else None for v in values]
    if None in out:
        width = np.dtype(flat.dtype).itemsize * 8
        bits = flat.view({8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}[width]) \
            if np.dtype(flat.dtype).itemsize in (1, 2, 4, 8) else None
        for i, v in enumerate(values):
            if out[i] is None:
                if v == math.inf:
                    out[i] = "inf"
                elif v == -math.inf:
                    out[i] = "-inf"
                else:
                    raw = int(bits[i]) if bits is not None else 0
                    negative = bool(np.signbit(flat[i])) if t != P.F8E8M0FNU else False
                    out[i] = _nan_text(t, raw, negative)
    return out


def _format_flat(t: PrimitiveType, flat: np.ndarray, rank: int) -> list[str]:
    if t == P.PRED:
        if rank == 0:
            return ["true" if bool(v) else "false" for v in flat.tolist()]
        return ["1" if v else "0" for v in flat.tolist()]
    if t in _COMPLEX:
        comp = P.F32 if t == P.C64 else P.F64
        re_s = _format_floats(comp, np.ascontiguousarray(flat.real))
        im_s = _format_floats(comp, np.ascontiguousarray(flat.imag))
        return [f"({a}, {b})" for a, b in zip(re_s, im_s)]
    if t in _SIGNED or t in _UNSIGNED:
        return [str(v) for v in flat.astype(np.uint64 if t == P.U64 else np.int64).tolist()]
    return _format_floats(t, flat)


def format_element(value: Any, element_type: PrimitiveType | int, scalar: bool = True) -> str:
    """Text of one element as XLA prints it (``scalar`` picks true/false for PRED)."""
    t = PrimitiveType(element_type)
    arr = np.asarray([value], dtype=numpy_dtype(t))
    return _format_flat(t, arr, 0 if scalar else 1)[0]


def _nest(items: list[str], dims: tuple[int, ...]) -> str:
    """XLA's oneline DenseArrayPrintHelper bracketing over row-major ``items``."""
    rank = len(dims)
    if rank == 0:
        return items[0]
    if rank == 1:
        return "{" + ", ".join(items) + "}"
    out: list[str] = []
    append = out.append
    pos = [0]

    def rec(level: int, accum: list[int]) -> None:
        d = dims[level]
        remaining = rank - level
        if remaining == 1:
            append("{" if d <= 1 else "{ ")
            start = pos[0]
            append(", ".join(items[start:start + d]))
            pos[0] = start + d
            append("}" if d <= 1 else " }")
            return
        if rank > 3 and accum and len(accum) < rank:
            append("{ /*i%d=%d*/%s" % (len(accum) - 1, accum[-1], " " if d > 0 else ""))
        else:
            append("{ ")
        for i in range(d):
            accum.append(i)
            rec(level + 1, accum)
            accum.pop()
            if i < d - 1:
                append(", ")
        append(" }")

    rec(0, [])
    return "".join(out)


def format_literal(lit: xla_data_pb2.LiteralProto) -> str:
    """XLA's PrintWithoutShapeOneline: ``0``, ``{1, 2}``, ``{ { 1, 2 }, { 3, 4 } }``, tuples."""
    et = lit.shape.element_type
    if et == P.TUPLE:
        return "( " + ", ".join(format_literal(c) for c in lit.tuple_literals) + " )"
    if et == P.TOKEN:
        return "token"
    t = PrimitiveType(et)
    arr = literal_to_numpy(lit)
    flat = arr.reshape(-1)
    return _nest(_format_flat(t, flat, arr.ndim), arr.shape)


def format_literal_with_shape(lit: xla_data_pb2.LiteralProto, shape_text) -> str:
    """XLA's PrintWithLayoutOneline (shape with layout, a space, the values).

    ``shape_text(shape_proto)`` formats a ShapeProto with its layout.
    """
    et = lit.shape.element_type
    if et == P.TUPLE:
        return "( " + ", ".join(format_literal_with_shape(c, shape_text)
                                for c in lit.tuple_literals) + " )"
    if et == P.TOKEN:
        return "token"
    return shape_text(lit.shape) + " " + format_literal(lit)


# -- parsing ------------------------------------------------------------------------------
_LIT_TOKEN = re.compile(
    r"(?:[ \t\n\r]+|//[^\n\r]*|/\*.*?\*/)*(?:(\{)|(\})|(,)|(\()|(\.\.\.)|"
    r"(-?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][+-]?[0-9]+|[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)"
    r"|-?inf\b|-?nan(?:\(0x[0-9a-fA-F]+\))?|true\b|false\b))", re.S)


def _parse_scalar_token(cursor, tok: str, pos: int, t: PrimitiveType) -> Any:
    """Python value of one element token for element type ``t``."""
    if tok == "true" or tok == "false":
        if t != P.PRED:
            raise cursor.error(f"expects a number for element type {text_name(t)} but sees {tok}", pos)
        return tok == "true"
    is_int_token = re.fullmatch(r"-?[0-9]+", tok) is not None
    if t == P.PRED or t in _SIGNED or t in _UNSIGNED:
        if not is_int_token:
            raise cursor.error(f"expects integer for primitive type {text_name(t)} but sees {tok}", pos)
        v = int(tok)
        if t == P.PRED:
            return v != 0
        lo, hi = _int_range(t)
        if v < lo or v > hi:
            raise cursor.error(f"value {v} is out of range for literal's primitive type "
                               f"{text_name(t)} namely [{lo}, {hi}]", pos)
        return v
    return _parse_float_token(cursor, tok, pos)


_NAN_PAYLOAD_RE = re.compile(r"(-?)nan(?:\(0x([0-9a-fA-F]+)\))?")


def _parse_float_token(cursor, tok: str, pos: int) -> Any:
    m = _NAN_PAYLOAD_RE.fullmatch(tok)
    if m:
        return ("nan", m.group(1) == "-", int(m.group(2), 16) if m.group(2) else None)
    v = float(tok)
    if math.isinf(v) and "inf" not in tok:
        raise cursor.error("constant is out of range for double and so is unparsable", pos)
    return v


def _make_nan(t: PrimitiveType, negative: bool, payload: int | None, cursor, pos: int) -> Any:
    info = _NAN_PAYLOAD.get(t)
    dtype = numpy_dtype(t)
    if info is None:
        if payload is not None:
            raise cursor.error(f"tries to set a NaN payload on {text_name(t)}, which does not "
                               "support payloads", pos)
        v = np.array([np.nan], dtype=np.float64).astype(dtype)
        if negative:
            v = -v
        return v[0]
    width, mask, quiet = info
    if payload is None:
        payload = quiet
    if payload > mask or payload == 0:
        raise cursor.error(f"NaN payload 0x{payload:x} is out of range for {text_name(t)}", pos)
    if width == 32:
        bits = (0xFF << 23) | payload | ((1 << 31) if negative else 0)
        return np.array([bits], dtype=np.uint32).view(np.float32)[0]
    if width == 64:
        bits = (0x7FF << 52) | payload | ((1 << 63) if negative else 0)
        return np.array([bits], dtype=np.uint64).view(np.float64)[0]
    # Narrow types: exponent all ones.
    proto = np.array([np.nan], dtype=np.float64).astype(dtype)
    raw = int(np.ascontiguousarray(proto).view(np.uint16 if width == 16 else np.uint8)[0])
    raw = (raw & ~mask) | payload
    sign_bit = 1 << (width - 1)
    raw = (raw | sign_bit) if negative else (raw & ~sign_bit)
    u = np.array([raw], dtype=np.uint16 if width == 16 else np.uint8)
    return u.view(dtype)[0]


def _to_array(values: list, t: PrimitiveType, cursor, positions: list[int] | None = None) -> np.ndarray:
    dtype = numpy_dtype(t)
    if t in _COMPLEX:
        comp_t = P.F32 if t == P.C64 else P.F64
        re_v = _finish_floats([v[0] for v in values], comp_t, cursor, positions)
        im_v = _finish_floats([v[1] for v in values], comp_t, cursor, positions)
        return _combine_complex(re_v, im_v, dtype)
    if t == P.PRED:
        return np.array(values, dtype=np.bool_)
    if t in _SIGNED or t in _UNSIGNED:
        if t in _SUB_BYTE_BITS:
            return np.array(values, dtype=np.int8 if t in _SIGNED else np.uint8).astype(dtype)
        return np.array(values, dtype=dtype)
    return _finish_floats(values, t, cursor, positions)


def _combine_complex(re_v: np.ndarray, im_v: np.ndarray, dtype) -> np.ndarray:
    out = np.empty(re_v.shape, dtype=dtype)
    out.real = re_v
    out.imag = im_v
    return out


def _finish_floats(values: list, t: PrimitiveType, cursor, positions) -> np.ndarray:
    dtype = numpy_dtype(t)
    if not any(isinstance(v, tuple) for v in values):
        with np.errstate(over="ignore", invalid="ignore"):
            arr = np.array(values, dtype=np.float64).astype(dtype)
        _check_float_range(values, arr, t, cursor, positions)
        return arr
    out = np.empty(len(values), dtype=dtype)
    for i, v in enumerate(values):
        if isinstance(v, tuple):
            pos = positions[i] if positions else None
            out[i] = _make_nan(t, v[1], v[2], cursor, pos)
        else:
            with np.errstate(over="ignore", invalid="ignore"):
                out[i] = np.array([v], dtype=np.float64).astype(dtype)[0]
    _check_float_range([v for v in values if not isinstance(v, tuple)],
                       np.array([o for o, v in zip(out, values) if not isinstance(v, tuple)],
                                dtype=dtype), t, cursor, None)
    return out


def _check_float_range(values: list, arr: np.ndarray, t: PrimitiveType, cursor, positions) -> None:
    if not values:
        return
    src = np.array(values, dtype=np.float64)
    conv = arr.astype(np.float64)
    bad = np.isfinite(src) & ~np.isfinite(conv)
    if bad.any():
        i = int(np.argmax(bad))
        pos = positions[i] if positions else None
        raise cursor.error(f"value {values[i]} is out of range for literal's primitive type "
                           f"{text_name(t)}", pos)


def parse_literal(cursor, shape: Any) -> xla_data_pb2.LiteralProto:
    """Parse a literal of ``shape`` (IR Shape or ShapeProto) at the cursor.

    Tuples: ``( lit, lit )``; arrays: nested braces ``{ {1, 2}, {3, 4} }`` (scalars bare),
    complex elements ``(re, im)``, ``{...}`` for "unknown values" (filled with zeros).
    """
    if not isinstance(shape, xla_data_pb2.ShapeProto):
        from hlo_spmd.ir.proto_io import shape_to_proto

        shape = shape_to_proto(shape)
    if shape.element_type == P.TUPLE:
        lit = xla_data_pb2.LiteralProto()
        lit.shape.CopyFrom(shape)
        cursor.expect("(", "expected '(' to start a tuple literal")
        n = len(shape.tuple_shapes)
        for i, sub in enumerate(shape.tuple_shapes):
            if i > 0:
                cursor.expect(",", "expected ',' between tuple literal elements")
            lit.tuple_literals.add().CopyFrom(parse_literal(cursor, sub))
        cursor.expect(")", f"expected ')' to close a tuple literal of {n} elements")
        return lit
    if shape.element_type == P.TOKEN:
        if not cursor.keyword("token"):
            raise cursor.error("expected 'token'")
        lit = xla_data_pb2.LiteralProto()
        lit.shape.CopyFrom(shape)
        return lit
    return _parse_dense(cursor, shape)


def _parse_dense(cursor, shape: xla_data_pb2.ShapeProto) -> xla_data_pb2.LiteralProto:
    t = PrimitiveType(shape.element_type)
    dims = tuple(int(d) for d in shape.dimensions)
    rank = len(dims)
    text = cursor.text
    pos = cursor.skip_ws()
    values: list = []
    positions: list[int] = []
    complex_type = t in _COMPLEX
    elems_seen = [0] * rank
    nest = 0
    dots = False
    tok_re = _LIT_TOKEN
    first = True
    while first or nest > 0:
        first = False
        m = tok_re.match(text, pos)
        if m is None:
            raise cursor.error(f"unexpected token in a literal: {cursor.describe(_skip(text, pos))}",
                               _skip(text, pos))
        tpos = m.start(m.lastindex)
        kind = m.lastindex
        pos = m.end()
        if kind == 1:  # {
            nest += 1
            if nest > rank:
                raise cursor.error(f"expects nested array in rank {rank}, but sees larger", tpos)
            if nest > 1:
                elems_seen[nest - 2] += 1
                if elems_seen[nest - 2] > dims[nest - 2]:
                    raise cursor.error(f"expects {dims[nest - 2]} elements in dimension "
                                       f"{nest - 2}, but sees more", tpos)
        elif kind == 2:  # }
            if nest == 0:
                raise cursor.error("unexpected '}' token", tpos)
            nest -= 1
            if elems_seen[nest] != dims[nest]:
                raise cursor.error(f"expects {dims[nest]} elements in dimension {nest}, but sees "
                                   f"{elems_seen[nest]}", tpos)
            elems_seen[nest] = 0
        elif kind == 3:  # ,
            if nest == 0:
                raise cursor.error("unexpected ',' in a literal", tpos)
        elif kind == 5:  # ...
            if nest != 1:
                raise cursor.error(f"expects `...` at nest level 1, but sees it at nest level {nest}",
                                   tpos)
            elems_seen[0] = dims[0]
            dots = True
        else:
            if rank > 0:
                if nest != rank:
                    raise cursor.error(f"expects nested array in rank {rank}, but sees {nest}", tpos)
                elems_seen[rank - 1] += 1
                if elems_seen[rank - 1] > dims[rank - 1]:
                    raise cursor.error(f"expects {dims[rank - 1]} elements on the minor-most "
                                       "dimension, but sees more", tpos)
            if kind == 4:  # ( complex
                if not complex_type:
                    raise cursor.error("unexpected '(' in literal; parens are only valid for "
                                       "complex literals", tpos)
                cursor.pos = pos
                re_pos = cursor.skip_ws()
                re_tok = cursor.number_token()
                if re_tok is None:
                    raise cursor.error("expect floating-point value for real part of complex "
                                       "number", re_pos)
                cursor.expect(",", "expect comma after real part of complex literal")
                im_pos = cursor.skip_ws()
                im_tok = cursor.number_token()
                if im_tok is None:
                    raise cursor.error("expect floating-point value for imaginary part of complex "
                                       "number", im_pos)
                cursor.expect(")", "expect ')' after complex number")
                pos = cursor.pos
                values.append((_parse_float_token(cursor, re_tok, re_pos),
                               _parse_float_token(cursor, im_tok, im_pos)))
            else:
                tok = m.group(6)
                if complex_type:
                    v = _parse_float_token(cursor, tok, tpos)
                    values.append((v, 0.0))
                else:
                    values.append(_parse_scalar_token(cursor, tok, tpos, t))
            positions.append(tpos)
        if nest == 0 and rank == 0 and kind not in (1, 2, 3, 5):
            break
    cursor.pos = pos
    count = math.prod(dims)
    lit = xla_data_pb2.LiteralProto()
    lit.shape.CopyFrom(shape)
    if dots and not values:
        arr = np.zeros(dims, dtype=numpy_dtype(t))
    else:
        if len(values) != count:
            raise cursor.error(f"literal has {len(values)} elements but its shape needs {count}",
                               positions[-1] if positions else pos)
        arr = _to_array(values, t, cursor, positions).reshape(dims)
    _fill_payload(lit, t, arr)
    return lit


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos
