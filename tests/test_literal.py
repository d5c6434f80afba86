"""Literals: LiteralProto <-> numpy for every array type, XLA's literal text (checked
element by element against jaxlib's printer), and parsing that text back."""
from __future__ import annotations

import math

import numpy as np
import pytest

from hlo_spmd.errors import ParseError
from hlo_spmd.ir import literal as L
from hlo_spmd.ir.primitive_types import PrimitiveType as P
from hlo_spmd.ir.text_lexer import Cursor
from hlo_spmd.proto import hlo_pb2

ml_dtypes = pytest.importorskip("ml_dtypes")

FLOAT_TYPES = [P.F16, P.BF16, P.F32, P.F64, P.F8E5M2, P.F8E4M3FN, P.F8E4M3B11FNUZ,
               P.F8E5M2FNUZ, P.F8E4M3FNUZ, P.F8E4M3, P.F8E3M4, P.F8E8M0FNU, P.F4E2M1FN]
INT_TYPES = [P.S1, P.S2, P.S4, P.S8, P.S16, P.S32, P.S64,
             P.U1, P.U2, P.U4, P.U8, P.U16, P.U32, P.U64]
# Element types jaxlib can build literals of (it has no S1/U1 arrays).
JAX_INT_TYPES = [t for t in INT_TYPES if t not in (P.S1, P.U1)]


def _bits_dtype(itemsize: int):
    return {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[itemsize]


def _all_patterns(t: P, rng: np.random.Generator) -> np.ndarray:
    """Every bit pattern of an 8/4-bit type, a sample plus special values of wider ones."""
    dt = L.numpy_dtype(t)
    if t == P.F4E2M1FN:
        return np.arange(16, dtype=np.uint8).view(dt)
    size = dt.itemsize
    if size == 1:
        return np.arange(256, dtype=np.uint8).view(dt)
    bdt = _bits_dtype(size)
    width = size * 8
    sample = rng.integers(0, 2 ** min(width, 63), 2000, dtype=np.uint64)
    if width == 64:
        sample = sample * 2 + rng.integers(0, 2, 2000, dtype=np.uint64)
    specials = {16: [0x7C01, 0xFC01, 0x7E00, 0xFE00, 0x7FC0, 0xFFC1, 0x7F81, 0x8000, 0x0001],
                32: [0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FC00001, 0x80000000, 1, 0x3DCCCCCD,
                     0x7F800000, 0xFF800000],
                64: [0x7FF8000000000000, 0xFFF8000000000001, 0x8000000000000000,
                     0x3FB999999999999A, 1, 0x7FF0000000000000]}[width]
    raw = np.concatenate([sample.astype(bdt), np.array(specials, dtype=np.uint64).astype(bdt)])
    return raw.view(dt)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return a.tobytes() == b.tobytes()


# -- proto <-> numpy ------------------------------------------------------------------------------
@pytest.mark.parametrize("t", FLOAT_TYPES, ids=lambda t: t.name)
def test_float_round_trip_every_bit_pattern(t: P) -> None:
    arr = _all_patterns(t, np.random.default_rng(0))
    lit = L.numpy_to_literal(arr, element_type=t)
    back = L.literal_to_numpy(lit)
    assert _same_bits(back, arr)


@pytest.mark.parametrize("t", INT_TYPES, ids=lambda t: t.name)
def test_int_round_trip_full_range(t: P) -> None:
    lo, hi = L._int_range(t)
    if hi - lo < 1024:
        vals = np.arange(lo, hi + 1)
    else:
        vals = np.array([lo, lo + 1, -1 if lo < 0 else 2, 0, 1, hi - 1, hi], dtype=object)
    arr = np.array(vals.tolist(), dtype=np.uint64 if t == P.U64 else np.int64).astype(
        L.numpy_dtype(t))
    lit = L.numpy_to_literal(arr, element_type=t)
    back = L.literal_to_numpy(lit)
    assert back.dtype == arr.dtype and back.tolist() == arr.tolist()


def test_sub_byte_payloads_are_one_element_per_byte() -> None:
    lit = L.numpy_to_literal(np.array([1, -2, 7, -8], dtype=ml_dtypes.int4))
    assert lit.s4s == bytes([0x01, 0x0E, 0x07, 0x08])
    lit = L.numpy_to_literal(np.array([1, 2, 15], dtype=ml_dtypes.uint4))
    assert lit.u4s == bytes([1, 2, 15])


def test_pred_complex_and_16_bit_wire_formats() -> None:
    lit = L.numpy_to_literal(np.array([True, False]))
    assert list(lit.preds) == [True, False]
    lit = L.numpy_to_literal(np.array([1 + 2j, -3.5j], np.complex64))
    assert list(lit.c64s) == [1.0, 2.0, -0.0, -3.5]
    lit = L.numpy_to_literal(np.array([65535], np.uint16))
    assert lit.u16s == b"\xff\xff"
    lit = L.numpy_to_literal(np.array([1.0, 2.0], dtype=ml_dtypes.bfloat16))
    assert lit.bf16s == bytes.fromhex("803f0040")


def test_layout_is_physical_order() -> None:
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    shape = L.literal_shape_proto(P.F32, (2, 3), minor_to_major=(0, 1))
    lit = L.numpy_to_literal(arr, shape=shape)
    assert list(lit.f32s) == [0, 3, 1, 4, 2, 5]
    assert np.array_equal(L.literal_to_numpy(lit), arr)
    arr3 = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    shape3 = L.literal_shape_proto(P.S32, (2, 3, 4), minor_to_major=(1, 0, 2))
    back = L.literal_to_numpy(L.numpy_to_literal(arr3, shape=shape3))
    assert np.array_equal(back, arr3)


def test_tuple_literals() -> None:
    value = (np.arange(3, dtype=np.float32), (np.array(True), np.array([7], np.int8)))
    lit = L.numpy_to_literal(value)
    assert lit.shape.element_type == P.TUPLE and len(lit.tuple_literals) == 2
    back = L.literal_to_numpy(lit)
    assert np.array_equal(back[0], value[0])
    assert bool(back[1][0]) is True and back[1][1].tolist() == [7]
    assert L.format_literal(lit) == "( {0, 1, 2}, ( true, {7} ) )"


def test_wrong_element_count_is_an_error() -> None:
    lit = L.numpy_to_literal(np.arange(4, dtype=np.float32))
    del lit.f32s[-1]
    with pytest.raises(ValueError, match="3 elements"):
        L.literal_to_numpy(lit)


# -- text --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, t, text", [
    (0.0, P.F32, "0"), (1.5, P.F32, "1.5"), (-math.inf, P.F32, "-inf"), (math.nan, P.F32, "nan"),
    (1e-5, P.F32, "1e-05"), (3e10, P.F32, "3e+10"), (0.1, P.F32, "0.1"), (1 / 3, P.F32, "0.333333343"),
    (1 / 3, P.F64, "0.33333333333333331"), (0.1, P.F64, "0.1"), (57344.0, P.F8E5M2, "5.7e+04"),
    (448.0, P.F8E4M3FN, "448"), (True, P.PRED, "true"), (False, P.PRED, "false"),
    (-128, P.S8, "-128"), (2 ** 64 - 1, P.U64, "18446744073709551615"), (-0.0, P.F32, "-0"),
    (1 + 2j, P.C64, "(1, 2)"), (complex(-0.0, -3.5), P.C64, "(-0, -3.5)"),
])
def test_element_text(value, t, text) -> None:
    assert L.format_element(value, t) == text


