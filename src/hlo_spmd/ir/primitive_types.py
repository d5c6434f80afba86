"""XLA element types: enum values (xla_data.proto), text names, bit widths, numpy dtypes."""
from __future__ import annotations

import enum

import numpy as np


class PrimitiveType(enum.IntEnum):
    PRIMITIVE_TYPE_INVALID = 0
    PRED = 1
    S8 = 2
    S16 = 3
    S32 = 4
    S64 = 5
    U8 = 6
    U16 = 7
    U32 = 8
    U64 = 9
    F16 = 10
    F32 = 11
    F64 = 12
    TUPLE = 13
    OPAQUE_TYPE = 14
    C64 = 15
    BF16 = 16
    TOKEN = 17
    C128 = 18
    F8E5M2 = 19
    F8E4M3FN = 20
    S4 = 21
    U4 = 22
    F8E4M3B11FNUZ = 23
    F8E5M2FNUZ = 24
    F8E4M3FNUZ = 25
    S2 = 26
    U2 = 27
    F8E4M3 = 28
    F8E3M4 = 29
    S1 = 30
    U1 = 31
    F4E2M1FN = 32
    F8E8M0FNU = 33
    BUFFER = 34


# Text names as XLA prints them (primitive_util::LowercasePrimitiveTypeName).
_TEXT_NAMES: dict[PrimitiveType, str] = {
    PrimitiveType.PRIMITIVE_TYPE_INVALID: "invalid",
    PrimitiveType.TUPLE: "tuple",
    PrimitiveType.OPAQUE_TYPE: "opaque",
    PrimitiveType.TOKEN: "token",
    PrimitiveType.BUFFER: "buffer",
}
for _t in PrimitiveType:
    _TEXT_NAMES.setdefault(_t, _t.name.lower())

_BY_TEXT: dict[str, PrimitiveType] = {name: t for t, name in _TEXT_NAMES.items()}

_BIT_WIDTH: dict[PrimitiveType, int] = {
    PrimitiveType.PRED: 8,
    PrimitiveType.S1: 1, PrimitiveType.U1: 1,
    PrimitiveType.S2: 2, PrimitiveType.U2: 2,
    PrimitiveType.S4: 4, PrimitiveType.U4: 4, PrimitiveType.F4E2M1FN: 4,
    PrimitiveType.S8: 8, PrimitiveType.U8: 8,
    PrimitiveType.F8E5M2: 8, PrimitiveType.F8E4M3FN: 8, PrimitiveType.F8E4M3B11FNUZ: 8,
    PrimitiveType.F8E5M2FNUZ: 8, PrimitiveType.F8E4M3FNUZ: 8, PrimitiveType.F8E4M3: 8,
    PrimitiveType.F8E3M4: 8, PrimitiveType.F8E8M0FNU: 8,
    PrimitiveType.S16: 16, PrimitiveType.U16: 16, PrimitiveType.F16: 16, PrimitiveType.BF16: 16,
    PrimitiveType.S32: 32, PrimitiveType.U32: 32, PrimitiveType.F32: 32,
    PrimitiveType.S64: 64, PrimitiveType.U64: 64, PrimitiveType.F64: 64, PrimitiveType.C64: 64,
    PrimitiveType.C128: 128,
}

# ml_dtypes names for the types numpy lacks; resolved lazily so numpy-only installs work.
_NUMPY_NAMES: dict[PrimitiveType, str] = {
    PrimitiveType.PRED: "bool",
    PrimitiveType.S8: "int8", PrimitiveType.S16: "int16", PrimitiveType.S32: "int32",
    PrimitiveType.S64: "int64", PrimitiveType.U8: "uint8", PrimitiveType.U16: "uint16",
    PrimitiveType.U32: "uint32", PrimitiveType.U64: "uint64", PrimitiveType.F16: "float16",
    PrimitiveType.F32: "float32", PrimitiveType.F64: "float64", PrimitiveType.C64: "complex64",
    PrimitiveType.C128: "complex128",
    PrimitiveType.BF16: "bfloat16", PrimitiveType.F8E5M2: "float8_e5m2",
    PrimitiveType.F8E4M3FN: "float8_e4m3fn", PrimitiveType.F8E4M3B11FNUZ: "float8_e4m3b11fnuz",
    PrimitiveType.F8E5M2FNUZ: "float8_e5m2fnuz", PrimitiveType.F8E4M3FNUZ: "float8_e4m3fnuz",
    PrimitiveType.F8E4M3: "float8_e4m3", PrimitiveType.F8E3M4: "float8_e3m4",
    PrimitiveType.F8E8M0FNU: "float8_e8m0fnu", PrimitiveType.F4E2M1FN: "float4_e2m1fn",
    PrimitiveType.S4: "int4", PrimitiveType.U4: "uint4", PrimitiveType.S2: "int2",
    PrimitiveType.U2: "uint2",
}