@pytest.mark.parametrize("arr, text", [
    (np.array([1, 2, 3], np.int32), "{1, 2, 3}"),
    (np.array([[1, 2], [3, 4]], np.int32), "{ { 1, 2 }, { 3, 4 } }"),
    (np.array([[1], [2]], np.int32), "{ {1}, {2} }"),
    (np.zeros((0,), np.int32), "{}"),
    (np.zeros((0, 3), np.int32), "{  }"),
    (np.array([True, False]), "{1, 0}"),
    (np.array(5, np.int32), "5"),
    (np.arange(8, dtype=np.int32).reshape(2, 1, 2, 2),
     "{ { /*i0=0*/ { /*i1=0*/ { 0, 1 }, { 2, 3 } } }, "
     "{ /*i0=1*/ { /*i1=0*/ { 4, 5 }, { 6, 7 } } } }"),
])
def test_nesting_text(arr, text) -> None:
    lit = L.numpy_to_literal(arr)
    assert L.format_literal(lit) == text
    c = Cursor(text)
    back = L.parse_literal(c, lit.shape)
    assert c.at_end()
    assert back.SerializeToString(deterministic=True) == lit.SerializeToString(deterministic=True)


@pytest.mark.parametrize("t", FLOAT_TYPES, ids=lambda t: t.name)
def test_float_text_round_trips_bits(t: P) -> None:
    """format -> parse gives the same bits (NaN payloads and -0 included)."""
    arr = _all_patterns(t, np.random.default_rng(1))
    lit = L.numpy_to_literal(arr, element_type=t)
    text = L.format_literal(lit)
    back = L.parse_literal(Cursor(text), lit.shape)
    got = L.literal_to_numpy(back)
    if t == P.F8E8M0FNU:
        # 2^-127 prints as 5.9e-39, which XLA's parser (like ml_dtypes) rounds to 2^-126.
        keep = arr.view(np.uint8) != 0
        arr, got = arr[keep], got[keep]
    if t in (P.F8E4M3FN, P.F8E4M3B11FNUZ, P.F8E5M2FNUZ, P.F8E4M3FNUZ, P.F8E8M0FNU):
        # Types with a single NaN encoding (or sign-less NaN): compare values.
        with np.errstate(invalid="ignore"):
            a = arr.astype(np.float64)
            b = got.astype(np.float64)
        assert np.array_equal(np.isnan(a), np.isnan(b))
        assert np.array_equal(a[~np.isnan(a)], b[~np.isnan(b)])
    else:
        assert _same_bits(got, arr), t