FLOATING = frozenset({
    PrimitiveType.F16, PrimitiveType.F32, PrimitiveType.F64, PrimitiveType.BF16,
    PrimitiveType.F8E5M2, PrimitiveType.F8E4M3FN, PrimitiveType.F8E4M3B11FNUZ,
    PrimitiveType.F8E5M2FNUZ, PrimitiveType.F8E4M3FNUZ, PrimitiveType.F8E4M3,
    PrimitiveType.F8E3M4, PrimitiveType.F8E8M0FNU, PrimitiveType.F4E2M1FN,
})
COMPLEX = frozenset({PrimitiveType.C64, PrimitiveType.C128})
SIGNED_INTEGRAL = frozenset({
    PrimitiveType.S1, PrimitiveType.S2, PrimitiveType.S4, PrimitiveType.S8,
    PrimitiveType.S16, PrimitiveType.S32, PrimitiveType.S64,
})
UNSIGNED_INTEGRAL = frozenset({
    PrimitiveType.U1, PrimitiveType.U2, PrimitiveType.U4, PrimitiveType.U8,
    PrimitiveType.U16, PrimitiveType.U32, PrimitiveType.U64,
})
ARRAY_TYPES = frozenset(_BIT_WIDTH)


# The readers below look a member (or an int, which an IntEnum member hashes and compares
# as) up directly and convert only on a miss: ``PrimitiveType(t)`` is a Python-level
# enum call, and shapes ask these on every instruction. A value that is no element type
# still raises ValueError from the conversion.
def text_name(t: PrimitiveType | int) -> str:
    name = _TEXT_NAMES.get(t)
    return name if name is not None else _TEXT_NAMES[PrimitiveType(t)]


def from_text(name: str) -> PrimitiveType | None:
    """The element type for an XLA text name (``f32``, ``bf16``, ...), or None."""
    return _BY_TEXT.get(name)


def bit_width(t: PrimitiveType | int) -> int:
    width = _BIT_WIDTH.get(t)
    return width if width is not None else _BIT_WIDTH[PrimitiveType(t)]


def element_bytes(t: PrimitiveType | int) -> float:
    """Bytes per element with sub-byte types packed (s4 / u4 / f4: 0.5): ShapeUtil's
    ByteSizeOfPrimitiveType on a packed layout. Every price and byte count uses this
    (``Shape.byte_size`` is the same figure summed over an array and rounded up)."""
    return bit_width(t) / 8.0


def is_array_type(t: PrimitiveType | int) -> bool:
    return t in ARRAY_TYPES or PrimitiveType(t) in ARRAY_TYPES


def is_floating(t: PrimitiveType | int) -> bool:
    return PrimitiveType(t) in FLOATING


def is_integral(t: PrimitiveType | int) -> bool:
    t = PrimitiveType(t)
    return t in SIGNED_INTEGRAL or t in UNSIGNED_INTEGRAL


def numpy_dtype(t: PrimitiveType | int) -> np.dtype:
    """numpy dtype for an element type; the narrow float / int types come from ml_dtypes."""
    name = _NUMPY_NAMES.get(PrimitiveType(t))
    if name is None:
        raise ValueError(f"element type {text_name(t)} has no numpy dtype")
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes  # ships with jax; needed only for narrow types

        return np.dtype(getattr(ml_dtypes, name))


def from_numpy_dtype(dtype: np.dtype) -> PrimitiveType:
    dtype = np.dtype(dtype)
    for t, name in _NUMPY_NAMES.items():
        if dtype.name == name:
            return t
    raise ValueError(f"numpy dtype {dtype} has no XLA element type")