def test_parse_errors_have_locations() -> None:
    shape = L.literal_shape_proto(P.S8, (2,))
    with pytest.raises(ParseError, match="out of range") as e:
        L.parse_literal(Cursor("{1, 300}", "lit"), shape)
    assert (e.value.line, e.value.column) == (1, 5)
    with pytest.raises(ParseError, match="expects 2 elements"):
        L.parse_literal(Cursor("{1, 2, 3}"), shape)
    with pytest.raises(ParseError, match="integer"):
        L.parse_literal(Cursor("{1.5, 2}"), shape)
    with pytest.raises(ParseError, match="nested array in rank 1"):
        L.parse_literal(Cursor("{{1}, {2}}"), shape)


def test_elided_values_parse_as_zeros() -> None:
    shape = L.literal_shape_proto(P.F32, (3, 4))
    lit = L.parse_literal(Cursor("{...}"), shape)
    assert np.array_equal(L.literal_to_numpy(lit), np.zeros((3, 4), np.float32))


# -- against jaxlib's printer -------------------------------------------------------------------------
def _jax_literal_texts(lits: list) -> list[str]:
    """Print constants with jaxlib; returns the text inside ``constant(...)``."""
    from test_text_cases import jax_print_proto

    m = hlo_pb2.HloModuleProto(name="m", entry_computation_name="e", entry_computation_id=1, id=1)
    comp = m.computations.add(name="e", id=1)
    tup = hlo_pb2.HloInstructionProto(name="t", opcode="tuple", id=(1 << 32) | (len(lits) + 1))
    tup.shape.element_type = P.TUPLE
    for k, lit in enumerate(lits):
        inst = comp.instructions.add(name=f"c{k}", opcode="constant", id=(1 << 32) | (k + 1))
        inst.shape.CopyFrom(lit.shape)
        inst.literal.CopyFrom(lit)
        tup.operand_ids.append(inst.id)
        tup.shape.tuple_shapes.add().CopyFrom(lit.shape)
    comp.instructions.add().CopyFrom(tup)
    comp.root_id = tup.id
    comp.program_shape.result.CopyFrom(tup.shape)
    m.host_program_shape.result.CopyFrom(tup.shape)
    text = jax_print_proto(m.SerializeToString())
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("%c") and " constant(" in line:
            out[int(line.split()[0][2:])] = line[line.index("constant(") + 9:line.rindex(")")]
    return [out[k] for k in range(len(lits))]


@pytest.mark.parametrize("t", FLOAT_TYPES, ids=lambda t: t.name)
def test_float_text_matches_jaxlib(t: P) -> None:
    pytest.importorskip("jaxlib._hlo")
    arr = _all_patterns(t, np.random.default_rng(2))
    lit = L.numpy_to_literal(arr, element_type=t)
    ours = L.format_literal(lit)
    (theirs,) = _jax_literal_texts([lit])
    if ours != theirs:
        a, b = ours.strip("{}").split(", "), theirs.strip("{}").split(", ")
        bad = [(i, a[i], b[i]) for i in range(len(a)) if a[i] != b[i]]
        pytest.fail(f"{len(bad)} elements differ, e.g. {bad[:5]}")


def test_int_pred_complex_and_nesting_text_match_jaxlib() -> None:
    pytest.importorskip("jaxlib._hlo")
    rng = np.random.default_rng(3)
    lits = []
    for t in JAX_INT_TYPES:
        lo, hi = L._int_range(t)
        vals = [lo, hi, 0, 1, lo + 1] if hi > 1 else [lo, hi]
        lits.append(L.numpy_to_literal(np.array(vals, dtype=np.uint64 if t == P.U64 else np.int64)
                                       .astype(L.numpy_dtype(t)), element_type=t))
    lits.append(L.numpy_to_literal(np.array([True, False])))
    lits.append(L.numpy_to_literal(np.array(True)))
    lits.append(L.numpy_to_literal(np.array([[False], [True]])))
    lits.append(L.numpy_to_literal(np.array([1 + 2j, complex(-0.0, -3.5),
                                             complex(np.nan, np.inf)], np.complex64)))
    lits.append(L.numpy_to_literal(np.array([1 / 3 + 1e300j], np.complex128)))
    for dims in [(2, 3), (1, 1), (2, 1), (1, 3), (0,), (0, 3), (3, 0), (2, 2, 2), (2, 1, 2, 2),
                 (2, 2, 1, 3, 1), (1, 2, 3, 4, 2), ()]:
        lits.append(L.numpy_to_literal(rng.integers(-5, 5, dims).astype(np.int32)))
    lits.append(L.numpy_to_literal(np.arange(6, dtype=np.float32).reshape(2, 3),
                                   shape=L.literal_shape_proto(P.F32, (2, 3), (0, 1))))
    lits.append(L.numpy_to_literal(np.arange(12, dtype=np.float32).reshape(2, 3, 2),
                                   shape=L.literal_shape_proto(P.F32, (2, 3, 2), (1, 0, 2))))
    theirs = _jax_literal_texts(lits)
    for lit, text in zip(lits, theirs):
        assert L.format_literal(lit) == text
        c = Cursor(text)
        back = L.parse_literal(c, lit.shape)
        assert c.at_end()
        assert back.SerializeToString(deterministic=True) == lit.SerializeToString(
            deterministic=True), text
